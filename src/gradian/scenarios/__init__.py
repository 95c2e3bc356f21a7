"""The synthetic world with planted causes: a tiny base model, real LoRA runs, and their ground truth.

`SCENARIOS` names every scenario; `build(name, out_dir, seed)` writes one scenario folder
(see `gradian.scenarios.build`). Heavy imports (TRL, PEFT) load only when `build` is called.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gradian.scenarios.catalog import CATALOG, SCENARIOS

__all__ = ["CATALOG", "SCENARIOS", "build", "built_before"]


def build(name: str, out_dir: str | Path, seed: int = 0, **options: Any) -> Path:
    """Build scenario `name` into `out_dir`; see `gradian.scenarios.builder.build` for the options."""
    from gradian.scenarios.builder import build as build_scenario

    return build_scenario(name, out_dir, seed, **options)


def built_before(out_dir: str | Path, name: str, seed: int) -> bool:
    """`out_dir` holds a finished build of scenario `name` with `seed` (truth.json and measured.json come last)."""
    out = Path(out_dir)
    try:
        truth = json.loads((out / "truth.json").read_text())
    except (OSError, ValueError):
        return False
    return (out / "measured.json").is_file() and truth.get("scenario") == name and truth.get("seed") == seed
