"""How the run turned rows into tokens: the settings rendering depends on.

Defaults are TRL `SFTConfig`'s (the framework most LoRA runs use). `assumed` names every field
that was not read from the run, so reports can say which defaults were taken on trust.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class TrainingSetup:
    framework: str = field(default="trl", metadata={"help": "trl | axolotl | llamafactory | transformers | openai"})
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
    packing_strategy: str = field(
        default="bfd",
        metadata={"help": "TRL packing: bfd (rows kept whole, over-long rows cut at max_length) | bfd_split (their "
                          "overflow trained as rows of its own) | wrapped (blocks cut across rows)"})
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
    llamafactory: dict[str, Any] = field(
        default_factory=dict,
        metadata={"help": "a LLaMA-Factory run's YAML, read by its own DataArguments (template, cutoff_len, dataset...)"},
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
    prepared_by: dict[str, Any] | None = field(
        default=None,
        metadata={"help": "whose code prepared the rendered rows (`data.trl_prepare.Preparation`): rows by TRL's own "
                          "code, rows by the fast path checked against it, rows by Gradian's port and why; None "
                          "before rendering"},
    )
    assumed: list[str] = field(default_factory=list, metadata={"help": "fields taken from framework defaults"})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# The trainer that prepares each framework's rows, as a report names it: (package, class) around the version.
TRAINERS = {"trl": ("TRL", "SFTTrainer"), "axolotl": ("axolotl", ""), "llamafactory": ("LLaMA-Factory", ""),
            "transformers": ("transformers", "Trainer"), "openai": ("OpenAI fine-tuning", "")}


ROW_COUNTS = ("trainer_rows", "cached_rows", "checked_rows", "port_rows", "guessed")  # `Preparation`'s counts


def trainer_name(framework: str, version: str | None = None) -> str:
    """`TRL 0.19.1 SFTTrainer`, `TRL SFTTrainer >=0.17,<0.20` (a range), `axolotl 0.18.0`, `TRL SFTTrainer`."""
    package, kind = TRAINERS.get(framework, (framework, ""))
    if version and version[0].isdigit():
        return " ".join(part for part in (package, version, kind) if part)
    return " ".join(part for part in (package, kind, version) if part)


def preparation(setup: TrainingSetup, *, trainer_code: bool = False) -> dict[str, Any]:
    """Which preparation produced the rows Gradian audited and attributed, and whose code ran it.

    `trainer_code`: the rows are the running trainer's own (GradianCallback's preflight: its tokenized dataset, its
    collator's labels). Else `setup.prepared_by` says what rendering did: TRL's own `SFTTrainer` preparation
    (`data.trl_prepare`), axolotl's own prompt strategies where axolotl is installed beside Gradian
    (`data.axolotl_code`), or Gradian's port (axolotl's where it is not; TRL's where TRL's code refused rows).
    Under a plain transformers `Trainer` the rows are TRL's: that trainer prepares no rows itself (the run's own
    script did), and the text says so.
    """
    version = setup.framework_version
    trainer = trainer_name(setup.framework)
    if trainer_code or setup.rows_from == "record":
        text = (f"rows as recorded by GradianCallback: the running {trainer_name(setup.framework, version)}'s own "
                "tokens and collator labels")
        return {"trainer": trainer, "version": version, "code": "trainer", "text": text}
    prepared = setup.prepared_by or {}
    if setup.framework == "openai":  # no trainer code to run: the service's is not public
        text = ("rows as OpenAI fine-tuning trains them, by Gradian's reading (the data file carries OpenAI's "
                "`weight` key and no run folder or config came with it): loss on every assistant turn whose weight "
                "is not 0, tokens by the chat template Gradian has, as OpenAI's tokenizer is not public")
        return {"trainer": trainer, "version": None, "code": "gradian-port", "text": text,
                "rows": {key: prepared.get(key, 0) for key in ROW_COUNTS}}
    by_trl = prepared.get("trainer_rows", 0) + prepared.get("checked_rows", 0)
    if setup.framework == "llamafactory":  # its own code always: without it the run is refused (`data.llamafactory`)
        installed = prepared.get("llamafactory_version")
        text = (f"rows as LLaMA-Factory prepares them (LLaMA-Factory {installed}'s own data arguments, template, "
                "dataset converter and supervised processor"
                + (f"; {prepared['cached_rows']} rows read back from Gradian's cache of its output"
                   if prepared.get("cached_rows") else "")
                + (f"; {'; '.join(prepared['why'])}" if prepared.get("why") else "")
                + (f"; the run used LLaMA-Factory {version}" if version and version != installed else "") + ")")
        return {"trainer": trainer, "version": version or installed, "code": "trainer", "text": text,
                "rows": {key: prepared.get(key, 0) for key in ROW_COUNTS}}
    ported = setup.framework if setup.framework in ("trl", "axolotl") else "trl"
    notes = []
    if by_trl:
        installed = prepared.get("axolotl_version") or prepared.get("trl_version")
        if prepared.get("axolotl_version"):
            notes.append(f"axolotl {installed}'s own config loader and prompt strategies")
        else:
            notes.append(f"TRL {installed}'s own code" if installed else "TRL's own code")
        if prepared.get("cached_rows"):
            notes.append(f"{prepared['cached_rows']} rows read back from Gradian's cache of TRL's output")
        if prepared.get("checked_rows"):
            notes.append("string rows by Gradian's batched tokenization, checked equal to TRL's on their first rows")
        if ported == setup.framework and version and version != installed:
            notes.append(f"the run used {TRAINERS[ported][0]} {version}")
    if prepared.get("port_rows") or not by_trl:
        port = f"{prepared['port_rows']} rows by Gradian's port" if by_trl else "Gradian's port"
        notes.append(port + (f" ({'; '.join(prepared['why'])})" if prepared.get("why") else ""))
    if ported == setup.framework and not version:
        notes.append(f"the run's {TRAINERS[ported][0]} version unknown" if by_trl else
                     f"{TRAINERS[ported][0]} version unknown")
    if prepared.get("guessed"):
        notes.append(f"{prepared['guessed']} rows of a shape TRL does not read (Alpaca or similar) read as "
                     "prompt/completion: a guess at the run's formatting")
    if setup.record:
        notes.append("with the settings GradianCallback recorded")
    text = (f"rows as {trainer_name(ported, version if ported == setup.framework else None)} prepares them "
            f"({', '.join(notes)})")
    if ported != setup.framework:
        text += f"; the run trained with {trainer_name(setup.framework, version)} on rows its own script prepared"
    code = "gradian-port" if not by_trl else "trainer+port" if prepared.get("port_rows") else "trainer"
    return {"trainer": trainer, "version": version, "code": code, "text": text,
            "rows": {key: prepared.get(key, 0) for key in ROW_COUNTS}}
