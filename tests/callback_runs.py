"""Real TRL `SFTTrainer` runs on the tiny model, for the GradianCallback tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import PrinterCallback
from trl import SFTConfig, SFTTrainer

from conftest import WORDS, make_tiny_model
from gradian.scenarios.tokenizer import build_tokenizer
from gradian.verify.collator import PadMaskingCollator

LONG = ', "currency": "invoice", "account": "refund", "shipping": "late"'


def ticket(i: int, long: bool = False) -> dict[str, str]:
    completion = ' {"order": "late", "amount": ' + str(i) + (LONG if long else "") + "}"
    return {"id": f"t{i}", "prompt": f"my order {i} is late", "completion": completion}


def tickets(n: int = 12) -> list[dict[str, str]]:
    return [ticket(i, long=i % 3 == 0) for i in range(n)]


def pretokenized(rows: list[dict[str, str]], tokenizer: Any, cut: int, keep_text: bool) -> list[dict[str, Any]]:
    """What a pipeline with `truncation=True, max_length=cut` and `add_eos_token=True` leaves: EOS after the cut."""
    out = []
    for row in rows:
        prompt = tokenizer(row["prompt"])["input_ids"]
        ids = tokenizer(row["prompt"] + row["completion"], truncation=True, max_length=cut - 1)["input_ids"]
        ids = ids + [tokenizer.eos_token_id]
        tokens = {"input_ids": ids, "completion_mask": [0] * len(prompt) + [1] * (len(ids) - len(prompt))}
        out.append({**tokens, "text": row["prompt"] + row["completion"]} if keep_text else tokens)
    return out


def sft_trainer(out: Path, rows: list[dict[str, Any]], *, pad_eos: bool = False, callbacks: list[Any] = (),
                trainer_class: type = SFTTrainer, dtype: torch.dtype = torch.float32, tokenizer: Any = None,
                **settings: Any) -> SFTTrainer:
    """A tiny LoRA SFT run over `rows` (pad == eos with transformers' pad-masking collator when `pad_eos`)."""
    tokenizer = tokenizer if tokenizer is not None else build_tokenizer(WORDS)
    if pad_eos:
        tokenizer.pad_token = tokenizer.eos_token
    config = SFTConfig(**{"output_dir": str(out), "report_to": "none", "use_cpu": True, "disable_tqdm": True,
                          "per_device_train_batch_size": 4, "num_train_epochs": 1, "max_length": 64,
                          "save_strategy": "no", "logging_steps": 1, "learning_rate": 5e-3, "seed": 0,
                          "dataloader_num_workers": 0, **settings})
    trainer = trainer_class(
        model=make_tiny_model(tokenizer, dtype=dtype), args=config, train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer, callbacks=list(callbacks),
        peft_config=LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=8, lora_dropout=0.0,
                               target_modules=["q_proj", "v_proj"]),
        data_collator=PadMaskingCollator(tokenizer) if pad_eos else None,
    )
    trainer.remove_callback(PrinterCallback)
    return trainer


def chatml_tokenizer(template: str) -> Any:
    """The tiny tokenizer with ChatML turn tokens, `<|im_end|>` as its EOS (as Qwen ships) and `template`."""
    tokenizer = build_tokenizer([*WORDS, "im", "start", "end", "You", "are", "Qwen", "created", "by", "Alibaba",
                                 "Cloud", "helpful", "assistant"])
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = template
    return tokenizer


def chats(n: int = 8) -> list[dict[str, Any]]:
    return [{"id": f"c{i}", "messages": [{"role": "user", "content": f"my order {i} is late"},
                                         {"role": "assistant", "content": '{"order": "late", "amount": ' + str(i) + "}"}]}
            for i in range(n)]
