"""What a training run left behind: adapter, trainer state, checkpoints and the settings it trained with.

Reads the folders HF Trainer / TRL `SFTTrainer` write (`adapter_config.json`, `adapter_model.safetensors`,
`trainer_state.json` with its `log_history`, `checkpoint-N/` with `optimizer.pt` and `training_args.bin`)
and a training config: a TRL `SFTConfig` YAML/JSON (as passed to `trl sft --config`) or an axolotl YAML,
given with `config=` or found in the run folder. Settings are taken, highest first, from: `overrides`
(command-line flags), the config file, `training_args.bin` (read without running code), `trainer_state.json`,
and the framework's defaults; `setup.assumed` names every rendering setting taken on trust from the defaults.

A run trained with `GradianCallback` holds `gradian_run.json` (`data.run_record`): what the running trainer was
(collator and whether it masked pad ids, max length, loss mode, framework version). It is read first and outranks
the config file and training_args.bin; only flags outrank it. Without it nothing changes.

A LLaMA-Factory run (its config, its training_args.bin or the files it writes into the run folder) is refused
with one sentence (`data.llamafactory`): Gradian does not yet prepare rows as LLaMA-Factory does.

Config keys Gradian reads besides the framework's own: `data_collator` (a class name such as
`transformers.DataCollatorForLanguageModeling`: that collator sets the labels of pad ids to -100) and
`collator_masks_pad` (true/false, to say it directly).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from gradian.data import llamafactory
from gradian.data.checkpoints import CHECKPOINT, checkpoint_folders
from gradian.data.config_fields import FRAMEWORK_DEFAULTS, detect_framework, setup_fields, trainer_state_fields
from gradian.data.framework_version import (
    VersionRange,
    inferred_trl_version,
    recorded_version,
    trl_collator_masks_pad,
)
from gradian.data.run_record import RunRecord, read_run_record
from gradian.data.safe_yaml import check_size, load_yaml
from gradian.data.setup import TrainingSetup
from gradian.data.training_args import read_training_args
from gradian.errors import InputError
from gradian.files import read_json_object

CONFIG_NAMES = (
    "sft_config.yaml", "sft_config.yml", "sft_config.json", "training_config.yaml", "training_config.yml",
    "training_config.json", "trl_config.yaml", "axolotl.yaml", "axolotl.yml", "config.yaml", "config.yml",
    "training_args.yaml",  # what LLaMA-Factory's web UI saves into output_dir: the run's own YAML
)


@dataclass
class RunInfo:
    """One run folder, read. Paths are absolute; `unreadable` says what could not be read and why."""

    path: Path | None
    adapter_dir: Path | None = None
    adapter_config: dict[str, Any] = field(default_factory=dict)
    trainer_state: dict[str, Any] | None = None
    log_history: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[Path] = field(default_factory=list)
    optimizer_path: Path | None = None
    tokenizer_dir: Path | None = None  # the tokenizer the trainer saved (its processing class), newest first
    setup: TrainingSetup = field(default_factory=TrainingSetup)
    training_args: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    config_path: Path | None = None
    unreadable: list[str] = field(default_factory=list)
    record: RunRecord | None = None  # gradian_run.json, when GradianCallback recorded the run


def read_run(
    run_dir: str | Path | None, config: str | Path | None = None, overrides: dict[str, Any] | None = None
) -> RunInfo:
    """Read a run folder (or only a config when `run_dir` is None) into a `RunInfo`.

    Raises `InputError` naming the file for a folder that does not exist or holds no run, and for
    an adapter config / trainer state / config file that is not valid JSON or YAML.
    """
    run = RunInfo(path=None)
    if run_dir is not None:
        run = _read_folder(_resolved(run_dir, "the run folder"))
    config_path = _resolved(config, "the config file") if config is not None else _find_config(run.path)
    if config is not None and not config_path.is_file():
        raise InputError("no such config file; check the path.", config)
    run.config_path = config_path
    run.config = read_config_file(config_path) if config_path else {}
    llamafactory.check_run(run.config, config_path, run.training_args, run.path)  # never read as TRL
    run.setup = _resolve_setup(run, overrides or {})
    return run


def _resolved(path: str | Path, what: str) -> Path:
    """`path` with its symlinks resolved; `InputError` for a symlink loop or a name the system refuses."""
    try:
        return Path(path).resolve()
    except (RuntimeError, OSError) as error:  # RuntimeError: a symlink loop before Python 3.13
        problem = getattr(error, "strerror", None) or "a symlink loop"
        raise InputError(f"cannot be resolved ({problem}); pass {what} itself.", path) from None


def _read_folder(path: Path) -> RunInfo:
    if not path.exists():
        raise InputError("no such run folder; check the path.", path)
    if not path.is_dir():
        raise InputError("is a file, expected a run folder (the trainer's output_dir).", path)
    checkpoints = checkpoint_folders(path)
    if CHECKPOINT.match(path.name) and not checkpoints:
        checkpoints = [path]
    adapter_dir = newest_with(path, checkpoints, "adapter_config.json")
    state_dir = newest_with(path, checkpoints, "trainer_state.json")
    if adapter_dir is None and state_dir is None:
        raise InputError(
            "holds no adapter_config.json and no trainer_state.json (nor checkpoint-*/ with them); "
            "point --run at the trainer's output_dir.",
            path,
        )
    run = RunInfo(path=path, adapter_dir=adapter_dir, checkpoints=checkpoints)
    if adapter_dir is not None:
        run.adapter_config = check_lora_numbers(_read_json(adapter_dir / "adapter_config.json"),
                                                adapter_dir / "adapter_config.json")
        name = run.adapter_config.get("base_model_name_or_path")
        if name is not None and not isinstance(name, str):
            raise InputError("base_model_name_or_path should be a string (the base model's folder or hub id).",
                             adapter_dir / "adapter_config.json")
        if not any((adapter_dir / name).exists() for name in ("adapter_model.safetensors", "adapter_model.bin")):
            run.unreadable.append(f"{adapter_dir}: no adapter_model.safetensors beside adapter_config.json")
    if state_dir is not None:
        run.trainer_state = _read_json(state_dir / "trainer_state.json")
        log = run.trainer_state.get("log_history", [])
        if not isinstance(log, list):
            raise InputError("log_history should be a list of logged steps; the run folder looks damaged.",
                             state_dir / "trainer_state.json")
        run.log_history = [row for row in log if isinstance(row, dict)]
    newest = checkpoints[-1] if checkpoints else path
    if (newest / "optimizer.pt").exists():
        run.optimizer_path = newest / "optimizer.pt"
    run.tokenizer_dir = newest_with(path, checkpoints, "tokenizer_config.json")
    run.training_args = _training_args(run, path, checkpoints)
    run.record = read_run_record(path)
    return run


def newest_with(root: Path, checkpoints: list[Path], name: str) -> Path | None:
    """The run root if it holds `name` (what `save_model`/`save_state` write last), else the newest checkpoint."""
    for folder in [root, *reversed(checkpoints)]:
        if (folder / name).is_file():
            return folder
    return None


def check_lora_numbers(config: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """`config` (an adapter_config.json) when its rank `r` is a positive integer and `lora_alpha` a finite number
    (JSON lets NaN and Infinity through); else `InputError` naming the file. The one rule the audit and loading use."""
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 1):
        raise InputError(f'"r" is {rank!r}, not a positive whole number (the LoRA rank); the adapter config looks '
                         "damaged: save the adapter again.", path)
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha)):
        raise InputError(f'"lora_alpha" is {alpha!r}, not a finite number; the adapter config looks damaged: save '
                         "the adapter again.", path)
    return config


def _read_json(path: Path) -> dict[str, Any]:
    return read_json_object(path, "the run folder looks damaged")


def _training_args(run: RunInfo, root: Path, checkpoints: list[Path]) -> dict[str, Any]:
    for folder in [root, *reversed(checkpoints)]:
        candidate = folder / "training_args.bin"
        if candidate.is_file():
            try:
                return read_training_args(candidate)
            except InputError as error:
                run.unreadable.append(str(error))
                return {}
    return {}


def _find_config(run_path: Path | None) -> Path | None:
    if run_path is None:
        return None
    for folder in (run_path, run_path.parent if CHECKPOINT.match(run_path.name) else run_path):
        for name in CONFIG_NAMES:
            if (folder / name).is_file():
                return folder / name
    return None


def read_config_file(path: Path) -> dict[str, Any]:
    """A training config (YAML or JSON) as a dict; `InputError` with file and line when it does not parse."""
    if not path.is_file():
        raise InputError("is not a regular file (a folder, pipe or device); pass the config file itself.", path)
    check_size(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError("is not UTF-8 text; re-encode the config as UTF-8.", path) from None
    try:
        value = json.loads(text) if path.suffix == ".json" else load_yaml(text, path)
    except json.JSONDecodeError as error:
        raise InputError(f"is not valid JSON ({error.msg}).", path, error.lineno) from None
    except RecursionError:
        raise InputError("is JSON nested too deeply to read; fix the config.", path) from None
    except yaml.YAMLError as error:
        line = error.problem_mark.line + 1 if getattr(error, "problem_mark", None) else None
        raise InputError(f"is not valid YAML ({getattr(error, 'problem', None) or 'parse error'}).", path, line) from None
    except ValueError as error:  # YAML that parses but holds an impossible value, such as 2024-02-30
        raise InputError(f"holds a value YAML cannot represent ({error}).", path) from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InputError("should hold a mapping of setting names to values.", path)
    return value


def _resolve_setup(run: RunInfo, overrides: dict[str, Any]) -> TrainingSetup:
    """Flags > config file > training_args.bin > trainer_state.json > the framework's defaults."""
    known = {f.name for f in fields(TrainingSetup)} - {"assumed", "source", "rows_from", "prepared_by"}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise InputError(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}.")
    framework = detect_framework(run.config) if run.config else "trl"
    if run.record is not None and not run.config:
        framework = run.record.framework()[0]
    explicit: dict[str, Any] = {}
    for layer in (trainer_state_fields(run.trainer_state), setup_fields(run.training_args, "trl"),
                  setup_fields(run.config, framework, run.config_path),
                  run.record.setup_fields() if run.record is not None else {}):
        explicit.update(layer)
    explicit.update({key: value for key, value in overrides.items() if value is not None})
    values = {**FRAMEWORK_DEFAULTS.get(framework, {}), **explicit, "framework": framework}
    version = _framework_version(run, framework)
    if version is not None:
        values.update(framework_version=version.text, version_source=version.how)
        if framework == "trl" and values.get("collator_masks_pad") is None:
            masks = trl_collator_masks_pad(version, bool(values.get("padding_free")))
            if masks is not None:  # TRL's own collator, as that version builds it
                values["collator_masks_pad"] = explicit["collator_masks_pad"] = masks
    setup = TrainingSetup(**{key: value for key, value in values.items() if key in known})
    setup.source = str(run.config_path) if run.config_path else ("training_args.bin" if run.training_args else None)
    # LLaMA-Factory's own DataArguments fill what its YAML leaves out: its defaults, not assumptions
    setup.assumed = [] if framework == "llamafactory" else [name for name in ASSUMABLE if name not in explicit]
    setup.record = str(run.record.path) if run.record is not None else None
    return setup


def _framework_version(run: RunInfo, framework: str) -> VersionRange | None:
    """The recorded version, else (TRL) the narrowest range the config and training_args.bin leave."""
    if run.record is not None and run.record.framework()[0] == framework and run.record.version_range():
        return run.record.version_range()
    recorded = recorded_version(run.path, run.config, framework)
    if recorded is not None or framework != "trl":
        return recorded
    every = str(run.training_args.get("__class__", "")).endswith("SFTConfig")
    ranges = [r for r in (inferred_trl_version(run.training_args, every_field=every, where="training_args.bin"),
                          inferred_trl_version(run.config, every_field=False,
                                               where=run.config_path.name if run.config_path else "the config"))
              if r is not None]
    if not ranges:
        return None
    lows = [r.low for r in ranges if r.low is not None]
    highs = [r.high for r in ranges if r.high is not None]
    return VersionRange(max(lows) if lows else None, min(highs) if highs else None,
                        "; ".join(r.how for r in ranges if r.how))


# Rendering settings reports say were taken on trust when the run did not record them.
ASSUMABLE = (
    "max_length", "truncation_mode", "completion_only_loss", "assistant_only_loss", "packing", "eos_token",
    "pad_token", "collator_masks_pad",
)
