"""Atomic writes: a reader never sees half a file, and a killed run leaves the old file or none.

The temporary file is named after the process, so two runs never share one, and it is created with `open`, so
the result has the permissions the user's umask gives any new file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gradian.errors import InputError


def cache_dir(kind: str) -> Path:
    """Gradian's own cache of `kind` (scenarios, rows): `$GRADIAN_CACHE/<kind>`, else `~/.cache/gradian/<kind>`."""
    root = Path(os.environ["GRADIAN_CACHE"]) if os.environ.get("GRADIAN_CACHE") else Path.home() / ".cache" / "gradian"
    return root / kind


def atomic_write(path: Path, data: str | bytes) -> Path:
    """Write `data` (text is UTF-8) to `path` through a temporary file beside it; returns `path`."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    os.replace(temporary, path)  # no fsync: a killed process loses nothing; the page cache outlives it
    return path


def read_json_object(path: Path, damaged: str) -> dict[str, Any]:
    """The JSON object in `path`, else `InputError` in one sentence naming the file (and line) and ending with
    `damaged`, what the user should conclude ("the run folder looks damaged")."""
    if not path.is_file():  # a link to a pipe would block, to a device would never end
        raise InputError(f"is not a regular file; {damaged}.", path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError(f"is not UTF-8 text; {damaged}.", path) from None
    except OSError as error:
        raise InputError(f"cannot be read ({error.strerror}).", path) from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise InputError(f"is not valid JSON ({error.msg}); {damaged}.", path, error.lineno) from None
    except RecursionError:
        raise InputError(f"is JSON nested too deeply to read; {damaged}.", path) from None
    if not isinstance(value, dict):
        raise InputError(f"should hold a JSON object; {damaged}.", path)
    return value
