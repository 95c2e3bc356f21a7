"""The run record: what the running trainer was, and which rows each optimizer step fed the model, at which rate.

Rows are read where they cannot be wrong: a forward pre-hook on the model sees every micro-batch exactly as the
model receives it, whatever sampler, dataloader workers, accelerate version or resume skipping produced it. Each
row (padding taken off by the attention mask; a padding-free batch split where positions restart) is named by
its content hash and looked up among the hashes of the trainer's tokenized dataset to give its index. The format
and its readers live in `gradian.data.run_record`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gradian.data.examples import example_fields
from gradian.data.framework_version import package_version
from gradian.data.recorded_rows import ROWS_NAME, TOKEN_COLUMNS, content_hash, rows_file_bytes, rows_reference
from gradian.data.render import Rendered
from gradian.data.run_record import RECORD_FORMAT, RECORD_NAME, RECORD_VERSION, SETUP_FIELDS, row_hash
from gradian.files import atomic_write

COLLATOR_FIELDS = ("pad_token_id", "padding_free", "completion_only_loss", "mlm", "mlm_probability", "ignore_index",
                   "label_pad_token_id", "pad_to_multiple_of", "return_position_ids", "padding", "max_length",
                   "response_template", "instruction_template", "mask_pad_token")
PACKAGES = ("transformers", "trl", "peft", "accelerate", "torch")
MAX_SEGMENTS = 64  # padding-free: segments one dataset row may span (packed rows restart positions inside)


def dataset_hashes(dataset: Any) -> dict[str, int]:
    """Content hash of every row's input_ids -> its first dataset index (read by column from Arrow when possible)."""
    table: dict[str, int] = {}
    data = getattr(dataset, "data", None)
    if data is not None and hasattr(data, "column") and "input_ids" in getattr(dataset, "column_names", []):
        index = 0
        for chunk in data.column("input_ids").chunks:
            offsets, values = chunk.offsets.to_numpy(), chunk.values.to_numpy()
            for start, stop in zip(offsets[:-1], offsets[1:], strict=True):
                table.setdefault(row_hash(values[start:stop]), index)
                index += 1
        return _remapped(dataset, table)
    for index in range(len(dataset)):
        table.setdefault(row_hash(np.asarray(dataset[index]["input_ids"])), index)
    return table


def _remapped(dataset: Any, table: dict[str, int]) -> dict[str, int]:
    """A `Dataset.select`/`shuffle` view keeps an indices mapping over its Arrow table: map positions through it."""
    mapping = getattr(dataset, "_indices", None)
    if mapping is None:
        return table
    positions = mapping.column(0).to_numpy()
    inverse = {int(physical): logical for logical, physical in enumerate(positions)}
    out: dict[str, int] = {}
    for key, physical in table.items():
        if physical in inverse:
            out[key] = inverse[physical]
    return out


def row_contents(dataset: Any, text_field: str, eos_tokens: Sequence[str]) -> list[bytes | None]:
    """Each row's `content_hash`, from the text columns the trainer kept beside its tokens (None: it kept none)."""
    names = [name for name in getattr(dataset, "column_names", None) or [] if name not in TOKEN_COLUMNS]
    if not names:
        return [None] * len(dataset)
    columns = {name: list(dataset[name]) for name in names}
    out: list[bytes | None] = []
    for values in zip(*columns.values(), strict=True):
        fields = example_fields(dict(zip(columns, values, strict=True)), text_field)
        out.append(content_hash(fields, eos_tokens) if fields is not None else None)
    return out


def write_rows(folder: str | Path, rows: Sequence[Rendered], contents: Sequence[bytes | None], *,
               eos_tokens: Sequence[str], shuffled: bool) -> dict[str, Any]:
    """Write the trainer's rows (dataset order) to `folder`/gradian_rows.safetensors atomically; the record's
    `rows` reference to them."""
    data = rows_file_bytes(rows, contents)
    atomic_write(Path(folder) / ROWS_NAME, data)
    return rows_reference(data, len(rows), contents=sum(c is not None for c in contents), eos_tokens=eos_tokens,
                          shuffled=shuffled)


def fed_rows(inputs: dict[str, Any], known: Callable[[str], bool]) -> list[tuple[np.ndarray, str]]:
    """The rows of one micro-batch as the model received them, padding removed, each with its `row_hash`.
    (B, T) ids -> B (row, hash) pairs."""
    ids = inputs.get("input_ids")
    if not isinstance(ids, torch.Tensor):
        return []
    ids = ids.detach().cpu().numpy()  # (B, T)
    mask, positions = inputs.get("attention_mask"), inputs.get("position_ids")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2:
        keep = mask.detach().cpu().numpy().astype(bool)  # (B, T)
        return _hashed([row[m] for row, m in zip(ids, keep, strict=True)])
    if isinstance(positions, torch.Tensor) and ids.shape[0] == 1:
        return _split_flat(ids[0], positions.detach().cpu().numpy().reshape(-1), known)
    return _hashed(list(ids))


