"""One writer per output folder: an exclusive lock file, so two runs into the same `--out` never interleave.

`output_lock(folder)` creates `folder/.gradian.lock` with O_CREAT|O_EXCL (atomic on local file systems),
holding the owner's pid and host. A second run finds it and stops with one sentence. A lock left by a
process that no longer exists (killed with -9, a crash) is stale: it is taken over, so a killed run can
be resumed by simply running it again.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gradian.errors import InputError

LOCK_NAME = ".gradian.lock"


@contextmanager
def output_lock(folder: str | Path) -> Iterator[Path]:
    """Hold `folder`'s lock for the duration of the block; `InputError` if another live run holds it."""
    path = Path(folder) / LOCK_NAME
    _acquire(path)
    try:
        yield path
    finally:
        if _owner(path) == (os.getpid(), socket.gethostname()):
            path.unlink(missing_ok=True)


def _acquire(path: Path) -> None:
    for _ in range(3):  # a stale lock is removed and creation retried; a live one stops the run
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            owner = _owner(path)
            if owner is not None and _is_stale(*owner):
                path.unlink(missing_ok=True)
                continue
            who = f"process {owner[0]} on {owner[1]}" if owner else "another process"
            raise InputError(f"another Gradian run ({who}) is writing to this folder; wait for it to finish, "
                             f"choose another --out, or delete {LOCK_NAME} if no run is active.", path.parent) from None
        except OSError as error:
            raise InputError(f"cannot write there ({error.strerror}); choose another --out folder.", path.parent) \
                from None
        with os.fdopen(fd, "w") as handle:
            handle.write(f"{os.getpid()} {socket.gethostname()}\n")
        return
    raise InputError(f"could not take the lock {LOCK_NAME}; another run keeps replacing it.", path.parent)


def _owner(path: Path) -> tuple[int, str] | None:
    """(pid, host) written in the lock file, or None while it is being written or when unreadable."""
    try:
        pid, host = path.read_text().split()
        return int(pid), host
    except (OSError, ValueError):
        return None


def _is_stale(pid: int, host: str) -> bool:
    """True when the owner ran on this host and its process is gone; a lock from another host is never stale."""
    if host != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
