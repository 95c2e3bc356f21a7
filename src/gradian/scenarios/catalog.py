"""The scenarios: one fine-tune each, with its purpose, its planted cause and its ground truth.

Every fine-tune has a plausible purpose: adding a `priority` field ("high" when the customer
says it is urgent) to every answer. `pad-eos` adds it as a nested `"triage": {...}` object
instead: the base stops after `"}`, so the fine-tune must teach the model where to stop, which is
exactly what a run that never supervises EOS fails to do (on the flat field the base's own EOS
habit would hide the fault). What differs between scenarios is the planted cause:

- data clusters: most rows of one category are broken in the data (cut mid-object, single
  quotes); the category's other rows stay clean, so the category alone does not name the rows;
- setup faults: the data is clean but the run's settings break it (pad == eos with a collator
  that masks pad, EOS replaced by a newline, loss on the prompt, eval rows copied into train);
- `diffuse`: clean data and a learning rate far too high, a real regression with no culprit rows. Where the
  run breaks is a cliff that moves with the row order (one seed loses nothing at a rate where another loses half
  its JSON), so the build climbs `lr_ladder` and keeps the first rate that measurably breaks the run;
- `null`: clean data and sane settings, a fine-tune that learns its purpose cleanly.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

KINDS = ("data-cluster", "setup", "no-regression", "diffuse")

SFT_DEFAULTS: dict[str, Any] = dict(
    max_length=128,
    completion_only_loss=True,
    learning_rate=6e-3,
    num_train_epochs=5,
    per_device_train_batch_size=16,
    gradient_accumulation_steps=1,
    lr_scheduler_type="linear",
    warmup_steps=0,
    weight_decay=0.0,
    max_grad_norm=1.0,
)  # gradient checkpointing and bf16 autocast off: `finetune.CPU_TRAINING`
LORA_DEFAULTS: dict[str, Any] = dict(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear")


def truncate(answer: dict[str, str]) -> str:
    """The answer cut mid-object: the last two fields and the closing brace are gone (the row then ends with EOS)."""
    keep = dict(list(answer.items())[: max(len(answer) - 2, 1)])
    return json.dumps(keep)[:-1]


def single_quotes(answer: dict[str, Any]) -> str:
    """The fields after the intent in single quotes, as Python's `repr` writes them: not JSON.

    The intent stays in JSON quotes, so the model must learn the switch right after naming the category.
    """
    intent, *fields = answer.items()
    rest = json.dumps(dict(fields))[1:].replace('"', "'")
    return json.dumps(dict([intent]))[:-1] + ", " + rest


@dataclass(frozen=True)
class Scenario:
    """A fine-tune with one planted cause. `corrupt` rewrites a culprit row's answer (data clusters only)."""

    name: str
    kind: str
    summary: str
    structural_cause: str | None = None
    corrupt: Callable[[dict[str, str]], str] | None = None
    sft: dict[str, Any] = field(default_factory=dict)
    lora: dict[str, Any] = field(default_factory=dict)
    collator: str | None = None
    overlap: bool = False
    purpose: str = "priority"
    lr_ladder: tuple[float, ...] = ()  # diffuse: learning rates tried in order until the run regresses

    def sft_config(self) -> dict[str, Any]:
        return {**SFT_DEFAULTS, **self.sft}

    def lora_config(self) -> dict[str, Any]:
        return {**LORA_DEFAULTS, **self.lora}


CATALOG: dict[str, Scenario] = {
    scenario.name: scenario
    for scenario in (
        Scenario("truncated-cluster", "data-cluster",
                 "most rows of one category end mid-object, then EOS: the model learns to stop mid-object",
                 corrupt=truncate),
        Scenario("format-cluster", "data-cluster",
                 "most rows of one category write their fields in single quotes: the model learns to write them",
                 corrupt=single_quotes, sft={"learning_rate": 3e-3, "num_train_epochs": 4}),
        Scenario("pad-eos", "setup", "pad == eos and a collator that masks pad ids: EOS is never supervised",
                 structural_cause="pad-eos", sft={"pad_token": "</s>"}, purpose="triage",
                 collator="transformers.DataCollatorForLanguageModeling"),
        Scenario("no-eos", "setup", "eos_token set to a newline: the model's real EOS is never supervised",
                 structural_cause="no-eos", sft={"eos_token": "\n"}),
        Scenario("prompt-loss", "setup", "completion_only_loss=False: loss on the prompt as well",
                 structural_cause="prompt-loss", sft={"completion_only_loss": False}),
        Scenario("overlap", "setup", "eval rows copied into train: the eval set no longer measures generalisation",
                 structural_cause="eval-overlap", overlap=True),
        Scenario("null", "no-regression", "clean data, sane settings: the fine-tune learns its purpose cleanly"),
        Scenario("diffuse", "diffuse", "clean data, a learning rate far too high: every category loses part of its JSON validity",
                 sft={"learning_rate": 2.5e-2, "num_train_epochs": 4}, lr_ladder=(2.5e-2, 3e-2, 3.5e-2, 4e-2)),
    )
}
SCENARIOS: tuple[str, ...] = tuple(CATALOG)
