"""Rows as TRL's SFTTrainer prepares them, by TRL's own code: `SFTTrainer._prepare_dataset` run on the dataset's rows.

TRL is a dependency, so a TRL run's rows come from the trainer's preparation itself rather than a copy of it: the
training-template swap for `assistant_only_loss` with a stock template, the `tools` column, per-row
`chat_template_kwargs`, ShareGPT keys renamed with their roles kept, EOS appended to string rows. TRL is run
untruncated (no max_length, no packing, no shuffle): `data.render` then cuts each row at the run's max_length as
TRL does, so it knows what the cut removed.

Each row goes to TRL with the columns it reads (`TRL_COLUMNS` and the run's text field) as the dataset file holds
them; a row of a shape TRL does not read (Alpaca, axolotl's segments, turns under another key) goes in Gradian's
reading of it (`Example.fields`), and `Preparation.guessed` counts those.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import logging
from collections.abc import Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any
from unittest import mock

from gradian.data import rows_cache
from gradian.data.examples import Example
from gradian.data.setup import TrainingSetup

IGNORE = -100  # a label that carries no loss (transformers' and TRL's); `data.render` exports it
TRL_COLUMNS = ("prompt", "completion", "messages", "conversations", "tools", "chat_template_kwargs")
SHAPES = ("prompt", "messages", "conversations")  # a raw row with one of these (or the text field) is TRL's shape


class TrlCannotPrepare(Exception):
    """TRL's own preparation refused the rows (its reason in the message); the run could not have trained them so."""


@dataclass
class Preparation:
    """Whose code prepared the rows of one `render_chunks` pass, counted as they go."""

    trainer_rows: int = 0  # rows the trainer's own code prepared (TRL's; axolotl's where `axolotl_version`)
    checked_rows: int = 0  # string rows tokenized by Gradian's batched fast path, checked equal to TRL's first
    cached_rows: int = 0  # of trainer_rows, read back from an earlier run of TRL's code on them (`data.rows_cache`)
    port_rows: int = 0  # rows Gradian's port prepared: the trainer's code refused them or is not installed
    guessed: int = 0  # rows of a shape TRL does not read, given to it as Gradian reads them
    why: list[str] = field(default_factory=list)  # why the trainer's code was not used, once per reason
    axolotl_version: str | None = None  # axolotl's own strategies prepared trainer_rows (`data.axolotl_code`)
    llamafactory_version: str | None = None  # LLaMA-Factory's own code prepared them (`data.llamafactory_code`)

    def note(self, reason: str) -> None:
        if reason not in self.why:
            self.why.append(reason)

    def to_dict(self) -> dict[str, Any]:
        by_trl = (self.trainer_rows and not (self.axolotl_version or self.llamafactory_version)) or self.checked_rows
        return {**asdict(self), "trl_version": trl_version() if by_trl else None}


def trl_version() -> str:
    import trl

    return str(trl.__version__)


@functools.cache
def trl_masks_prompt_alone() -> bool:
    """TRL before 1.0 marks as prompt the tokens of the prompt tokenized alone (its `completion_mask`, turned into
    labels by its collator); TRL 1 reads the boundary from the full row's tokens."""
    from packaging.version import Version

    return Version(trl_version()).major < 1


