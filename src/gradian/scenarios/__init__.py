"""The synthetic world with planted causes: a tiny base model, real LoRA runs, and their ground truth.

`SCENARIOS` names every catalog scenario and `FAMILIES` every family of the suite (`suite.py`: domains,
tokenizers, recipes and causes, split dev / test); `build(name, out_dir, seed)` writes one folder of either
(see `gradian.scenarios.builder.build` and `gradian.scenarios.family.build_family`). Heavy imports (TRL, PEFT)
load only when `build` is called.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gradian.errors import InputError
from gradian.scenarios.catalog import CATALOG, SCENARIOS
from gradian.scenarios.suite import FAMILIES

__all__ = ["CATALOG", "FAMILIES", "SCENARIOS", "attribute_settings", "build", "built_before"]


def build(name: str, out_dir: str | Path, seed: int = 0, **options: Any) -> Path:
    """Build scenario or suite family `name` into `out_dir`; see `gradian.scenarios.builder.build` for the options."""
    if name in FAMILIES:
        from gradian.scenarios.family import build_family

        return build_family(name, out_dir, seed, **options)
    from gradian.scenarios import smollm2
    from gradian.scenarios.builder import build as build_scenario
    from gradian.scenarios.builder import new_folder

    if name == smollm2.NAME:  # the one scenario on a real model
        return smollm2.build_smollm2(new_folder(out_dir), seed, options.get("cache_dir"), options.get("progress"))
    if name not in CATALOG:
        raise InputError(f"unknown scenario {name!r}; choose one of: {', '.join([*CATALOG, smollm2.NAME])}.")
    return build_scenario(name, out_dir, seed, **options)


def built_before(out_dir: str | Path, name: str, seed: int) -> bool:
    """`out_dir` holds a finished build of scenario `name` with `seed` (truth.json and measured.json come last)."""
    out = Path(out_dir)
    try:
        truth = json.loads((out / "truth.json").read_text())
    except (OSError, ValueError):
        return False
    return (out / "measured.json").is_file() and truth.get("scenario") == name and truth.get("seed") == seed


def attribute_settings(folder: str | Path, out: str | Path, **options: Any) -> Any:
    """The `AttributeSettings` of `gradian attribute` on a built scenario `folder` into `out`, as a user would pass
    them (its base, run folder, train and eval files, the capability its truth names), with `options` on top."""
    from gradian.settings import AttributeSettings

    folder = Path(folder)
    truth = json.loads((folder / "truth.json").read_text())
    return AttributeSettings(
        base_model=str(folder / "base"), adapter=str(folder / "run"), run=str(folder / "run"),
        dataset=str(folder / "train.jsonl"), eval_dataset=str(folder / "eval.jsonl"),
        capability=truth.get("capability", "json_formatting"), out=str(out), **options)
