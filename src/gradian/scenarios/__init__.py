"""The synthetic world with planted causes: a tiny base model, real LoRA runs, and their ground truth.

`SCENARIOS` names every scenario; `build(name, out_dir, seed)` writes one scenario folder
(see `gradian.scenarios.build`). Heavy imports (TRL, PEFT) load only when `build` is called.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gradian.scenarios.catalog import CATALOG, SCENARIOS

__all__ = ["CATALOG", "SCENARIOS", "build"]


def build(name: str, out_dir: str | Path, seed: int = 0, **options: Any) -> Path:
    """Build scenario `name` into `out_dir`; see `gradian.scenarios.builder.build` for the options."""
    from gradian.scenarios.builder import build as build_scenario

    return build_scenario(name, out_dir, seed, **options)
