"""The run's recipe, read back: the LoRA config, the training settings and the seed `verify` retrains with.

Sources, highest first: the training config (a TRL `SFTConfig` YAML/JSON as passed to `trl sft --config`, an
axolotl YAML mapped to the same SFTConfig names, or a LLaMA-Factory YAML's transformers `TrainingArguments`, whose
rows its own code prepares), the fields of `training_args.bin` read without running code
(`data/training_args.py`), `trainer_state.json`, and SFTConfig's own defaults. The LoRA settings come from the
adapter's `adapter_config.json` (what PEFT actually built), else from the config. Every field the run did not
record is named in `defaults` with the value used instead; axolotl keys Gradian cannot map are listed in
`unmapped`. A run Gradian cannot retrain faithfully (another trainer, no recorded settings, a non-LoRA adapter)
raises `InputError` with one sentence.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from gradian.data.config_fields import detect_framework, setup_fields
from gradian.data.llamafactory import installed_version, refuse
from gradian.data.run_folder import RunInfo
from gradian.data.setup import TrainingSetup
from gradian.errors import InputError

# SFTConfig fields read from training_args.bin (which records every field, derived ones included, so only the ones
# that shape training are taken) and the fields a recipe always names, with their default when the run is silent.
TRAINING_FIELDS = (
    "max_length", "truncation_mode", "completion_only_loss", "assistant_only_loss", "packing", "dataset_text_field",
    "eos_token", "pad_token", "learning_rate", "num_train_epochs", "max_steps", "per_device_train_batch_size",
    "gradient_accumulation_steps", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps", "warmup_ratio",
    "weight_decay", "max_grad_norm", "optim", "adam_beta1", "adam_beta2", "adam_epsilon", "bf16", "fp16",
    "gradient_checkpointing", "neftune_noise_alpha", "padding_free", "loss_type", "label_smoothing_factor",
)
# SFTConfig fields that only say where a run logs, saves or runs: they never change the trained weights.
RUN_ONLY = {
    "output_dir", "report_to", "run_name", "project", "disable_tqdm", "use_cpu", "do_train", "do_eval", "do_predict",
    "overwrite_output_dir", "resume_from_checkpoint", "per_device_eval_batch_size", "load_best_model_at_end",
    "metric_for_best_model", "greater_is_better", "local_rank", "deepspeed", "debug", "skip_memory_metrics",
    "seed", "data_seed", "trust_remote_code", "model_init_kwargs", "dataset_num_proc", "prediction_loss_only",
    "include_for_metrics", "batch_eval_metrics", "tf32", "torch_compile", "torch_compile_backend",
    "torch_compile_mode", "use_liger_kernel", "liger_kernel_config", "accelerator_config", "parallelism_config",
}
RUN_ONLY_PREFIXES = ("logging_", "log_", "save_", "eval_", "hub_", "push_to_hub", "ddp_", "fsdp", "dataloader_",
                     "trackio_", "bf16_full", "fp16_full")
# `trl sft --config` keys beside SFTConfig's (ScriptArguments, ModelConfig) and the ones Gradian adds.
TRL_SCRIPT_KEYS = {"model_name_or_path", "dataset_name", "dataset_config", "dataset_train_split", "use_peft",
                   "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "data_collator",
                   "collator_masks_pad", "torch_dtype", "dtype", "attn_implementation", "model_revision"}
# axolotl keys mapped to SFTConfig names here (setup_fields maps sequence_len, train_on_inputs, sample_packing,
# special_tokens, learning_rate, num_epochs, micro_batch_size and gradient_accumulation_steps).
AXOLOTL_NAMES = {"lr_scheduler": "lr_scheduler_type", "warmup_steps": "warmup_steps", "warmup_ratio": "warmup_ratio",
                 "weight_decay": "weight_decay", "max_grad_norm": "max_grad_norm", "optimizer": "optim",
                 "adam_beta1": "adam_beta1", "adam_beta2": "adam_beta2", "adam_epsilon": "adam_epsilon",
                 "bf16": "bf16", "fp16": "fp16", "gradient_checkpointing": "gradient_checkpointing",
                 "max_steps": "max_steps", "neftune_noise_alpha": "neftune_noise_alpha"}
AXOLOTL_SHARED = {"sequence_len", "excess_length_strategy", "train_on_inputs", "datasets", "sample_packing",
                  "special_tokens", "chat_template_jinja", "learning_rate", "num_epochs", "micro_batch_size",
                  "gradient_accumulation_steps", "seed", "base_model", "adapter", "lora_r", "lora_alpha",
                  "lora_dropout", "lora_target_modules", "lora_target_linear", "data_collator", "collator_masks_pad"}
AXOLOTL_IGNORED = {"output_dir", "base_model_config", "model_type", "tokenizer_type", "strict", "logging_steps",
                   "dataset_prepared_path", "flash_attention", "sdp_attention", "xformers_attention", "resume_from_checkpoint",
                   "local_rank", "debug", "deepspeed", "saves_per_epoch", "evals_per_epoch", "save_steps", "eval_steps",
                   "early_stopping_patience", "tf32", "hub_model_id", "save_total_limit", "is_llama_derived_model"}
AXOLOTL_IGNORED_PREFIXES = ("wandb_", "mlflow_", "comet_", "hub_", "save_", "eval_", "logging_")
# The LoRA settings of adapter_config.json that shape what PEFT builds.
LORA_FIELDS = ("r", "lora_alpha", "lora_dropout", "target_modules", "rank_pattern", "alpha_pattern", "use_rslora",
               "use_dora", "bias", "modules_to_save", "layers_to_transform", "exclude_modules", "fan_in_fan_out",
               "init_lora_weights")
# Config keys of a user's own tokenization that no SFTConfig field holds and retrains replay (`retrain.tokenized_as_run`).
REPLAYED = {"add_eos_token"}
# transformers' TrainingArguments among TRAINING_FIELDS (the rest are SFTConfig's own: how TRL prepares rows), less
# gradient_checkpointing, which never changes the weights.
TRAINER_FIELDS = (
    "learning_rate", "num_train_epochs", "max_steps", "per_device_train_batch_size", "gradient_accumulation_steps",
    "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps", "warmup_ratio", "weight_decay", "max_grad_norm",
    "optim", "adam_beta1", "adam_beta2", "adam_epsilon", "bf16", "fp16", "neftune_noise_alpha",
    "label_smoothing_factor")
# LLaMA-Factory keys its retrains follow beside DataArguments and TrainingArguments, or that never change the weights.
LLAMAFACTORY_APPLIED = {"model_name_or_path", "stage", "finetuning_type", "lora_rank", "lora_alpha", "lora_dropout",
                        "lora_target", "trust_remote_code", "plot_loss", "cache_dir", "include_effective_tokens_per_second",
                        "print_param_status", "infer_backend"}
SFT_TRAINERS = ("SFTConfig", "TrainingArguments", "Seq2SeqTrainingArguments")
DEFAULT_SEED = 42  # transformers' TrainingArguments.seed


@dataclass
class Recipe:
    """What `verify` retrains with: SFTConfig keyword arguments, LoraConfig keyword arguments, collator, seed."""

    training: dict[str, Any]
    lora: dict[str, Any]
    seed: int
    collator: str | None = None
    framework: str = "trl"
    sources: dict[str, str] = field(default_factory=dict, metadata={"help": "field → the file it was read from"})
    defaults: dict[str, Any] = field(default_factory=dict, metadata={"help": "fields the run did not record"})
    unmapped: list[str] = field(default_factory=list, metadata={"help": "config keys Gradian could not map"})
    eos_after_truncation: bool = field(default=False, metadata={
        "help": "the run tokenized its rows itself, cutting at max_length and then appending EOS (add_eos_token)"})
    setup: TrainingSetup | None = field(default=None, metadata={
        "help": "a LLaMA-Factory run's settings: its own code prepares the retrains' rows (`retrain.prepared_rows`)"})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_recipe(run: RunInfo, adapter_config: dict[str, Any] | None = None) -> Recipe:
    """The recipe of `run` (from `read_run`); `adapter_config` (adapter_config.json) gives the LoRA settings."""
    _check_trainer(run)
    config = run.config or {}
    framework = detect_framework(config) if config else "trl"
    config_name = str(run.config_path) if run.config_path else "config"
    if framework == "llamafactory" and installed_version() is None:  # its own code prepares the retrains' rows
        raise refuse(config_name, "this is a LLaMA-Factory run")
    if framework == "llamafactory" and (config.get("stage", "sft"), config.get("finetuning_type", "lora")) != ("sft", "lora"):
        raise InputError(f"a LLaMA-Factory run with stage {config.get('stage')!r} and finetuning_type "
                         f"{config.get('finetuning_type', 'lora')!r}; Gradian retrains supervised LoRA runs only "
                         "(stage: sft, finetuning_type: lora).", config_name)
    readers = {"axolotl": _axolotl_training, "llamafactory": _llamafactory_training}
    recorded = _training_args_fields(run.training_args)
    layers: list[tuple[str, dict[str, Any]]] = [
        ("trainer_state.json", _state_fields(run.trainer_state)),
        ("training_args.bin", recorded),
        (config_name, readers[framework](config) if framework in readers else _trl_training(config, run.config_path)),
    ]
    training: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for source, values in layers:
        training.update(values)
        sources.update(dict.fromkeys(values, source))
    if training.get("bf16") == "auto" and isinstance(recorded.get("bf16"), bool):  # what axolotl resolved it to
        training["bf16"], sources["bf16"] = recorded["bf16"], "training_args.bin"
    seed, seed_source = _seed(run, config)
    if seed_source:
        sources["seed"] = seed_source
    lora, lora_source = _lora(adapter_config or run.adapter_config, config, framework, config_name)
    sources.update(dict.fromkeys(lora, lora_source))
    defaults = _defaults(training, framework)
    if seed_source is None:
        defaults["seed"] = seed
    eos_after_cut = framework == "trl" and bool(setup_fields(config, "trl").get("eos_after_truncation"))
    return Recipe(training={**training}, lora=lora, seed=seed, collator=_collator(config), framework=framework,
                  sources=sources, defaults=defaults, unmapped=_unmapped(config, framework),
                  eos_after_truncation=eos_after_cut, setup=run.setup if framework == "llamafactory" else None)


def with_report_evidence(recipe: Recipe, report: dict[str, Any]) -> tuple[Recipe, str | None]:
    """The recipe with what the report's own evidence chose about the rows: where the run's fine-tune showed that
    EOS followed the cut (`run.rendering_evidence.eos_after_cut`, `stages/evidence.py`), the retrains append EOS after
    the cut as the run did, though no setting said so. Returns the recipe and a line saying so, or None."""
    evidence = (report.get("run") or {}).get("rendering_evidence") or {}
    if recipe.eos_after_truncation or not evidence.get("eos_after_cut"):
        return recipe, None
    return replace(recipe, eos_after_truncation=True), (
        "recipe: the report's rendering evidence says EOS followed the cut (the fine-tune learned to stop where the "
        "cut rows end), so the retrains append EOS after the cut as the run did")


def _check_trainer(run: RunInfo) -> None:
    kind = str(run.training_args.get("__class__", "")) if run.training_args else ""
    name = kind.rpartition(".")[2]
    if kind and name not in SFT_TRAINERS:
        raise InputError(f"the run was trained with {name} ({kind}), not supervised fine-tuning; Gradian retrains "
                         "TRL SFTTrainer / transformers Trainer runs only, so it cannot verify this one.",
                         run.path / "training_args.bin" if run.path else None)
    if not run.config and not run.training_args:
        raise InputError("the run records no training settings (no training config, no training_args.bin), so "
                         "Gradian cannot retrain it faithfully; pass --config with the run's SFTConfig or axolotl YAML "
                         "to `attribute`.", run.path)


def _state_fields(state: dict[str, Any] | None) -> dict[str, Any]:
    if not state:
        return {}
    out: dict[str, Any] = {}
    if isinstance(state.get("num_train_epochs"), (int, float)):
        out["num_train_epochs"] = state["num_train_epochs"]
    if isinstance(state.get("train_batch_size"), int):
        out["per_device_train_batch_size"] = state["train_batch_size"]
    return out


def _training_args_fields(args: dict[str, Any]) -> dict[str, Any]:
    out = {name: args[name] for name in TRAINING_FIELDS if name in args}
    if "max_seq_length" in args and "max_length" not in args:
        out["max_length"] = args["max_seq_length"]
    if out.get("warmup_ratio") is None:
        out.pop("warmup_ratio", None)
    return out


def _trl_training(config: dict[str, Any], path: Path | None) -> dict[str, Any]:
    """Every SFTConfig field the config sets (names as SFTConfig spells them), minus where-to-log-and-save ones."""
    from trl import SFTConfig

    known = {f.name for f in dataclasses.fields(SFTConfig)}
    out = {key: value for key, value in config.items() if key in known and not _run_only(key)}
    shared = setup_fields(config, "trl", path)  # validated: max_seq_length → max_length, numbers as numbers
    out.update({key: value for key, value in shared.items() if key in known})
    return out


def _axolotl_training(config: dict[str, Any]) -> dict[str, Any]:
    shared = setup_fields(config, "axolotl")
    out = {key: value for key, value in shared.items() if key in TRAINING_FIELDS and key != "truncation_mode"}
    for key, name in AXOLOTL_NAMES.items():
        if key in config and config[key] is not None:
            out[name] = config[key]
    return out


def _llamafactory_training(config: dict[str, Any]) -> dict[str, Any]:
    """A LLaMA-Factory YAML's training settings: transformers' TrainingArguments names, as SFTConfig spells them.
    Its cutoff_len and train_on_prompt shape the rows its own code prepares, not the trainer's settings."""
    from transformers import TrainingArguments

    known = {f.name for f in dataclasses.fields(TrainingArguments)}
    return {key: value for key, value in config.items() if key in known and not _run_only(key)}


