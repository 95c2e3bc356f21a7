"""`gradian_rows.safetensors`: the rows as the trainer prepared them, written by `GradianCallback`. The format's one owner.

Gradian's renderer is a port of the trainer's preparation; where it lags (a chat template TRL swaps for its own
training template under `assistant_only_loss`, a collator that changes the labels), an audit of re-rendered rows
audits rows the run never saw. The callback therefore stores every row of the trainer's tokenized train dataset
beside `gradian_run.json`, in the order of that dataset, and `diagnose` / `attribute` read those rows instead of
re-rendering them. Tensors (safetensors, nothing is unpickled; N rows, T tokens in all):

- `input_ids` int32 (T,) and `offsets` int64 (N + 1,): row i is `input_ids[offsets[i]:offsets[i + 1]]`;
- `trained` uint8 (T,): 1 where the token carries loss (its collated label is not -100: TRL's `completion_mask` /
  `assistant_masks`, a collator's pad masking, all applied), 0 where it does not;
- `full_length`, `prompt_length` int32 (N,), `tail_cut`, `dropped` uint8 (N,) and `over_limit` uint8 (N,) (an index
  into `OVER_LIMITS`): what preflight read of each row (`callback.trainer_rows`), as in `data.render.Rendered`;
- `content` uint8 (N, 8) and `content_known` uint8 (N,): `content_hash` of the row's text as the trainer's dataset
  held it (zero and 0 where the trainer kept no text for the row): what ties a dataset file's row to its tokens.

`gradian_run.json`'s `rows` key names the file and its SHA-256 (`rows_reference`); a file whose bytes do not hash to
it, or whose tensors do not fit together, is refused (`InputError`), never read in part.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gradian.data.render import IGNORE, Rendered
from gradian.errors import InputError

ROWS_NAME = "gradian_rows.safetensors"
ROWS_FORMAT = "gradian_rows"
ROWS_VERSION = "1"
OVER_LIMITS = ("", "truncated", "dropped", "refused", "split")  # `Rendered.over_limit` values, by code
TOKEN_COLUMNS = frozenset({"input_ids", "labels", "attention_mask", "completion_mask", "assistant_masks",
                           "position_ids", "seq_lengths", "token_type_ids", "id"})
CONTENT_BYTES = 8


def content_hash(fields: dict[str, Any], eos_tokens: Sequence[str]) -> bytes:
    """8 bytes of SHA-256 over a row's text fields (`Example.fields`: prompt/completion, messages or text), the same
    for a dataset file's row and the trainer's copy of it: keys sorted, null values dropped (Arrow fills absent
    keys of a message with null), and one trailing EOS taken off a string `text` / `completion` (TRL appends it)."""
    canonical = {name: _stripped(value, eos_tokens) if name in ("text", "completion") else value
                 for name, value in fields.items()}
    text = json.dumps(_without_nulls(canonical), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).digest()[:CONTENT_BYTES]


def _stripped(value: Any, eos_tokens: Sequence[str]) -> Any:
    if isinstance(value, str):
        for eos in eos_tokens:
            if eos and value.endswith(eos):
                return value[: -len(eos)]
    return value


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_without_nulls(item) for item in value]
    return value


@dataclass
class RecordedRows:
    """The rows file read back and checked; `row(j, name)` is recorded row j as a `Rendered` named `name`."""

    path: Path
    tensors: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.tensors["offsets"]) - 1

    def row(self, index: int, name: str) -> Rendered:
        t = self.tensors
        start, stop = int(t["offsets"][index]), int(t["offsets"][index + 1])
        ids = t["input_ids"][start:stop].astype(np.int64)
        labels = np.where(t["trained"][start:stop].astype(bool), ids, IGNORE)
        return Rendered(name, ids.tolist(), labels.tolist(), int(t["full_length"][index]),
                        int(t["prompt_length"][index]), bool(t["tail_cut"][index]), bool(t["dropped"][index]),
                        OVER_LIMITS[int(t["over_limit"][index])])

    def content(self, index: int) -> bytes | None:
        """Row `index`'s `content_hash`, or None when the trainer kept no text for it."""
        if not self.tensors["content_known"][index]:
            return None
        return bytes(self.tensors["content"][index])


