"""`gradian_run.json`: what `GradianCallback` recorded inside training, read back. The format's one owner.

The callback writes the record into the trainer's `output_dir` and into every `checkpoint-N/` it saves. It holds
what no framework writes down (schema version 1, every key always present, `null` when unknown):

- `trainer`: `class` (qualified name) and `versions` (transformers, trl, peft, accelerate, torch);
- `collator`: `class`, `attributes` (the ones that decide labels: `pad_token_id`, `mlm`, `padding_free`,
  `completion_only_loss`, `ignore_index`, ...) and `masks_pad` (whether one real batch showed the collator
  setting the label of pad ids to -100; null when no pad id sits inside a row);
- `tokenizer`: `class`, `bos` / `eos` / `pad` as `{"token", "id"}`, `padding_side`, `truncation_side`;
- `rendering`: `max_length`, `truncation_mode`, `packing`, `padding_free`, `completion_only_loss`,
  `assistant_only_loss`, `dataset_text_field`, `eos_token`, `pad_token` (the `SFTConfig` fields; null under a
  plain `Trainer`);
- `seeds`: `seed`, `data_seed`; `world_size`, `per_device_train_batch_size`, `gradient_accumulation_steps`,
  `num_train_epochs`, `learning_rate` (the configured peak), `lr_scheduler_type`;
- `dataset`: `rows` (rows of the trainer's tokenized train dataset) and `ids` (its `id` column, else null);
- `steps`: one entry per optimizer step, in order: `step` (1-based global step), `epoch` (0-based),
  `learning_rate` (the rate that step's update used), `rows` (dataset indices of every row its micro-batches fed
  the model, in order; null where a row matched no dataset row) and `hashes` (`row_hash` of each row's tokens);
- `preflight`: the findings preflight printed (`Finding.to_dict()` each); `complete`: true once training ended;
  `failed` (present only then): why the callback turned itself off mid-run after a fault of its own; such a record
  is refused, since it stops at that step;
- `rows`: the trainer's own rows, stored beside the record in `gradian_rows.safetensors` (`data.recorded_rows`
  owns that file): `file` (its name), `sha256` and `bytes` (of the whole file), `rows`, `with_content` (rows whose
  text the trainer kept, so a dataset row can be tied to them), `eos_stripped` (the EOS strings the content hash
  takes off a text's end) and `shuffled` (TRL's `shuffle_dataset`); null when the callback could not read the rows.
  Records written before Gradian kept the rows have no `rows` key and are read as before: their rows re-rendered.

`run_record.schema.json` (shipped beside this module) holds each field's type; a record that breaks it, or holds a
non-finite learning rate or an epoch past its steps, is refused with one sentence naming the field (exit 2).

Indices are into the trainer's own train dataset (`trainer.train_dataset`, after TRL tokenized, filtered and,
with `shuffle_dataset`, shuffled it), so a replay feeds that dataset; the hashes tie a row to its tokens whatever
the index. Rows with identical tokens are interchangeable to training; the record names the first of them.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from packaging.version import InvalidVersion, Version

from gradian.data.checkpoints import checkpoint_folders
from gradian.data.framework_version import VersionRange
from gradian.errors import InputError
from gradian.files import read_json_object
from gradian.schemas import load_schema, schema_problem, validator_of

RECORD_NAME = "gradian_run.json"
RECORD_FORMAT = "gradian_run"
RECORD_VERSION = 1
SETUP_FIELDS = ("max_length", "truncation_mode", "packing", "padding_free", "completion_only_loss",
                "assistant_only_loss", "dataset_text_field", "eos_token", "pad_token")


def row_hash(input_ids: Sequence[int] | np.ndarray) -> str:
    """The content hash of one row: the first 16 hex digits of SHA-256 over its token ids as little-endian int64."""
    return hashlib.sha256(np.asarray(input_ids, dtype="<i8").tobytes()).hexdigest()[:16]


@dataclass
class RunRecord:
    """A read `gradian_run.json`: `data` is the JSON object as written, `path` the file it came from."""

    path: Path
    data: dict[str, Any]

    @property
    def steps(self) -> list[dict[str, Any]]:
        return list(self.data.get("steps") or [])

    @property
    def order(self) -> list[list[int]]:
        """Dataset indices of the rows each optimizer step trained on, step by step; `InputError` when a step fed
        a row that is not in the train dataset (a replay without it would shift every later row)."""
        for step in self.steps:
            if any(i is None for i in step.get("rows") or []):
                raise InputError(f"step {step.get('step')} fed the model a row that is not in its train dataset; "
                                 f"this order cannot be replayed.", self.path)
        return [[int(i) for i in step.get("rows") or []] for step in self.steps]

    @property
    def epochs(self) -> list[list[int]]:
        """The order by epoch: the dataset indices each epoch fed, in order (what a sampler yields)."""
        by_epoch: dict[int, list[int]] = {}
        for step, rows in zip(self.steps, self.order, strict=True):
            by_epoch.setdefault(int(step.get("epoch") or 0), []).extend(rows)
        if not by_epoch:
            raise InputError("records no optimizer step; train with GradianCallback to the end first.", self.path)
        return [by_epoch.get(e, []) for e in range(max(by_epoch) + 1)]

    @property
    def learning_rates(self) -> dict[int, float]:
        """The learning rate of each recorded optimizer step, by its 1-based global step, in step order."""
        return {int(step["step"]): float(step["learning_rate"]) for step in self.steps
                if step.get("step") is not None and step.get("learning_rate") is not None}

    @property
    def rows(self) -> dict[str, Any] | None:
        """The `rows` reference (the rows file the callback wrote), or None when the record holds none."""
        value = self.data.get("rows")
        return value if isinstance(value, dict) else None

    @property
    def collator_masks_pad(self) -> bool | None:
        value = (self.data.get("collator") or {}).get("masks_pad")
        return value if isinstance(value, bool) else None

    def setup_fields(self) -> dict[str, Any]:
        """The `TrainingSetup` fields the record states, by their `TrainingSetup` names (absent when unknown)."""
        rendering = self.data.get("rendering") or {}
        out = {name: rendering[name] for name in SETUP_FIELDS if rendering.get(name) is not None}
        for name in ("eos_token", "pad_token"):  # None is a recorded choice: the tokenizer's token
            if name in rendering:
                out[name] = rendering[name]
        if self.collator_masks_pad is not None:
            out["collator_masks_pad"] = self.collator_masks_pad
        for name in ("learning_rate", "num_train_epochs", "per_device_train_batch_size", "gradient_accumulation_steps"):
            if isinstance(self.data.get(name), (int, float)) and not isinstance(self.data.get(name), bool):
                out[name] = self.data[name]
        return out

    def framework(self) -> tuple[str, str | None]:
        """("trl" | "transformers", that package's recorded version)."""
        versions = (self.data.get("trainer") or {}).get("versions") or {}
        if versions.get("trl") and "trl" in str((self.data.get("trainer") or {}).get("class", "")).lower():
            return "trl", versions["trl"]
        return "transformers", versions.get("transformers")

    def version_range(self) -> VersionRange | None:
        """The recorded framework version as the exact range `data.framework_version` reasons with."""
        try:
            version = Version(self.framework()[1] or "")
        except InvalidVersion:
            return None
        following = Version(f"{version.major}.{version.minor}.{version.micro + 1}")
        return VersionRange(version, following, f"recorded in {RECORD_NAME} by GradianCallback")

    def describe(self) -> str:
        """One line for a command's output: what was read from the record."""
        collator = (self.data.get("collator") or {}).get("class") or "unknown"
        masks = {True: "masks pad ids", False: "pads labels by position", None: "pad masking not seen"}
        return (f"read {self.path} (recorded by GradianCallback): collator {collator.rsplit('.', 1)[-1]} "
                f"({masks[self.collator_masks_pad]}), {len(self.steps)} optimizer steps with their rows and "
                f"learning rates")


def find_record(run_dir: str | Path) -> Path | None:
    """The record a run folder holds: its own, else the newest checkpoint's (the run was killed before it ended)."""
    root = Path(run_dir)
    if (root / RECORD_NAME).is_file():
        return root / RECORD_NAME
    for folder in reversed(checkpoint_folders(root) if root.is_dir() else []):
        if (folder / RECORD_NAME).is_file():
            return folder / RECORD_NAME
    return None


def read_run_record(run_dir: str | Path) -> RunRecord | None:
    """The run's `gradian_run.json`, or None when the run was trained without `GradianCallback`.

    Raises `InputError` naming the file when it is not a record this version of Gradian reads.
    """
    path = find_record(run_dir)
    if path is None:
        return None
    data = read_json_object(path, "delete it or retrain with GradianCallback")
    if data.get("format") != RECORD_FORMAT:
        raise InputError("is not a gradian_run.json written by GradianCallback; remove it from the run folder.", path)
    if data.get("version") != RECORD_VERSION:
        raise InputError(f"is a run record of version {data.get('version')!r}; this Gradian reads version "
                         f"{RECORD_VERSION}: upgrade Gradian.", path)
    problem = _shape_problem(data)
    if problem:
        raise InputError(f"is not a record GradianCallback wrote ({problem}); it was edited or damaged: remove it from "
                         "the run folder, or retrain with GradianCallback.", path)
    if data.get("failed"):
        raise InputError(f"says {data['failed']}, so it does not cover the whole run: remove it from the run folder "
                         "to read the run without it (and report the fault with the log it names).", path)
    return RunRecord(path.resolve(), data)


def _shape_problem(data: dict[str, Any]) -> str | None:
    """What in a record is not as GradianCallback writes it (`run_record.schema.json`, plus what a schema cannot
    say: a finite learning rate, an epoch no later than the steps allow); None when all is."""
    problem = schema_problem(_validator(), data)
    if problem:
        return problem
    steps = data.get("steps") or []
    for number, step in enumerate(steps, start=1):
        if (step.get("epoch") or 0) > len(steps):
            return f"step entry {number}'s epoch is not an epoch index"
        if not math.isfinite(step.get("learning_rate") or 0.0):
            return f"step entry {number}'s learning_rate is not a number"
    return None


@functools.cache
def _validator() -> Any:
    return validator_of(load_schema("gradian.data", "run_record.schema.json"))