def _run_only(key: str) -> bool:
    return key in RUN_ONLY or key.startswith(RUN_ONLY_PREFIXES)


def _seed(run: RunInfo, config: dict[str, Any]) -> tuple[int, str | None]:
    if isinstance(config.get("seed"), int) and not isinstance(config["seed"], bool):
        return config["seed"], str(run.config_path)
    if isinstance(run.training_args.get("seed"), int):
        return run.training_args["seed"], "training_args.bin"
    return DEFAULT_SEED, None


def _lora(adapter: dict[str, Any], config: dict[str, Any], framework: str, config_name: str
          ) -> tuple[dict[str, Any], str]:
    if adapter:
        kind = adapter.get("peft_type", "LORA")
        if str(kind).upper() != "LORA":
            raise InputError(f"the adapter is {kind}, not LoRA; Gradian retrains LoRA adapters only.",
                             "adapter_config.json")
        lora = {name: adapter[name] for name in LORA_FIELDS if name in adapter and adapter[name] is not None}
        if isinstance(lora.get("target_modules"), list):
            lora["target_modules"] = sorted(lora["target_modules"])
        return lora, "adapter_config.json"
    if framework == "axolotl":
        targets = "all-linear" if config.get("lora_target_linear") else config.get("lora_target_modules")
        if str(config.get("adapter", "lora")).lower() != "lora":
            raise InputError(f"adapter: {config.get('adapter')} is not plain LoRA; Gradian retrains LoRA runs only.",
                             config_name)
    elif framework == "llamafactory":  # its FinetuningArguments: rank 8, alpha twice the rank, every linear layer
        rank, target = config.get("lora_rank", 8), str(config.get("lora_target", "all"))
        return {"r": rank, "lora_alpha": config.get("lora_alpha") or 2 * rank,
                "lora_dropout": config.get("lora_dropout", 0.0),
                "target_modules": "all-linear" if target == "all" else sorted(t.strip() for t in target.split(","))
                }, config_name
    else:
        targets = config.get("lora_target_modules")
    lora = {"r": config.get("lora_r"), "lora_alpha": config.get("lora_alpha"),
            "lora_dropout": config.get("lora_dropout", 0.0), "target_modules": targets}
    missing = [key for key, value in lora.items() if value is None]
    if missing:
        raise InputError(f"no adapter_config.json and the config does not set {', '.join(missing)}; Gradian cannot "
                         "rebuild the LoRA adapter faithfully.", config_name)
    return lora, config_name


