"""A training config's settings, by each framework's own names: the `TrainingSetup` fields a TRL `SFTConfig`
(or training_args.bin), an axolotl YAML or trainer_state.json sets, and the collator a config names.

`data.run_folder` layers these (flags > config file > training_args.bin > trainer_state.json > defaults).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from gradian.data.axolotl import NAMED_TEMPLATES
from gradian.data.llamafactory import llamafactory_config
from gradian.errors import InputError

# axolotl v0.18: sequence_len 512, excess_length_strategy drop, train_on_inputs false, collators pad labels with -100.
FRAMEWORK_DEFAULTS: dict[str, dict[str, Any]] = {
    "axolotl": {"max_length": 512, "drop_overlong": True, "completion_only_loss": True, "collator_masks_pad": False},
    # LLaMA-Factory 0.9: cutoff_len 2048, train_on_prompt false, its SFT collator pads labels with -100 by position.
    "llamafactory": {"max_length": 2048, "completion_only_loss": True, "collator_masks_pad": False},
}
AXOLOTL_KEYS = {"sequence_len", "train_on_inputs", "micro_batch_size", "num_epochs", "sample_packing",
                "excess_length_strategy", "lora_r", "adapter", "base_model", "datasets"}
# What data/axolotl.py reads from an axolotl config besides the TrainingSetup fields.
AXOLOTL_RENDER_KEYS = ("datasets", "train_on_inputs", "chat_template", "chat_template_jinja", "eot_tokens")
# Collators that set the labels of pad ids to -100 (so pad == eos hides every EOS); TRL's own pads by position.
PAD_MASKING_COLLATORS = ("DataCollatorForLanguageModeling", "DataCollatorForCompletionOnlyLM")
POSITION_PADDING_COLLATORS = ("DataCollatorForSeq2Seq", "DataCollatorWithFlattening", "DataCollatorForChatML")


def detect_framework(config: dict[str, Any]) -> str:
    """`llamafactory` or `axolotl` when the config uses their keys, else `trl` (SFTConfig / TrainingArguments
    names)."""
    if llamafactory_config(config):
        return "llamafactory"
    hits = AXOLOTL_KEYS & set(config)
    return "axolotl" if len(hits) >= 2 or "sequence_len" in hits or "train_on_inputs" in hits else "trl"


def setup_fields(config: dict[str, Any], framework: str, path: Path | None = None) -> dict[str, Any]:
    """The `TrainingSetup` fields a config (or training_args.bin) sets explicitly, by the framework's names."""
    if not config:
        return {}
    try:
        fields_of = {"axolotl": _axolotl_fields, "llamafactory": _llamafactory_fields}.get(framework)
        out = fields_of(config) if fields_of is not None else _trl_fields(config, path)
    except (TypeError, ValueError, OverflowError) as error:
        raise InputError(f"holds a setting Gradian cannot use ({error}); fix it.", path or "training_args.bin") from None
    if out.get("packing_strategy") not in (None, "bfd", "bfd_split", "wrapped"):
        raise InputError(f"packing_strategy {out['packing_strategy']!r} is not bfd, bfd_split or wrapped.",
                         path or "training_args.bin")
    if out.get("truncation_mode") not in (None, "keep_start", "keep_end"):
        raise InputError(f"truncation_mode {out['truncation_mode']!r} is not keep_start or keep_end.",
                         path or "training_args.bin")
    collator = _collator_masks_pad(config)
    if collator is not None:
        out["collator_masks_pad"] = collator
    return out


