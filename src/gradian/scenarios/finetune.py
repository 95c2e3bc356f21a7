"""The scenario fine-tune: a real TRL `SFTTrainer` + PEFT LoRA run, leaving a real run folder.

The folder holds what users bring to Gradian: the adapter at its root, `trainer_state.json`
with `log_history`, `checkpoint-*/` with optimizer state, and `sft_config.yaml`, the SFTConfig
fields the run used (plus `data_collator` when a custom collator replaced TRL's).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import datasets
import torch
import yaml
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoTokenizer, LlamaForCausalLM, PrinterCallback, TrainerCallback
from trl import SFTConfig, SFTTrainer

from gradian.verify.collator import PadMaskingCollator

PAD_MASKING_COLLATOR = "transformers.DataCollatorForLanguageModeling"
ROW_ONLY = {"id", "category"}  # the rows' bookkeeping, not training text
# Settings of the user's own pipeline that SFTConfig has no field for (it tokenized the rows itself): recorded in
# sft_config.yaml, as the user's config would say them, never passed to SFTConfig.
PIPELINE_ONLY = {"add_eos_token"}
# TRL turns gradient checkpointing and bf16 autocast on by default, on a CPU too. These runs train on one (`use_cpu`):
# checkpointing runs each forward again in the backward (the tiny builds took 1.4x, the same weights to the bit), and
# autocast on a CPU without bf16 units made a SmolLM2-shaped step 23.5x slower (BENCHMARKS.md, "TRL's bf16 autocast
# on a CPU"). A recipe may still set either; sft_config.yaml records what ran, so verify's retrains replay it.
CPU_TRAINING: dict[str, Any] = {"gradient_checkpointing": False, "bf16": False}
RUN_ONLY = {"output_dir", "report_to", "save_strategy", "logging_steps", "seed", "use_cpu", "disable_tqdm",
            "dataloader_num_workers"}


def train_lora(base_dir: Path, rows: list[dict[str, str]], run_dir: Path, sft: dict[str, Any],
               lora: dict[str, Any], collator: str | None = None, seed: int = 0,
               callbacks: Sequence[TrainerCallback] = ()) -> None:
    """Fine-tune `base_dir` with LoRA on prompt/completion (or `messages`) `rows`; write the run folder to `run_dir`.
    `callbacks` join the trainer's (a `GradianCallback(capture=True)` to capture the run's gradients)."""
    sft = {**CPU_TRAINING, **sft}
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    if sft.get("pad_token"):
        tokenizer.pad_token = sft["pad_token"]
    model = LlamaForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    config = SFTConfig(**{"output_dir": str(run_dir), "report_to": "none", "save_strategy": "epoch",
                          "logging_steps": 5, "seed": seed, "use_cpu": True, "disable_tqdm": True,
                          "dataloader_num_workers": 0,
                          **{k: v for k, v in sft.items() if k not in PIPELINE_ONLY}})
    bars_were_on = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # library code draws no bars; TRL's dataset preparation would
    trainer = SFTTrainer(
        model=model,
        args=config,
        train_dataset=Dataset.from_list([{k: v for k, v in r.items() if k not in ROW_ONLY} for r in rows]),
        processing_class=tokenizer,
        peft_config=LoraConfig(task_type="CAUSAL_LM", **lora),
        data_collator=PadMaskingCollator(tokenizer) if collator == PAD_MASKING_COLLATOR else None,
        callbacks=list(callbacks),
    )
    if bars_were_on:
        datasets.enable_progress_bars()
    trainer.remove_callback(PrinterCallback)  # library code stays quiet; the log lives in trainer_state.json
    trainer.train()
    trainer.save_model(str(run_dir))
    trainer.save_state()
    _write_config(run_dir, sft, lora, collator)


def recorded_recipe(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any], str | None]:
    """(sft, lora, collator) as `train_lora` took them, read back from the `sft_config.yaml` `_write_config` wrote
    (the run-only fields it leaves out stay out)."""
    config = yaml.safe_load((run_dir / "sft_config.yaml").read_text())
    lora = {"r": config.pop("lora_r"), "lora_alpha": config.pop("lora_alpha"),
            "lora_dropout": config.pop("lora_dropout"), "target_modules": config.pop("lora_target_modules")}
    collator = config.pop("data_collator", None)
    config.pop("use_peft", None)
    return config, lora, collator


def _write_config(run_dir: Path, sft: dict[str, Any], lora: dict[str, Any], collator: str | None) -> None:
    """`sft_config.yaml` as passed to `trl sft --config`: SFTConfig field names plus the LoRA settings."""
    config = {key: value for key, value in sft.items() if key not in RUN_ONLY}
    config.update(use_peft=True, lora_r=lora["r"], lora_alpha=lora["lora_alpha"],
                  lora_dropout=lora.get("lora_dropout", 0.0), lora_target_modules=lora["target_modules"])
    if collator:
        config["data_collator"] = collator
    (run_dir / "sft_config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