def _collator(config: dict[str, Any]) -> str | None:
    name = config.get("data_collator")
    if isinstance(name, str) and name:
        return name
    return "transformers.DataCollatorForLanguageModeling" if config.get("collator_masks_pad") is True else None


def _defaults(training: dict[str, Any], framework: str) -> dict[str, Any]:
    """The recipe fields the run left unset, with the value training will use (SFTConfig's default; a
    LLaMA-Factory run's trainer is transformers' own, so TrainingArguments' defaults there)."""
    from transformers import TrainingArguments
    from trl import SFTConfig

    arguments = TrainingArguments if framework == "llamafactory" else SFTConfig
    defaults = {f.name: f.default for f in dataclasses.fields(arguments) if f.name in TRAINING_FIELDS}
    if framework == "axolotl":
        # axolotl's own: sequence_len 512, no input loss, bf16 where the GPU has it (`resolved_precision`)
        defaults.update(max_length=512, completion_only_loss=True, bf16="auto")
    names = TRAINER_FIELDS if framework == "llamafactory" else TRAINING_FIELDS  # its own code prepares the rows
    missing = {name: defaults.get(name) for name in names if name not in training}
    return {name: value for name, value in missing.items() if value is not dataclasses.MISSING}


def _unmapped(config: dict[str, Any], framework: str) -> list[str]:
    """Config keys that may change training but have no SFTConfig equivalent Gradian applies."""
    if framework == "llamafactory":
        return _llamafactory_unmapped(config)
    if framework == "axolotl":
        known = AXOLOTL_SHARED | set(AXOLOTL_NAMES) | AXOLOTL_IGNORED
        keys = sorted(key for key in config if key not in known and not key.startswith(AXOLOTL_IGNORED_PREFIXES))
        if str(config.get("excess_length_strategy", "drop")).lower() != "truncate":
            keys.append("excess_length_strategy (axolotl drops rows longer than sequence_len; TRL truncates them)")
        return keys
    from trl import SFTConfig

    known = {f.name for f in dataclasses.fields(SFTConfig)} | TRL_SCRIPT_KEYS | REPLAYED
    return sorted(key for key in config if key not in known)


