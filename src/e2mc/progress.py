"""Progress display: a tqdm bar on a terminal (or in a Jupyter kernel); elsewhere (a log file,
where carriage returns would pile up) a :class:`PlainProgress` printing whole lines.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any

__all__ = ["PLAIN_EVERY_S", "PlainProgress", "heartbeat", "is_terminal", "progress_bar"]

#: Seconds between two plain lines that no quarter of the total prompted (a log shows life).
PLAIN_EVERY_S = 10.0


def is_terminal(stream: IO[str] | None = None) -> bool:
    """Whether ``stream`` (default ``sys.stderr``) is an interactive terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def progress_bar(iterable: Iterable[Any] | None = None, *, total: float | None = None,
                 initial: float = 0, desc: str | None = None, unit: str = "it",
                 disable: bool = False, leave: bool = True, file: IO[str] | None = None,
                 every: float = PLAIN_EVERY_S, **tqdm_options: Any) -> Any:
    """A tqdm bar on a terminal or in Jupyter, else a :class:`PlainProgress`."""
    stream = sys.stderr if file is None else file
    if not disable and (is_terminal(stream) or "ipykernel" in sys.modules):
        from tqdm.auto import tqdm

        return tqdm(iterable, total=total, initial=initial, desc=desc, unit=unit, leave=leave,
                    file=stream, dynamic_ncols=True, **tqdm_options)
    return PlainProgress(iterable, total=total, initial=initial, desc=desc, unit=unit,
                         disable=disable, file=stream, every=every)


@contextlib.contextmanager
def heartbeat(desc: str, every: float = PLAIN_EVERY_S, file: IO[str] | None = None
              ) -> Iterator[None]:
    """While the block runs, print ``DESC, elapsed Ts`` every ``every`` seconds: a phase with
    nothing to count (loading PyTorch takes seconds, a minute on a loaded machine) is not
    silent. A block shorter than ``every`` prints nothing."""
    stream = sys.stderr if file is None else file
    done, start = threading.Event(), time.monotonic()

    def beat() -> None:
        while not done.wait(every):
            print(f"{desc}, elapsed {time.monotonic() - start:.0f}s", file=stream, flush=True)

    thread = threading.Thread(target=beat, name="e2mc-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


class PlainProgress:
    """Progress as whole lines: ``DESC: N/TOTAL UNIT (P%), elapsed Ts[, POSTFIX]``, printed
    when a quarter of ``total`` is reached and otherwise at most every ``every`` seconds; on
    :meth:`close`, a last line if the count moved since the previous one."""

    def __init__(self, iterable: Iterable[Any] | None = None, *, total: float | None = None,
                 initial: float = 0, desc: str | None = None, unit: str = "it",
                 disable: bool = False, file: IO[str] | None = None,
                 every: float = PLAIN_EVERY_S) -> None:
        if total is None and iterable is not None:
            try:
                total = len(iterable)  # type: ignore[arg-type]
            except TypeError:
                total = None
        self.iterable, self.total, self.n = iterable, total, initial
        self.desc, self.unit, self.disable = desc, unit, disable
        self.file, self.every = file, every
        self.postfix = ""
        self._start = self._last_time = time.monotonic()
        self._last_n = initial
        self._quarter = self._quarters(initial)
        self._closed = False

    def _quarters(self, n: float) -> int:
        """How many quarters of the total ``n`` has reached (0 without a total)."""
        return int(4 * n // self.total) if self.total else 0

    def __iter__(self) -> Iterator[Any]:
        if self.iterable is None:
            raise TypeError("this progress display has no iterable; call update() instead")
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __len__(self) -> int:
        return int(self.total or 0)

    def update(self, n: float = 1) -> None:
        self.n += n
        quarter = self._quarters(self.n)
        if quarter > self._quarter or time.monotonic() - self._last_time >= self.every:
            self._quarter = max(quarter, self._quarter)
            self._print()

    def set_postfix(self, ordered_dict: dict[str, Any] | None = None, refresh: bool = True,
                    **kwargs: Any) -> None:
        fields = {**(ordered_dict or {}), **kwargs}
        self.postfix = ", ".join(f"{k}={v}" for k, v in fields.items())

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = str(s)

    def close(self) -> None:
        if not self._closed and self.n != self._last_n:
            self._print()
        self._closed = True

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def line(self) -> str:
        """The line :meth:`update` prints now."""
        count = f"{_number(self.n)}/{_number(self.total)}" if self.total else _number(self.n)
        text = f"{self.desc}: " if self.desc else ""
        text += f"{count} {self.unit}"
        if self.total:
            text += f" ({100 * self.n / self.total:.0f}%)"
        text += f", elapsed {time.monotonic() - self._start:.0f}s"
        return text + (f", {self.postfix}" if self.postfix else "")

    def _print(self) -> None:
        self._last_time, self._last_n = time.monotonic(), self.n
        if not self.disable:
            print(self.line(), file=sys.stderr if self.file is None else self.file, flush=True)


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) and not value.is_integer() else \
        str(int(value))
