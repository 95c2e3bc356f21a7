"""How the run turned rows into tokens: the settings rendering depends on.

Defaults are TRL `SFTConfig`'s (the framework most LoRA runs use). `assumed` names every field
that was not read from the run, so reports can say which defaults were taken on trust.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class TrainingSetup:
    framework: str = field(default="trl", metadata={"help": "trl | axolotl | transformers"})
    framework_version: str | None = field(
        default=None, metadata={"help": "the framework's version: exact (0.19.1) or a range (>=0.17,<0.20); None unknown"}
    )
    version_source: str | None = field(default=None, metadata={"help": "how the version was known: recorded or inferred"})
    max_length: int | None = field(default=1024, metadata={"help": "tokens per row after truncation; None = none"})
    truncation_mode: str = field(default="keep_start", metadata={"help": "keep_start | keep_end"})
    completion_only_loss: bool | None = field(
        default=None, metadata={"help": "None: completion-only for prompt/completion rows, full loss for text"}
    )
    assistant_only_loss: bool = field(default=False, metadata={"help": "loss only on assistant turns (messages)"})
    drop_overlong: bool = field(default=False, metadata={"help": "rows longer than max_length are dropped (axolotl)"})
    excess_length_strategy: str | None = field(
        default=None, metadata={"help": "axolotl: drop (default) | truncate | raise, for rows past sequence_len"}
    )
    eos_after_truncation: bool = field(
        default=False,
        metadata={"help": "the pipeline cuts at max_length, then appends EOS (add_eos_token=True with truncation): "
                          "a cut row still ends in a supervised EOS"},
    )
    packing: bool = False
    padding_free: bool = field(default=False, metadata={"help": "rows flattened into one sequence, no pad tokens"})
    dataset_text_field: str = "text"
    eos_token: str | None = field(default=None, metadata={"help": "None: the tokenizer's"})
    pad_token: str | None = field(default=None, metadata={"help": "None: the tokenizer's, else eos"})
    collator_masks_pad: bool | None = field(
        default=None,
        metadata={"help": "the collator sets labels of pad ids to -100 (transformers' LM collator, TRL < 0.17); "
                          "None: unknown. Inferred from framework_version when the config names no collator"},
    )
    chat_template: str | None = None
    special_tokens: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "axolotl special_tokens: added to the tokenizer as axolotl adds them"}
    )
    new_tokens: list[str] = field(default_factory=list, metadata={"help": "axolotl tokens: added as regular tokens"})
    axolotl: dict[str, Any] = field(
        default_factory=dict,
        metadata={"help": "axolotl's datasets entries and prompt settings (train_on_inputs, chat_template, eot_tokens)"},
    )
    learning_rate: float | None = None
    num_train_epochs: float | None = None
    per_device_train_batch_size: int | None = None
    gradient_accumulation_steps: int | None = None
    source: str | None = field(default=None, metadata={"help": "the file the settings were read from"})
    record: str | None = field(
        default=None, metadata={"help": "the gradian_run.json (GradianCallback's run record) read first, if any"}
    )
    rows_from: str = field(
        default="render",
        metadata={"help": "where the audited rows came from: record (the trainer's own, recorded by GradianCallback), "
                          "render (Gradian's renderer), record+render (some of each), trainer (preflight)"},
    )
    assumed: list[str] = field(default_factory=list, metadata={"help": "fields taken from framework defaults"})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# The trainer that prepares each framework's rows, as a report names it: (package, class) around the version.
TRAINERS = {"trl": ("TRL", "SFTTrainer"), "axolotl": ("axolotl", ""), "transformers": ("transformers", "Trainer")}


def trainer_name(framework: str, version: str | None = None) -> str:
    """`TRL 0.19.1 SFTTrainer`, `TRL SFTTrainer >=0.17,<0.20` (a range), `axolotl 0.18.0`, `TRL SFTTrainer`."""
    package, kind = TRAINERS.get(framework, (framework, ""))
    if version and version[0].isdigit():
        return " ".join(part for part in (package, version, kind) if part)
    return " ".join(part for part in (package, kind, version) if part)


def preparation(setup: TrainingSetup, *, trainer_code: bool = False) -> dict[str, Any]:
    """Which preparation produced the rows Gradian audited and attributed, and whose code ran it.

    `trainer_code`: the rows are the running trainer's own (GradianCallback's preflight: its tokenized dataset, its
    collator's labels); else Gradian rendered them with its port of TRL's `SFTTrainer` preparation or of axolotl's
    (`data.render`, `data.axolotl`). Under a plain transformers `Trainer` the port is TRL's: that trainer prepares
    no rows itself (the run's own script did), and the text says so.
    """
    version = setup.framework_version
    trainer = trainer_name(setup.framework)
    if trainer_code:
        text = (f"rows as recorded by GradianCallback: the running {trainer_name(setup.framework, version)}'s own "
                "tokens and collator labels")
    else:
        ported = setup.framework if setup.framework in ("trl", "axolotl") else "trl"
        notes = ["Gradian's port"]
        if ported == setup.framework and not version:
            notes.append(f"{TRAINERS[ported][0]} version unknown")
        if setup.record:
            notes.append("with the settings GradianCallback recorded")
        text = (f"rows as {trainer_name(ported, version if ported == setup.framework else None)} prepares them "
                f"({', '.join(notes)})")
        if ported != setup.framework:
            text += f"; the run trained with {trainer_name(setup.framework, version)} on rows its own script prepared"
    return {"trainer": trainer, "version": version, "code": "trainer" if trainer_code else "gradian-port",
            "text": text}