def trl_rows(examples: Sequence[Example], tokenizer: Any, setup: TrainingSetup,
             tally: Preparation | None = None) -> list[tuple[list[int], list[int], int]]:
    """(input_ids, labels, prompt_length) of each example as TRL's SFTTrainer prepares it, before truncation.

    All `examples` must be of one kind (conversational or not): TRL reads a dataset's kind from its first row.
    Raises `TrlCannotPrepare` with TRL's reason when its code refuses them."""
    import datasets
    from trl import SFTConfig, SFTTrainer
    from trl.trainer import sft_trainer

    rows = [_trl_row(example, setup, tally) for example in examples]
    name = rows_cache.key(rows, tokenizer, rows_cache.trl_settings(setup), f"TRL {trl_version()}") \
        if rows_cache.enabled(len(rows)) else None
    kept = rows_cache.read(name, len(rows)) if name is not None else None
    if kept is not None:
        if tally is not None:
            tally.trainer_rows += len(rows)
            tally.cached_rows += len(rows)
        return kept
    try:
        dataset = datasets.Dataset.from_list(rows)
    except Exception as error:  # columns whose types differ between rows: each row its own dataset, as in its file
        if len(rows) == 1:
            raise TrlCannotPrepare(f"datasets cannot hold the row ({type(error).__name__})") from None
        return [row for example in examples for row in trl_rows([example], tokenizer, setup, tally)]
    args = _config(SFTConfig, max_length=None, packing=False, shuffle_dataset=False, dataset_num_proc=None,
                   assistant_only_loss=setup.assistant_only_loss, completion_only_loss=setup.completion_only_loss,
                   dataset_text_field=setup.dataset_text_field)
    trainer = _trainer_state(tokenizer, setup, args, rows[0])
    progress = datasets.utils.logging.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # library code draws no bars; the CLI's come through its steps
    quiet = logging.getLogger("gradian.trl_preparation")  # TRL's advice to its own users, not Gradian's; a plain
    quiet.setLevel(logging.ERROR)  # logger: accelerate's asks for a process state Gradian never sets up
    try:  # one process's preparation: TRL's main-process-first barrier would wait for ranks that never come
        with _one_process(sft_trainer), mock.patch.object(sft_trainer, "logger", quiet):
            prepared = SFTTrainer._prepare_dataset(trainer, dataset, trainer._tokenizer, args, False, None, "train")
            labels = prepared["labels"] if "labels" in prepared.column_names else _collated_labels(prepared, trainer)
    except Exception as error:  # anything TRL's code raises on these rows: the port renders them and says so
        raise TrlCannotPrepare(str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__) \
            from None
    finally:
        if progress:
            datasets.enable_progress_bars()
    if tally is not None:
        tally.trainer_rows += len(rows)
    masks = prepared["completion_mask"] if "completion_mask" in prepared.column_names else None
    out = []
    for index, (ids, row_labels) in enumerate(zip(prepared["input_ids"], labels, strict=True)):
        out.append((list(ids), list(row_labels), _prompt_length(row_labels, masks[index] if masks else None,
                                                                "prompt" in rows[index])))
    if name is not None:
        rows_cache.save(name, out)
    return out


def trl_columns(example: Example, text_field: str = "text") -> tuple[dict[str, Any], bool]:
    """The columns TRL reads of one row, as the dataset file holds them where the row is of a shape TRL reads, and
    whether it was not (then the row is Gradian's reading of it: a guess at the run's formatting)."""
    raw = example.raw or example.fields
    if any(key in raw for key in (*SHAPES, text_field)):
        row = {key: raw[key] for key in (*TRL_COLUMNS, text_field) if key in raw}
        guessed = False
    else:
        row = dict(example.fields)
        if "text" in row and text_field != "text":
            row[text_field] = row.pop("text")
        row.update({key: raw[key] for key in ("tools", "chat_template_kwargs") if key in raw})
        guessed = True
    if "reference" in row and "completion" not in row:
        row["completion"] = row.pop("reference")
    return row, guessed


def trl_chat(example: Example, text_field: str = "text") -> tuple[list[dict[str, Any]], str, dict[str, Any]]:
    """A chat row's prompt turns as TRL renders them (the file's own roles; ShareGPT's keys renamed by TRL's
    `maybe_convert_to_chatml`), the role its answer turn carries there, and its `tools` / `chat_template_kwargs`
    columns. Where the prompt ends is Gradian's reading of the row (`Example.prompt`)."""
    from trl.data_utils import maybe_convert_to_chatml

    row = maybe_convert_to_chatml(copy.deepcopy(trl_columns(example, text_field)[0]))
    prompt = example.prompt if isinstance(example.prompt, list) else []
    extras = {key: row[key] for key in ("tools", "chat_template_kwargs") if row.get(key) is not None}
    turns = row.get("messages", row.get("prompt"))
    if not isinstance(turns, list) or len(turns) < len(prompt):
        return list(prompt), "assistant", extras
    answer = turns[len(prompt)] if "messages" in row and len(turns) > len(prompt) else None
    role = answer.get("role", "assistant") if isinstance(answer, dict) else "assistant"
    return turns[: len(prompt)], role, extras


