"""Processes: what identifies one beyond its pid (start time, boot, host), so that a reused pid or
another host's process is never taken for the writer of a lock or ``jobs.json``; whether a
process holds a file's lock; how many CPU cores this one may use. Imports nothing from e2mc.
"""

from __future__ import annotations

import functools
import os
import socket
import sys
from pathlib import Path
from typing import Any


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity), else the machine's count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def loader_start_method(num_workers: int) -> str | None:
    """A ``DataLoader``'s ``multiprocessing_context``: None unless the default is ``forkserver``,
    then ``fork`` on Linux, else ``spawn`` (a forkserver's workers have the server as parent, so
    they would outlive a killed trainer, each holding its memory)."""
    import multiprocessing

    # the method set, else the platform's default (the first listed), without fixing it: a
    # program may still choose its own after this
    method = (multiprocessing.get_start_method(allow_none=True)
              or multiprocessing.get_all_start_methods()[0])
    if num_workers <= 0 or method != "forkserver":
        return None
    return "fork" if sys.platform.startswith("linux") else "spawn"


def exit_if_orphaned(parent: int, worker_id: int) -> None:
    """A DataLoader worker's ``worker_init_fn``: exit when the parent is no longer ``parent``
    (torch's watchdog misses a trainer killed before the worker started)."""
    if os.getppid() != parent:
        os._exit(0)


def loader_options(num_workers: int) -> dict[str, Any]:
    """The ``DataLoader`` arguments of its workers (start method, orphan exit); none without."""
    if num_workers <= 0:
        return {}
    return {"multiprocessing_context": loader_start_method(num_workers),
            "worker_init_fn": functools.partial(exit_if_orphaned, os.getpid())}


def lock_held(path: str | os.PathLike[str]) -> bool | None:
    """Whether a process holds the POSIX lock of ``path`` (``F_GETLK``); None if unknown."""
    import fcntl
    import struct

    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:  # struct flock {short l_type, l_whence; off_t l_start, l_len; pid_t l_pid}
        query = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, query)
        return struct.unpack("hhqqi4x", answer)[0] != fcntl.F_UNLCK
    except (OSError, struct.error):
        return None
    finally:
        os.close(fd)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (one we may not signal counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def boot_id() -> str | None:
    """This boot's id (``/proc/sys/kernel/random/boot_id``), ``None`` without ``/proc``."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except OSError:
        return None


def process_start(pid: int) -> int | None:
    """Process ``pid``'s start, in clock ticks since boot; None when gone or without /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
        return int(stat[stat.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def process_identity(pid: int | None = None) -> dict[str, Any]:
    """``{pid, host, boot_id, start_ticks}`` of process ``pid`` (default: this one)."""
    pid = os.getpid() if pid is None else pid
    return {"pid": pid, "host": socket.gethostname(), "boot_id": boot_id(),
            "start_ticks": process_start(pid)}


def same_process(record: dict[str, Any]) -> bool:
    """Whether the process of ``record`` (:func:`process_identity`) is alive: on this host, with
    the recorded boot id and start time. Another host's process is ``False`` (not waited for;
    its lock still refuses a second writer)."""
    try:
        pid, host = int(record["pid"]), str(record["host"])
    except (KeyError, TypeError, ValueError):
        return False
    if host != socket.gethostname() or not process_alive(pid):
        return False
    if record.get("boot_id") and boot_id() and record["boot_id"] != boot_id():
        return False
    now = process_start(pid)
    return not (record.get("start_ticks") is not None and now is not None
                and int(record["start_ticks"]) != now)