def rows_file_bytes(rows: Sequence[Rendered], contents: Sequence[bytes | None]) -> bytes:
    """The rows file of `rows` (the trainer's rows, dataset order) and their content hashes (None: no text)."""
    from safetensors.numpy import save

    lengths = np.fromiter((len(r.input_ids) for r in rows), dtype=np.int64, count=len(rows))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)  # (N + 1,)
    total = int(offsets[-1])
    tokens = np.fromiter(itertools.chain.from_iterable(r.input_ids for r in rows), dtype=np.int64, count=total)
    labels = np.fromiter(itertools.chain.from_iterable(r.labels for r in rows), dtype=np.int64, count=total)
    content = np.zeros((len(rows), CONTENT_BYTES), dtype=np.uint8)
    for i, value in enumerate(contents):
        if value is not None:
            content[i] = np.frombuffer(value, dtype=np.uint8)
    tensors = {
        "input_ids": tokens.astype(np.int32), "offsets": offsets, "trained": (labels != IGNORE).astype(np.uint8),
        "full_length": np.asarray([r.full_length for r in rows], dtype=np.int32),
        "prompt_length": np.asarray([r.prompt_length for r in rows], dtype=np.int32),
        "tail_cut": np.asarray([r.tail_cut for r in rows], dtype=np.uint8),
        "dropped": np.asarray([r.dropped for r in rows], dtype=np.uint8),
        "over_limit": np.asarray([OVER_LIMITS.index(r.over_limit) for r in rows], dtype=np.uint8),
        "content": content, "content_known": np.asarray([c is not None for c in contents], dtype=np.uint8),
    }
    return save(tensors, metadata={"format": ROWS_FORMAT, "version": ROWS_VERSION})


def rows_reference(data: bytes, rows: int, *, contents: int, eos_tokens: Sequence[str],
                   shuffled: bool) -> dict[str, Any]:
    """What `gradian_run.json`'s `rows` key holds about the rows file `data`."""
    return {"file": ROWS_NAME, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "rows": rows,
            "with_content": contents, "eos_stripped": list(eos_tokens), "shuffled": shuffled}


def find_rows_file(record_path: Path, reference: dict[str, Any]) -> Path | None:
    """The rows file a record names: beside it, else in the run folder above a `checkpoint-N/` (written once, at
    the start of training, into the trainer's output_dir)."""
    name = Path(str(reference.get("file") or ROWS_NAME)).name
    for folder in (record_path.parent, record_path.parent.parent):
        if (folder / name).is_file():
            return folder / name
    return None


def read_recorded_rows(path: Path, reference: dict[str, Any]) -> RecordedRows:
    """The rows file at `path`, checked against the record's `reference`; `InputError` when it is damaged."""
    damaged = ("is damaged ({}); retrain with GradianCallback, or delete the file to audit rows Gradian re-renders "
               "instead.")
    try:
        data = path.read_bytes()
    except OSError as error:
        raise InputError(damaged.format(f"cannot be read: {error.strerror}"), path) from None
    if hashlib.sha256(data).hexdigest() != reference.get("sha256"):
        raise InputError(damaged.format(f"its {len(data)} bytes do not hash to the SHA-256 gradian_run.json "
                                        f"records"), path)
    try:
        tensors = _load(data)
    except Exception as error:  # safetensors' own errors: a header that does not parse, a tensor past the end
        raise InputError(damaged.format(f"cut short, or not safetensors: {type(error).__name__}"), path) from None
    problem = _misfit(tensors, reference)
    if problem:
        raise InputError(damaged.format(problem), path)
    return RecordedRows(path, tensors)


def _load(data: bytes) -> dict[str, np.ndarray]:
    from safetensors.numpy import load

    return load(data)


SHAPES = {"input_ids": (np.int32, "T"), "offsets": (np.int64, "N+1"), "trained": (np.uint8, "T"),
          "full_length": (np.int32, "N"), "prompt_length": (np.int32, "N"), "tail_cut": (np.uint8, "N"),
          "dropped": (np.uint8, "N"), "over_limit": (np.uint8, "N"), "content_known": (np.uint8, "N")}


def _misfit(tensors: dict[str, np.ndarray], reference: dict[str, Any]) -> str | None:
    """What does not fit in the tensors (dtype, shape, offsets, counts), or None."""
    missing = sorted((set(SHAPES) | {"content"}) - set(tensors))
    if missing:
        return f"no {', '.join(missing)} tensor"
    n, offsets = tensors["offsets"].size - 1, tensors["offsets"]  # size, not len: a tensor may have no dimension
    sizes = {"T": tensors["input_ids"].size, "N": n, "N+1": n + 1}
    for name, (dtype, size) in SHAPES.items():
        if tensors[name].dtype != dtype or tensors[name].shape != (sizes[size],):
            return f"{name} is {tensors[name].dtype} {tensors[name].shape}, not {np.dtype(dtype)} of {size}"
    if tensors["content"].shape != (n, CONTENT_BYTES):
        return f"content is {tensors['content'].shape}, not (N, {CONTENT_BYTES})"
    if n != reference.get("rows") or offsets[0] != 0 or offsets[-1] != sizes["T"] or np.any(np.diff(offsets) < 0):
        return f"its {n} rows and offsets do not fit the {reference.get('rows')} rows gradian_run.json records"
    if np.any(tensors["input_ids"] < 0):
        return "a negative token id"
    if np.any(tensors["over_limit"] >= len(OVER_LIMITS)):
        return "an over_limit code out of range"
    return None
