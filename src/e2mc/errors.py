"""The errors of the package and the exit codes of the ``e2mc`` command line (table: docs/cli.md):
0 done, 1 :class:`RunFailure`, 2 :class:`InputError` (also plain ``ValueError``,
``FileNotFoundError``, ``PermissionError``, ``EROFS``, unreadable files), 3
:class:`NonFiniteError`, 75 pre-empted after its checkpoint, 130 interrupted. Any other
``OSError`` is a failure while running; a message is always one line."""

from __future__ import annotations

import errno
import pickle
import zipfile

EXIT_FAILURE = 1
EXIT_INPUT = 2
EXIT_NONFINITE = 3
EXIT_INTERRUPTED = 130


class E2MCError(Exception):
    """Base class of the package's errors; ``exit_code`` is the command line's exit code."""

    exit_code = EXIT_FAILURE


class InputError(E2MCError, ValueError):
    """Bad input: a wrong path or value, or a file that is not what it should be. Exit 2."""

    exit_code = EXIT_INPUT


class CorruptFileError(InputError):
    """A truncated, empty or wrong-format file; the message names it and what to do."""


class ConfigMismatchError(InputError):
    """A run directory resumed with a configuration that differs from its own."""


class CorruptImageError(OSError):
    """An image file that cannot be decoded; the message names the file (bad input, exit 2)."""


class RunFailure(E2MCError, RuntimeError):
    """A failure while running (not the input's fault). Exit 1."""


class NonFiniteError(RunFailure):
    """Training produced a NaN / infinite loss, gradient or weight. Exit 3."""

    exit_code = EXIT_NONFINITE


#: Exceptions that mean "this file cannot be read as what it should be" (bad input).
_UNREADABLE = (EOFError, pickle.UnpicklingError, zipfile.BadZipFile, UnicodeDecodeError)


def _one_line_cause(message: str) -> str:
    """The message on one line; of a DataLoader worker's traceback message, its last line
    without the ``module.Class:`` prefix."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if "Original Traceback" in message:
        head, sep, tail = lines[-1].partition(": ")
        return tail if sep and " " not in head else lines[-1]
    return " ".join(lines)


def describe(exc: BaseException) -> tuple[int, str]:
    """``(exit code, message)`` of an exception that ended a command."""
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED, "interrupted"
    message = _one_line_cause(str(exc)) or type(exc).__name__
    if isinstance(exc, E2MCError):
        return exc.exit_code, message
    if isinstance(exc, CorruptImageError):
        return EXIT_INPUT, message
    if isinstance(exc, (FileNotFoundError, NotADirectoryError, IsADirectoryError,
                        FileExistsError, PermissionError)) \
            or (isinstance(exc, OSError) and exc.errno == errno.EROFS):
        if exc.filename is not None and exc.strerror:
            message = f"{exc.filename}: {exc.strerror.lower()}"
        return EXIT_INPUT, message
    if isinstance(exc, OSError):
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            where = f" while writing {exc.filename}" if exc.filename else ""
            return EXIT_FAILURE, f"no space left on the device{where} ({message}); the files " \
                                 "written before are intact"
        return EXIT_FAILURE, message
    if isinstance(exc, ValueError):
        return EXIT_INPUT, message
    if isinstance(exc, _UNREADABLE):
        return EXIT_INPUT, f"unreadable file ({type(exc).__name__}: {message})"
    if isinstance(exc, RuntimeError) and "operator torchvision::" in message:
        return EXIT_FAILURE, _torchvision_mismatch(message)
    return EXIT_FAILURE, f"{type(exc).__name__}: {message} (--debug shows the traceback)"


def _torchvision_mismatch(message: str) -> str:
    """torchvision built for another torch (``operator torchvision::nms does not exist``)."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "(not installed)"

    return (f"torchvision {installed('torchvision')} was not built for torch "
            f"{installed('torch')} ({message}): install the torchvision release made for this "
            "torch (pytorch.org/get-started/previous-versions lists the pairs)")