def _hashed(rows: list[np.ndarray]) -> list[tuple[np.ndarray, str]]:
    return [(row, row_hash(row)) for row in rows]


def _split_flat(ids: np.ndarray, positions: np.ndarray, known: Callable[[str], bool]) -> list[tuple[np.ndarray, str]]:
    """A padding-free sequence back into dataset rows: segments start where positions restart at 0; consecutive
    segments join while they do not yet hash to a dataset row (a packed row holds several)."""
    starts = [int(i) for i in np.flatnonzero(positions == 0)] + [len(ids)]
    rows, first = [], 0
    while first < len(starts) - 1:
        last, key = _joined(ids, starts, first, known)
        rows.append((ids[starts[first]:starts[last]], key))
        first = last
    return rows


def _joined(ids: np.ndarray, starts: list[int], first: int, known: Callable[[str], bool]) -> tuple[int, str]:
    """The fewest segments from segment `first` on (at most MAX_SEGMENTS) that hash to a dataset row: the segment
    after the last of them, and their hash; segment `first` alone when no run of them is a dataset row."""
    single = row_hash(ids[starts[first]:starts[first + 1]])
    if known(single):
        return first + 1, single
    for last in range(first + 2, min(len(starts) - 1, first + MAX_SEGMENTS) + 1):
        key = row_hash(ids[starts[first]:starts[last]])
        if known(key):
            return last, key
    return first + 1, single  # no run of segments is a dataset row: keep the segment as it came


def soft(hook: Callable[..., Any], owner: Any) -> Callable[..., None]:
    """`hook` keeping its first error on `owner.error` rather than raising it into the trainer's forward or backward,
    where Gradian's hooks run: a fault of Gradian's never stops training (`GradianCallback` reports it at the step's
    end). After an error the hook does nothing."""
    def run(*args: Any, **kwargs: Any) -> None:
        if owner.error is not None:
            return
        try:
            hook(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - any fault of Gradian's: kept, reported, training goes on
            owner.error = error
    return run


class RunRecorder:
    """Collects `gradian_run.json` while training runs; `to_dict()` is the record (`data.run_record` reads it)."""

    def __init__(self, header: dict[str, Any], table: dict[str, int], steps: list[dict[str, Any]] | None = None):
        self.header = header
        self.table = table
        self.steps: list[dict[str, Any]] = list(steps or [])
        self.error: Exception | None = None  # the first fault of its hook (`soft`)
        self.current: dict[str, Any] | None = None
        self.handle: Any = None
        self.on_batch: Callable[[dict[str, Any]], None] | None = None  # told of every training micro-batch

    def attach(self, model: torch.nn.Module) -> None:
        """Start seeing every micro-batch the model is fed while it trains."""
        self.handle = model.register_forward_pre_hook(soft(self._seen, self), with_kwargs=True)

    def detach(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None

    def _seen(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not module.training or self.current is None:
            return  # evaluation and generation feed rows that train nothing
        inputs = dict(kwargs)
        if args and "input_ids" not in inputs:
            inputs["input_ids"] = args[0]
        if self.on_batch is not None:
            self.on_batch(inputs)
        for _, key in fed_rows(inputs, self.table.__contains__):
            self.current["rows"].append(self.table.get(key))
            self.current["hashes"].append(key)

    def begin_step(self, epoch: float | None) -> None:
        self.current = {"step": None, "epoch": int(math.floor((epoch or 0.0) + 1e-9)), "learning_rate": None,
                        "rows": [], "hashes": []}

    def optimizer_stepped(self, optimizer: Any) -> None:
        """The rate the update just used (read after `optimizer.step()`, before the scheduler moves it)."""
        if self.current is not None and optimizer is not None and optimizer.param_groups:
            self.current["learning_rate"] = float(optimizer.param_groups[0]["lr"])

    def end_step(self, global_step: int) -> None:
        if self.current is None:
            return
        self.current["step"] = global_step
        self.current["rows"], self.current["hashes"] = _gathered(self.current["rows"], self.current["hashes"])
        self.steps.append(self.current)
        self.current = None

    def to_dict(self, complete: bool, failed: str | None = None) -> dict[str, Any]:
        return {"format": RECORD_FORMAT, "version": RECORD_VERSION, **self.header, "steps": self.steps,
                "complete": complete, **({"failed": failed} if failed else {})}

    def write(self, folder: str | Path, complete: bool, failed: str | None = None) -> Path:
        """Write the record into `folder` atomically (a kill never leaves half a file); `failed`: why the callback
        stopped recording, which makes readers refuse the record."""
        text = json.dumps(self.to_dict(complete, failed), indent=1, default=str) + "\n"
        return atomic_write(Path(folder) / RECORD_NAME, text)


def world_size() -> int:
    """How many processes each step's rows are gathered from: torch.distributed's world, 1 without it."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return 1
    return torch.distributed.get_world_size()


def _gathered(rows: list[Any], hashes: list[str]) -> tuple[list[Any], list[str]]:
    """Under torchrun every rank feeds its own micro-batches: the step's rows are all ranks' rows, rank by rank."""
    world = world_size()
    if world == 1:
        return rows, hashes
    parts: list[Any] = [None] * world
    torch.distributed.all_gather_object(parts, (rows, hashes))
    return [i for part in parts for i in part[0]], [h for part in parts for h in part[1]]


def record_header(*, trainer_class: str, args: Any, tokenizer: Any, collator: Any, collator_masks_pad: bool | None,
                  pad_token: str | None, dataset_rows: int, ids: list[str] | None,
                  findings: list[dict[str, Any]], rows: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything the record says about the run besides its steps (`pad_token`: `collator_pad_token`'s; `rows`:
    `write_rows`' reference to the trainer's rows)."""
    return {
        "trainer": {"class": trainer_class, "versions": {name: package_version(name) for name in PACKAGES}},
        "collator": {"class": qualified_name(collator), "attributes": _attributes(collator),
                     "masks_pad": collator_masks_pad},
        "tokenizer": _tokenizer(tokenizer),
        "rendering": _rendering(args, pad_token),
        "seeds": {"seed": args.seed, "data_seed": args.data_seed},
        "world_size": args.world_size,
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "num_train_epochs": args.num_train_epochs,
        "learning_rate": args.learning_rate,
        "lr_scheduler_type": str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)),
        "dataset": {"rows": dataset_rows, "ids": ids},
        "preflight": findings,
        "rows": rows,
    }


def collator_pad_id(collator: Any) -> int | None:
    """The pad id the collator pads (and, if it masks pads, hides) with."""
    owners = [collator, getattr(collator, "tokenizer", None), getattr(collator, "inner", None)]
    owners.append(getattr(owners[2], "tokenizer", None))  # a wrapper around transformers' collator
    for owner in owners:
        value = getattr(owner, "pad_token_id", None)
        if isinstance(value, int):
            return value
    return None


def qualified_name(value: Any) -> str | None:
    """`module.Class` of `value`'s type (how the record names the trainer, collator and tokenizer); None for None."""
    if value is None:
        return None
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}"


