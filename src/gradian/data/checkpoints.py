"""Where a run folder keeps its checkpoints: `checkpoint-N/`, N the global step (the one place Gradian finds them)."""

from __future__ import annotations

import re
from pathlib import Path

CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def checkpoint_dir(root: str | Path, step: int) -> Path:
    """The folder the trainer saves global step `step` into under the run folder `root`: `root/checkpoint-{step}`."""
    return Path(root) / f"checkpoint-{step}"


def checkpoint_folders(path: Path) -> list[Path]:
    """The `checkpoint-N/` folders under `path`, sorted by N."""
    found = [(int(match.group(1)), child) for child in path.iterdir()
             if child.is_dir() and (match := CHECKPOINT.match(child.name))]
    return [child for _, child in sorted(found)]
