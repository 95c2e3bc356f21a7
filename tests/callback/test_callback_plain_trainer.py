"""GradianCallback in a plain transformers `Trainer`: it finds the tokenizer wherever the trainer keeps it (here only
inside `DataCollatorForLanguageModeling`) and runs its preflight on the trainer's own rows."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from datasets import Dataset
from peft import LoraConfig, get_peft_model
from transformers import DataCollatorForLanguageModeling, PrinterCallback, Trainer, TrainingArguments

from callback_runs import tickets
from conftest import WORDS, make_tiny_model
from gradian import GradianCallback
from gradian.callback import PreflightError
from gradian.scenarios.tokenizer import build_tokenizer


def plain_trainer(out, callback: GradianCallback, pad_eos: bool = True) -> Trainer:
    """A tiny LoRA run in a plain `Trainer`, the tokenizer handed only to the collator (mlm=False); pad == eos when
    `pad_eos`."""
    tokenizer = build_tokenizer(WORDS)
    if pad_eos:
        tokenizer.pad_token = tokenizer.eos_token
    rows = [{"input_ids": tokenizer(r["prompt"] + r["completion"])["input_ids"] + [tokenizer.eos_token_id]}
            for r in tickets()]
    model = get_peft_model(make_tiny_model(tokenizer), LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=8,
                                                                  target_modules=["q_proj", "v_proj"]))
    args = TrainingArguments(output_dir=str(out), report_to="none", use_cpu=True, disable_tqdm=True,
                             per_device_train_batch_size=4, num_train_epochs=1, save_strategy="no",
                             learning_rate=5e-3, seed=0, dataloader_num_workers=0)
    trainer = Trainer(model=model, args=args, train_dataset=Dataset.from_list(rows), callbacks=[callback],
                      data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False))
    trainer.remove_callback(PrinterCallback)
    return trainer


def test_tokenizer_only_in_the_collator_still_stops_a_pad_eos_run(tmp_path):
    lines: list[str] = []
    callback = GradianCallback(echo=lines.append)
    trainer = plain_trainer(tmp_path, callback)
    assert trainer.processing_class is None
    with pytest.raises(PreflightError) as stopped:
        trainer.train()
    assert str(stopped.value).startswith("Gradian preflight stopped training before step one: pad == eos ('</s>') "
                                         "and the collator masks pad ids: EOS is masked in 12 of 12 rows")
    assert trainer.state.global_step == 0
    lora_b = [p for name, p in trainer.model.named_parameters() if "lora_B" in name]
    assert lora_b and all(torch.count_nonzero(w) == 0 for w in lora_b)  # no optimizer step ran
    assert not any("preflight and record skipped" in line for line in lines)
    assert callback.result.preparation["text"] == (f"rows as recorded by GradianCallback: the running transformers "
                                                   f"{transformers.__version__} Trainer's own tokens and collator "
                                                   "labels")


def test_tokenizer_only_in_the_collator_is_recorded_on_a_clean_run(tmp_path):
    callback = GradianCallback(echo=lambda _: None)
    trainer = plain_trainer(tmp_path, callback, pad_eos=False)
    trainer.train()
    assert trainer.state.global_step == 3 and callback.result is not None and not callback.result.critical
    record = json.loads((tmp_path / "gradian_run.json").read_text(encoding="utf-8"))
    assert record["tokenizer"]["pad"] == {"token": "<pad>", "id": 0}
    assert record["collator"]["class"] == "transformers.data.data_collator.DataCollatorForLanguageModeling"
    assert len(record["steps"]) == 3