def collator_pad_token(tokenizer: Any, collator: Any) -> str | None:
    """The token the collator pads with (and may mask), or None when it names no pad id."""
    pad_id = collator_pad_id(collator)
    return tokenizer.convert_ids_to_tokens(pad_id) if pad_id is not None else None


def _rendering(args: Any, pad_token: str | None) -> dict[str, Any]:
    """The args' rendering fields; `pad_token`, when the args name none, is the collator's (`collator_pad_token`)."""
    out = {name: getattr(args, name, None) for name in SETUP_FIELDS}
    if out["pad_token"] is None:
        out["pad_token"] = pad_token
    return out


def _attributes(collator: Any) -> dict[str, Any]:
    """The collator's attributes that decide labels (its own, and those of a collator it wraps)."""
    out: dict[str, Any] = {}
    for owner, prefix in ((collator, ""), (getattr(collator, "inner", None), "inner.")):
        for name in COLLATOR_FIELDS:
            value = getattr(owner, name, None) if owner is not None else None
            if isinstance(value, (bool, int, float, str)) or (value is None and hasattr(owner, name)):
                out[prefix + name] = value
        tokenizer = getattr(owner, "tokenizer", None) if owner is not None else None
        if tokenizer is not None:
            out[prefix + "tokenizer.pad_token_id"] = tokenizer.pad_token_id
    return out


def _tokenizer(tokenizer: Any) -> dict[str, Any]:
    special = {name: {"token": getattr(tokenizer, f"{name}_token", None), "id": getattr(tokenizer, f"{name}_token_id",
                                                                                        None)}
               for name in ("bos", "eos", "pad", "unk")}
    return {"class": qualified_name(tokenizer), **special, "padding_side": getattr(tokenizer, "padding_side", None),
            "truncation_side": getattr(tokenizer, "truncation_side", None)}
