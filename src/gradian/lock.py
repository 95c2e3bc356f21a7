"""One writer per output folder: an exclusive lock, so two runs into the same `--out` never interleave.

`output_lock(folder)` holds `folder/.gradian.lock` with `filelock` (an OS lock on the open file, flock on Unix):
the OS drops it when its process ends, however it ends, so a killed run (-9, a crash) leaves nothing to take over
and is resumed by simply running it again. The holder writes its pid and host into the file, so a second run can
say who holds it; it stops at once with one sentence, never waits. Under torch.distributed only rank 0 holds it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from gradian.errors import InputError

LOCK_NAME = ".gradian.lock"


@contextmanager
def output_lock(folder: str | Path) -> Iterator[Path]:
    """Hold `folder`'s lock for the duration of the block; `InputError` if another live run holds it."""
    path = Path(folder) / LOCK_NAME
    lock = FileLock(path, timeout=0, thread_local=False)
    try:
        lock.acquire()
    except Timeout:
        owner = _owner(path)
        who = f"process {owner[0]} on {owner[1]}" if owner else "another process"
        raise InputError(f"another Gradian run ({who}) is writing to this folder; wait for it to finish "
                         "or choose another --out.", path.parent) from None
    except OSError as error:
        raise InputError(f"cannot write there ({error.strerror}); choose another --out folder.", path.parent) \
            from None
    try:
        path.write_text(f"{os.getpid()} {socket.gethostname()}\n")  # another descriptor: the lock stays held
        yield path
    finally:
        lock.release()


def _owner(path: Path) -> tuple[int, str] | None:
    """(pid, host) written in the lock file, or None while it is being written or when unreadable."""
    try:
        pid, host = path.read_text().split()
        return int(pid), host
    except (OSError, ValueError):
        return None
