"""Free space: a long stage first estimates what it writes and refuses, in one sentence, when the disk holding its
output folder has less free; a disk that still fills up mid-write is one sentence saying the rerun resumes. A device
that runs out of memory is one sentence too, naming the batch sizes the command can lower (`out_of_memory_sentence`).

The estimates (bytes): gradient features `rows × dim × itemsize` per store (the final adapter's, and one per TracIn-CP
checkpoint) plus one byte per row for its done flag (`gradients.store`); scores `Q × N × 8` (float64,
`scores.scoring.effects_file`); verify's retrains `adapter size × retrains`. `$GRADIAN_IGNORE_FREE_SPACE=1` skips
the check knowingly (a filesystem that reports too little, say).
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from gradian.errors import InputError, reason

IGNORE_VARIABLE = "GRADIAN_IGNORE_FREE_SPACE"
MARGIN = 1.05  # what the estimate leaves out: settings.json, ids.json, the report files
FULL = (errno.ENOSPC, errno.EDQUOT)


def features_bytes(rows: int, dim: int, itemsize: int, stores: int = 1) -> int:
    """What `stores` feature stores of `rows` rows of `dim` values write (features and done flags)."""
    return stores * rows * (dim * itemsize + 1)


def scores_bytes(queries: int, rows: int) -> int:
    """scores.npy: (Q, N) float64."""
    return queries * rows * 8


def require_space(out: str | Path, needed: int, what: str, *, present: int = 0) -> None:
    """`InputError` when the disk holding `out` has less free space than `what` needs (`needed` bytes, less the
    `present` bytes a resumed run already holds there), unless `$GRADIAN_IGNORE_FREE_SPACE` is set."""
    if os.environ.get(IGNORE_VARIABLE, "").strip() not in ("", "0"):
        return
    folder = Path(out)
    while not folder.exists() and folder != folder.parent:  # --out may not exist yet: its disk is its parent's
        folder = folder.parent
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return  # no answer from the filesystem: the write itself will say
    missing = int((needed - present) * MARGIN)
    if missing > free:
        raise InputError(f"{what} writes about {size_text(missing)} there but its disk has {size_text(free)} free; "
                         f"free some space, choose another --out, or set {IGNORE_VARIABLE}=1 to go on anyway.", out)


def size_text(size: int) -> str:
    """1.2 GB, 350 MB, 12 KB: a size as a user reads it (powers of 1000, as `df -H` and file managers show)."""
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} bytes"


def allocated(*paths: Path) -> int:
    """Bytes the files under `paths` already hold on disk (a resumed store's files count as written)."""
    total = 0
    for root in paths:
        for path in [root] if root.is_file() else (root.rglob("*") if root.is_dir() else []):
            if path.is_file():
                total += path.stat().st_blocks * 512
    return total


def preallocate(path: Path, size: int) -> None:
    """Reserve `size` bytes for a file about to be written through a memory map, so a full disk is an `OSError` now
    (ENOSPC) rather than a SIGBUS that kills the process mid-write. Filesystems that cannot reserve are left as
    they are."""
    if not hasattr(os, "posix_fallocate") or size <= 0:
        return
    descriptor = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(descriptor, 0, size)
    except OSError as error:
        if error.errno in FULL:
            raise
    finally:
        os.close(descriptor)


def is_disk_full(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in FULL


def disk_full_sentence(error: OSError) -> str:
    """The one sentence for a disk that filled up mid-write."""
    where = f" while writing {error.filename}" if error.filename else ""
    return (f"the disk filled up{where} ({os.strerror(error.errno or errno.ENOSPC)}); what was finished is kept: free "
            "some space and run the same command again, it resumes from there.")


MEMORY_OPTIONS = {"attribute": "--batch-size or --generation-batch-size", "extract": "--batch-size",
                  "verify": "--batch-size"}  # what each command can lower when the device runs out of memory


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` is the device (or the host) running out of memory: Python's own, or accelerate's test of
    torch's messages (CUDA, MPS, XPU, CPU)."""
    if isinstance(error, MemoryError):
        return True
    from accelerate.utils.memory import should_reduce_batch_size  # only when something failed: import stays cheap

    return isinstance(error, RuntimeError) and should_reduce_batch_size(error)


def out_of_memory_sentence(error: BaseException, command: str | None) -> str:
    """The one sentence for a run the device's memory cannot hold, naming what `command` can lower."""
    lower = MEMORY_OPTIONS.get(command or "")
    what = f"lower {lower}, or choose a --device with more memory" if lower else "use a machine with more memory"
    return f"the device ran out of memory ({reason(error, 120)}); {what}, and run the command again."