def _trl_fields(config: dict[str, Any], path: Path | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for old, new in (("max_seq_length", "max_length"), ("max_length", "max_length")):
        if old in config:
            out[new] = _length_or_none(config[old], old)
    for name in ("truncation_mode", "dataset_text_field"):
        if isinstance(config.get(name), str):
            out[name] = config[name]
    strategy = config.get("packing_strategy")
    if isinstance(strategy, str):  # TRL's old name for bfd_split
        out["packing_strategy"] = "bfd_split" if strategy == "bfd-requeue" else strategy
    for name in ("eos_token", "pad_token"):  # None is a recorded choice: the tokenizer's token
        if name in config and (config[name] is None or isinstance(config[name], str)):
            out[name] = config[name]
    for name in ("completion_only_loss", "assistant_only_loss", "packing", "padding_free"):
        if name in config and (config[name] is None or isinstance(config[name], bool)):
            out[name] = config[name]
    if isinstance(config.get("add_eos_token"), bool):  # the user's own tokenization appends EOS after truncating
        out["eos_after_truncation"] = config["add_eos_token"]
    out.update(_numbers(config, {"learning_rate": "learning_rate", "num_train_epochs": "num_train_epochs",
                                 "per_device_train_batch_size": "per_device_train_batch_size",
                                 "gradient_accumulation_steps": "gradient_accumulation_steps"}))
    template = config.get("chat_template_path")
    if isinstance(template, str) and path is not None:
        out.update(_chat_template_file(path.parent / template))
    return out


def _axolotl_fields(config: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"truncation_mode": "keep_start"}
    if "sequence_len" in config:
        out["max_length"] = _length_or_none(config["sequence_len"], "sequence_len")
    if config.get("excess_length_strategy") is not None:
        strategy = str(config["excess_length_strategy"]).lower()
        if strategy not in ("drop", "truncate", "raise"):
            raise ValueError(f"excess_length_strategy {strategy!r} is not drop, truncate or raise")
        out["excess_length_strategy"], out["drop_overlong"] = strategy, strategy != "truncate"
    if "train_on_inputs" in config:
        out["completion_only_loss"] = not bool(config["train_on_inputs"])
    datasets = config.get("datasets") or []
    if not isinstance(datasets, list):
        raise ValueError("datasets must be a list of {path, type} entries")
    if any(isinstance(d, dict) and d.get("type") == "chat_template" for d in datasets):
        out["assistant_only_loss"] = not bool(config.get("train_on_inputs", False))
    if "sample_packing" in config:
        out["packing"] = bool(config["sample_packing"])
    tokens = config.get("special_tokens") or {}
    if not isinstance(tokens, dict):
        raise ValueError("special_tokens must be a mapping such as {pad_token: <|end_of_text|>}")
    for name in ("eos_token", "pad_token"):
        if isinstance(tokens.get(name), str):
            out[name] = tokens[name]
    out["special_tokens"] = {k: v for k, v in tokens.items() if isinstance(v, (str, list))}
    if isinstance(config.get("tokens"), list):
        out["new_tokens"] = [str(token) for token in config["tokens"]]
    out["axolotl"] = {key: config[key] for key in AXOLOTL_RENDER_KEYS if config.get(key) is not None}
    if isinstance(config.get("chat_template_jinja"), str):
        out["chat_template"] = config["chat_template_jinja"]
    elif config.get("chat_template") in NAMED_TEMPLATES:  # what generation prompts are rendered with
        out["chat_template"] = NAMED_TEMPLATES[config["chat_template"]]
    out.update(_numbers(config, {"learning_rate": "learning_rate", "num_epochs": "num_train_epochs",
                                 "micro_batch_size": "per_device_train_batch_size",
                                 "gradient_accumulation_steps": "gradient_accumulation_steps"}))
    return out


def _llamafactory_fields(config: dict[str, Any]) -> dict[str, Any]:
    """What the report shows of a LLaMA-Factory YAML; its rows are prepared from the whole YAML by its own
    `DataArguments` (`data.llamafactory_code`)."""
    # the YAML but its hub tokens (hf_hub_token...): it is shown in the report
    out: dict[str, Any] = {"llamafactory": {key: value for key, value in config.items() if not key.endswith("_token")}}
    if "cutoff_len" in config:
        out["max_length"] = _length_or_none(config["cutoff_len"], "cutoff_len")
    if "train_on_prompt" in config:
        out["completion_only_loss"] = not bool(config["train_on_prompt"])
    if isinstance(config.get("packing"), bool):
        out["packing"] = config["packing"]
    out.update(_numbers(config, {"learning_rate": "learning_rate", "num_train_epochs": "num_train_epochs",
                                 "per_device_train_batch_size": "per_device_train_batch_size",
                                 "gradient_accumulation_steps": "gradient_accumulation_steps"}))
    return out


def _collator_masks_pad(config: dict[str, Any]) -> bool | None:
    if isinstance(config.get("collator_masks_pad"), bool):
        return config["collator_masks_pad"]
    name = config.get("data_collator")
    if not isinstance(name, str) or not name:
        return None
    module, _, cls = name.rpartition(".")
    if cls == "DataCollatorForLanguageModeling" and module.startswith("trl"):
        return False  # TRL's SFT collator pads labels with -100 by position (TRL >= 0.17)
    if cls in PAD_MASKING_COLLATORS:
        return True
    return False if cls in POSITION_PADDING_COLLATORS else None


def _numbers(config: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, name in names.items():
        value = config.get(key)
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            try:
                number = float(value)
            except ValueError:
                continue
            if not math.isfinite(number):
                raise ValueError(f"{key} must be a finite number, found {value!r}")
            out[name] = number if name in ("learning_rate", "num_train_epochs") else int(number)
    return out


def _length_or_none(value: Any, name: str) -> int | None:
    """A token length (a whole number ≥ 1), or None; raises ValueError for text, infinities, fractions, zero and
    negatives (the caller names the file)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value != int(value) \
            or value < 1:
        raise ValueError(f"{name} is {value!r}, where a positive whole number belongs")
    return int(value)


def _chat_template_file(path: Path) -> dict[str, Any]:
    if path.is_file() and path.suffix in (".jinja", ".j2", ".txt"):
        try:
            return {"chat_template": path.read_text(encoding="utf-8")}
        except UnicodeDecodeError:
            raise InputError("is not UTF-8 text; re-encode the chat template as UTF-8.", path) from None
    return {}


def trainer_state_fields(state: dict[str, Any] | None) -> dict[str, Any]:
    if not state:
        return {}
    out: dict[str, Any] = {}
    if isinstance(state.get("num_train_epochs"), (int, float)):
        out["num_train_epochs"] = float(state["num_train_epochs"])
    if isinstance(state.get("train_batch_size"), int):
        out["per_device_train_batch_size"] = state["train_batch_size"]
    return out