def _llamafactory_unmapped(config: dict[str, Any]) -> list[str]:
    """A LLaMA-Factory YAML's keys that neither its own data code (DataArguments: the retrains' rows), transformers'
    TrainingArguments nor the LoRA settings apply: its model and fine-tuning options (quantization, DoRA, PiSSA,
    LoRA+...) and keys it does not know."""
    from llamafactory.hparams import DataArguments
    from transformers import TrainingArguments

    applied = {f.name for arguments in (DataArguments, TrainingArguments) for f in dataclasses.fields(arguments)}
    return sorted(key for key in config if key not in applied | LLAMAFACTORY_APPLIED and not _run_only(key))


def resolved_precision(settings: dict[str, Any], device: str) -> dict[str, Any]:
    """`settings` with axolotl's `bf16: auto` resolved where the retrain runs, by axolotl's own `resolve_dtype` where
    axolotl is installed and by `_resolve_dtype` elsewhere. SFTConfig would take the string "auto" as true and
    autocast to bf16 on any device, a CPU without bf16 units included."""
    if settings.get("bf16") != "auto":
        return settings
    try:
        from axolotl.utils.config import resolve_dtype
        from axolotl.utils.dict import DictDefault
    except ImportError:
        bf16, fp16 = _resolve_dtype("auto", settings.get("fp16"))
    else:
        cfg = DictDefault({"bf16": "auto", "fp16": settings.get("fp16"), "device": device})
        resolve_dtype(cfg)
        bf16, fp16 = cfg.bf16, cfg.fp16
    return {**settings, "bf16": bf16, **({} if fp16 is None else {"fp16": fp16})}


