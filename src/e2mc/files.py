"""Writing files safely (atomically, into checked directories, never through a symbolic link at
a path e2mc makes), names made safe for file names and for display, and a file's SHA-256.
No torch: checkpoints are written through :func:`e2mc.checkpoints.io.atomic_save`.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from e2mc.errors import InputError


def _new_file_mode(target: Path) -> int:
    """The mode ``open(target, "w")`` would give (``mkstemp``'s 0o600 is unreadable to others)."""
    try:
        return target.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def refuse_link(path: str | os.PathLike[str]) -> None:
    """Raise :class:`~e2mc.errors.InputError` (one line) when ``path`` is a symbolic link: one
    planted where e2mc writes or cleans would send the write (or deletion) to another file."""
    if os.path.islink(path):
        raise InputError(f"{path} is a symbolic link; e2mc writes only files it owns and does "
                         "not follow links at the paths it makes: remove the link or use "
                         "another directory")


def own_dir(path: str | os.PathLike[str]) -> Path:
    """Make the folder ``path`` (and parents), refusing a symbolic link there; returns it."""
    refuse_link(path)
    Path(path).mkdir(parents=True, exist_ok=True)
    refuse_link(path)  # (planted between the check and the mkdir)
    return Path(path)


#: Temporary files of :func:`atomic_write`: ``.NAME.XXXXXXXX.tmp`` (``mkstemp``'s 8 characters).
_TEMP_FILE = re.compile(r"^\.(.+)\.[a-z0-9_]{8}\.tmp$")


def temp_target(name: str) -> str | None:
    """The name of the file an :func:`atomic_write` temporary file ``name`` (a killed writer's)
    was to become; None for any other name."""
    m = _TEMP_FILE.match(name)
    return m.group(1) if m else None


_UNSAFE = re.compile(r"[\x00-\x1f\x7f/\\]")


def safe_name(name: str, what: str = "name") -> str:
    """``name`` as a file name, or one-line InputError (empty, ., .., a separator or control)."""
    if not name or name in (".", "..") or _UNSAFE.search(name):
        raise InputError(f"{what} {name!r} cannot be a file name (empty, '.', '..', a '/' or "
                         "'\\', or a control character); choose another")
    return name


#: Characters shown as escapes wherever a user's name is displayed: C0 and C1 controls, DEL,
#: and the bidirectional controls that reorder what a reader sees.
_INVISIBLE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


#: The codec error handler writing a lone surrogate as text: the byte a surrogate escape stands
#: for (a name that is not UTF-8) as ``\xff``, any other as ``\udXXX``.
UNENCODABLE_AS_TEXT = "e2mc.unencodable-as-text"


def _unencodable_as_text(err: UnicodeError) -> tuple[str, int]:
    if not isinstance(err, UnicodeEncodeError):
        raise err
    bad = err.object[err.start:err.end]
    return "".join(f"\\x{ord(c) - 0xDC00:02x}" if 0xDC80 <= ord(c) <= 0xDCFF
                   else f"\\u{ord(c):04x}" for c in bad), err.end


codecs.register_error(UNENCODABLE_AS_TEXT, _unencodable_as_text)


def display_name(text: object) -> str:
    r"""``text`` (a user's name) as it can be shown in a terminal, text file or figure: bytes
    that are not UTF-8 (surrogate escapes) as ``\xff``, control characters as ``\n``,
    ``\x1b``, ``\u202e``; everything else as it is."""
    shown = str(text).encode("utf-8", UNENCODABLE_AS_TEXT).decode("utf-8")
    return _INVISIBLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), shown)


#: What a Markdown viewer would read as markup in a name: inline marks (emphasis, code,
#: links and images, strikethrough, math, table cells); ``_`` counts between word characters
#: only (:func:`markdown_text`).
_MARKDOWN_INLINE = re.compile(r"[`*\[\]~|$]|\\(?=[\x21-\x2f\x3a-\x40\x5b-\x60\x7b-\x7e]|$)"
                              r"|(?<![^\W_])_|_(?![^\W_])")
#: A block mark at the start of a name: a heading, a list item, a quote, a numbered item.
_MARKDOWN_BLOCK = re.compile(r"^(\s*)([#+\-=]|\d+[.)])")


