"""Atomic writes: a reader never sees half a file, and a killed run leaves the old file or none.

The temporary file is named after the process, so two runs never share one, and it is created with `open`, so
the result has the permissions the user's umask gives any new file.
"""

from __future__ import annotations

import os
from pathlib import Path


def atomic_write(path: Path, data: str | bytes) -> Path:
    """Write `data` (text is UTF-8) to `path` through a temporary file beside it; returns `path`."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    os.replace(temporary, path)  # no fsync: a killed process loses nothing; the page cache outlives it
    return path