def _resolve_dtype(bf16: Any, fp16: bool | None) -> tuple[Any, bool | None]:
    """axolotl 0.19's `resolve_dtype` on bf16 and fp16 (pinned against it where axolotl is installed): `auto` is bf16
    where a GPU supports it, else fp16 unless the config set it; an fp16 run never autocasts to bf16."""
    from transformers.utils import is_torch_bf16_gpu_available

    if not fp16 and bf16 == "auto":
        bf16 = is_torch_bf16_gpu_available()
        if not bf16 and fp16 is None:
            fp16 = True
    if fp16 and bf16 == "auto":
        bf16 = False
    if bf16:
        fp16 = False
    return bf16, fp16


def training_kwargs(recipe: Recipe) -> dict[str, Any]:
    """SFTConfig keyword arguments: the recorded fields, plus axolotl's defaults where an axolotl run was silent, and
    every TrainingArguments default where a LLaMA-Factory run was (SFTConfig's own differ: learning rate, bf16)."""
    extra: dict[str, Any] = {}
    if recipe.framework == "axolotl":
        extra = {k: v for k, v in recipe.defaults.items() if k in ("max_length", "completion_only_loss", "bf16")}
    elif recipe.framework == "llamafactory":
        extra = {k: v for k, v in recipe.defaults.items() if k in TRAINER_FIELDS}  # not the seed: set apart
    return {**extra, **recipe.training}
