"""LLaMA-Factory runs and dataset registries, recognised so they are never read as TRL.

LLaMA-Factory prepares rows its own way (its `template:`, `cutoff_len`, `train_on_prompt`, the formats of
`dataset_info.json`). Where LLaMA-Factory is importable beside Gradian its own code prepares the rows
(`data.llamafactory_code`); Gradian has no port of it, so where it is not installed the run is refused with one
sentence naming the package to install, rather than audited on rows rendered as TRL would prepare them.

A run is LLaMA-Factory's when its config uses LLaMA-Factory's keys (`llamafactory_config`), when its
`training_args.bin` pickles LLaMA-Factory's own `TrainingArguments`, or when its folder holds what LLaMA-Factory
writes there (`training_args.yaml` / `llamaboard_config.yaml` from its web UI, `trainer_log.jsonl` from its
`LogCallback`). `dataset_info.json`, the registry of named datasets, is told apart from a data file
(`registry_files`).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
from pathlib import Path
from typing import Any

import yaml

from gradian.data.checkpoints import CHECKPOINT
from gradian.errors import InputError

# Keys of a LLaMA-Factory training YAML (`llamafactory-cli train x.yaml`); the first set appears in no other
# framework's config, the rest only together.
DISTINCT_KEYS = {"finetuning_type", "cutoff_len", "train_on_prompt", "lora_target", "mask_history"}
SHARED_KEYS = {"stage", "template", "dataset", "dataset_dir", "lora_rank", "max_samples"}
WEB_UI_FILES = ("training_args.yaml", "llamaboard_config.yaml")  # what its web UI saves into output_dir
TRAINER_LOG = "trainer_log.jsonl"  # its LogCallback's progress log: {"current_steps", "total_steps", ...} per line
# What points a dataset_info.json entry at its data (one of them is always there).
SOURCE_KEYS = ("file_name", "hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name")


def installed_version() -> str | None:
    """LLaMA-Factory's version where it is installed here, else None."""
    try:
        if importlib.util.find_spec("llamafactory") is None:
            return None
        return importlib.metadata.version("llamafactory")
    except (ValueError, ImportError):  # a module of that name with no spec or no distribution: not the package
        return None


def llamafactory_config(config: dict[str, Any]) -> bool:
    """The config is a LLaMA-Factory training YAML (or the web UI's training_args.yaml)."""
    keys = set(config)
    return bool(keys & DISTINCT_KEYS) or len(keys & SHARED_KEYS) >= 2


def refuse(where: str | Path, what: str) -> InputError:
    """The one sentence for a LLaMA-Factory run Gradian cannot prepare: `what` says how Gradian recognised it."""
    if installed_version() is not None:  # its code is here, but not the YAML that says how the run used it
        return InputError(f"{what}; pass the run's LLaMA-Factory YAML with --config, so LLaMA-Factory's own code "
                          "prepares the rows as the run did.", where)
    return InputError(f"{what}; Gradian prepares its rows with LLaMA-Factory's own code (its template, cutoff_len "
                      "and train_on_prompt), and LLaMA-Factory is not installed here: install it beside Gradian "
                      "(pip install llamafactory, the version the run used) and run Gradian again.", where)


def check_run(config: dict[str, Any], config_path: Path | None, training_args: dict[str, Any],
              run_path: Path | None) -> None:
    """Raise `InputError` (`refuse`) when the run is LLaMA-Factory's (its config, its training_args.bin or the files
    it writes into the run folder) and Gradian cannot prepare its rows: LLaMA-Factory is not installed, or no
    LLaMA-Factory config came with the run to say how it prepared them."""
    if config and llamafactory_config(config):
        if installed_version() is None:
            raise refuse(config_path or "the config", "this is a LLaMA-Factory config")
        return
    if str(training_args.get("__class__", "")).startswith("llamafactory."):
        raise refuse(run_path or "training_args.bin",
                     "training_args.bin holds LLaMA-Factory's TrainingArguments, so this is a LLaMA-Factory run")
    folders = [run_path, run_path.parent] if run_path is not None and CHECKPOINT.match(run_path.name) else [run_path]
    for folder in folders:
        found = _run_folder_file(folder) if folder is not None else None
        if found is not None:
            raise refuse(found, "LLaMA-Factory wrote this file, so this is a LLaMA-Factory run")


def _run_folder_file(folder: Path) -> Path | None:
    """The file LLaMA-Factory left in the run folder, if any (read only enough to be sure)."""
    for name in WEB_UI_FILES:
        path = folder / name
        if path.is_file() and (name == "llamaboard_config.yaml" or llamafactory_config(_yaml(path))):
            return path
    log = folder / TRAINER_LOG
    if log.is_file():
        with open(log, "rb") as handle:
            first = handle.readline(65536)
        try:
            row = json.loads(first)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            return None
        if isinstance(row, dict) and {"current_steps", "total_steps"} <= set(row):
            return log
    return None


def _yaml(path: Path) -> dict[str, Any]:
    try:
        value = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError):
        return {}
    return value if isinstance(value, dict) else {}


def registry_files(value: Any) -> list[str] | None:
    """The data sources a LLaMA-Factory `dataset_info.json` lists (each entry's `file_name`, else its hub name), or
    None when `value` is not such a registry: a non-empty object of named entries, each naming its data source."""
    if not isinstance(value, dict) or not value:
        return None
    entries = list(value.values())
    if not all(isinstance(e, dict) and any(isinstance(e.get(k), str) for k in SOURCE_KEYS) for e in entries):
        return None
    return [next(str(e[k]) for k in SOURCE_KEYS if isinstance(e.get(k), str)) for e in entries]


def refuse_registry(path: Path, sources: list[str]) -> InputError:
    """The one sentence for a dataset_info.json given as a dataset."""
    named = ", ".join(sources[:5]) + (f" and {len(sources) - 5} more" if len(sources) > 5 else "")
    return InputError("this is LLaMA-Factory's dataset registry (dataset_info.json), not rows; pass the data file "
                      f"it lists for the run's dataset instead (it lists {named}, file names relative to its "
                      "folder).", path)