def template_kwargs(extras: dict[str, Any]) -> dict[str, Any]:
    """The chat template's keyword arguments from a row's `tools` and `chat_template_kwargs`, as TRL passes them."""
    tools = extras.get("tools")
    return {**({"tools": json.loads(tools) if isinstance(tools, str) else tools} if tools else {}),
            **(extras.get("chat_template_kwargs") or {})}


def _trl_row(example: Example, setup: TrainingSetup, tally: Preparation | None) -> dict[str, Any]:
    row, guessed = trl_columns(example, setup.dataset_text_field)
    if tally is not None:
        tally.guessed += guessed
    return row


def _config(config_class: type, **settings: Any) -> Any:
    """An SFTConfig's fields, its defaults under `settings`, without constructing one: TrainingArguments' set-up
    touches accelerate's process state, which a GradianCallback inside a running trainer must leave alone."""
    from types import SimpleNamespace

    values = {f.name: f.default_factory() if f.default_factory is not MISSING else f.default
              for f in fields(config_class)}
    return SimpleNamespace(**{**values, **settings})


def _one_process(sft_trainer: Any) -> Any:
    """TRL's main-process-first barrier made a no-op (`global_then_local_main_first`; before TRL 1,
    `PartialState().main_process_first()`, whose state a GradianCallback inside a running trainer must leave alone)."""
    if hasattr(sft_trainer, "global_then_local_main_first"):
        return mock.patch.object(sft_trainer, "global_then_local_main_first", contextlib.nullcontext)
    from types import SimpleNamespace

    one = SimpleNamespace(main_process_first=contextlib.nullcontext)
    return mock.patch.object(sft_trainer, "PartialState", lambda: one)


def _collated_labels(prepared: Any, trainer: Any) -> list[list[int]]:
    """Each row's labels as TRL's own collator builds them, where its preparation leaves them to the collator (TRL
    before 1.0: the completion and assistant masks become -100s there)."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    collator = DataCollatorForLanguageModeling(  # type: ignore[call-arg]  # TRL < 1.0's signature
        pad_token_id=0, completion_only_loss=bool(trainer.completion_only_loss))
    keys = [k for k in ("input_ids", "completion_mask", "assistant_masks") if k in prepared.column_names]
    return [collator([{k: row[k] for k in keys}])["labels"][0].tolist() for row in prepared]


def _trainer_state(tokenizer: Any, setup: TrainingSetup, args: Any, sample: dict[str, Any]) -> Any:
    """What `SFTTrainer.__init__` sets on itself for `_prepare_dataset`, by TRL's own helpers: the tokenizer with the
    run's chat template and EOS, the training template swapped in for assistant-only loss, completion-only loss."""
    from types import SimpleNamespace

    try:
        from trl.chat_template_utils import get_training_chat_template, has_generation_markers
        swaps = True
    except ImportError:  # TRL before the training-template swap (0.24): the tokenizer's own template, as it trained
        swaps = False

    tokenizer = copy.copy(tokenizer)  # the caller's tokenizer is never changed
    if setup.chat_template is not None:
        tokenizer.chat_template = setup.chat_template
    if setup.eos_token is not None:
        tokenizer.eos_token = setup.eos_token
    template = None
    if args.assistant_only_loss and swaps and not has_generation_markers(tokenizer.chat_template):
        try:
            template = get_training_chat_template(tokenizer)
        except Exception as error:  # a template TRL has no training version of
            raise TrlCannotPrepare(str(error).strip().splitlines()[0]) from None
    completion_only = args.completion_only_loss
    if completion_only is None:
        completion_only = "prompt" in sample and "completion" in sample
    return SimpleNamespace(_tokenizer=tokenizer, chat_template=template, completion_only_loss=completion_only,
                           _is_vlm=False)


def _prompt_length(labels: Sequence[int], completion_mask: Sequence[int] | None, has_prompt: bool) -> int:
    """Tokens before the completion: where TRL's completion mask starts, else the first trained token."""
    if not has_prompt:
        return 0
    mask = completion_mask if completion_mask is not None else [label != IGNORE for label in labels]
    return next((i for i, bit in enumerate(mask) if bit), len(mask))