def markdown_text(text: object) -> str:
    r"""``text`` (a user's name, or a sentence with names) as plain text in a Markdown file e2mc
    writes: one line as :func:`display_name` shows it, ``<>&`` as HTML entities (no raw HTML),
    and every mark a viewer would act on (links, images, emphasis, code, table cells, a leading
    heading/list/quote mark) backslash-escaped, so a viewer shows the name as it was given."""
    import html

    out = html.escape(display_name(text), quote=False)
    out = _MARKDOWN_INLINE.sub(lambda m: "\\" + m.group(), out)
    return _MARKDOWN_BLOCK.sub(lambda m: f"{m.group(1)}{m.group(2)[:-1]}\\{m.group(2)[-1]}", out,
                               count=1)


def open_append(path: str | os.PathLike[str]) -> Any:
    """The text file ``path`` opened for appending, never through a symbolic link."""
    refuse_link(path)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                 0o666)
    return os.fdopen(fd, "a", encoding="utf-8")


def atomic_write(path: str | os.PathLike[str], write: Any, mode: str = "wb") -> None:
    """Call ``write(file)`` on a temporary file beside ``path`` (``mode`` ``"wb"`` or ``"w"``),
    fsync it and ``os.replace`` it onto ``path`` (with the umask's mode); on failure nothing is
    left and ``path`` is untouched. A full disk is an ``OSError(ENOSPC)`` naming ``path``; a
    symbolic link at ``path`` is refused (:func:`refuse_link`)."""
    target = Path(path)
    refuse_link(target)
    if target.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a directory, not a file", str(target))
    target.parent.mkdir(parents=True, exist_ok=True)
    file_mode = _new_file_mode(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    failed: list[OSError] = []  # what the file system said, under a writer that rewraps it
    try:
        os.fchmod(fd, file_mode)
        # text as UTF-8; a character that cannot be written (a lone surrogate: a byte of a
        # path that is not UTF-8) as text, \xff as display_name shows it, never an error
        text = {} if "b" in mode else {"encoding": "utf-8", "errors": UNENCODABLE_AS_TEXT}
        with os.fdopen(fd, mode, **text) as f:
            write(_Recording(f, failed))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException as err:
        if os.path.exists(tmp):
            os.unlink(tmp)
        cause = err if isinstance(err, OSError) else failed[0] if failed else None
        if cause is not None and cause.errno in (errno.ENOSPC, errno.EDQUOT) \
                and (cause is not err or err.filename is None):
            # (torch.save reports a failed write as "[enforce fail at inline_container.cc]")
            raise OSError(cause.errno, os.strerror(cause.errno), str(target)) from err
        raise


class _Recording:
    """A file whose failed writes are recorded in ``failed`` (then raised): ``torch.save`` turns
    an ``OSError`` into a ``RuntimeError``, and :func:`atomic_write` still reports the cause."""

    def __init__(self, f: Any, failed: list[OSError]) -> None:
        self._f, self._failed = f, failed

    def write(self, data: Any) -> Any:
        try:
            return self._f.write(data)
        except OSError as err:
            self._failed.append(err)
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


def check_writable_dir(path: str | os.PathLike[str], what: str = "directory") -> None:
    """Raise :class:`~e2mc.errors.InputError` (one line) unless a file can be created in the
    directory ``path`` (or its nearest existing parent): before any work, not at the first write."""
    target = Path(path)
    where = target
    while not where.exists() and where != where.parent:
        where = where.parent
    if not where.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(where))
    try:
        fd, probe = tempfile.mkstemp(prefix=".e2mc-write-test.", suffix=".tmp", dir=where)
    except OSError as err:
        if err.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        inside = "" if where == target else f" (in {where})"
        reason = (err.strerror or os.strerror(err.errno)).lower()
        raise InputError(f"{target}: cannot write the {what} here{inside}: {reason}") from err
    os.close(fd)
    with contextlib.suppress(FileNotFoundError):  # (removed by a cleaner meanwhile)
        os.unlink(probe)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Replace ``path`` atomically by ``text`` (:func:`atomic_write`)."""
    atomic_write(path, lambda f: f.write(text), "w")


def atomic_write_json(obj: Any, path: str | os.PathLike[str]) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    """SHA-256 (hex) of a file's bytes: the one identity of a file's content."""
    digest = hashlib.sha256()  # releases the GIL on large blocks: threads hash in parallel
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()
