"""Rows a trainer's own code prepared (TRL's, LLaMA-Factory's), kept by content: a rerun on the same rows, tokenizer
and settings reads them back.

TRL's preparation runs row by row in Python (1.5x Gradian's port on chat rows at 10^5 rows), LLaMA-Factory's too
(1.2x its own `get_dataset`: BENCHMARKS.md), so what one returns for a chunk of at least `MIN_ROWS` rows is kept in `$GRADIAN_CACHE/rows` (else `~/.cache/gradian/rows`)
under the sha256 of everything it depends on: the rows' columns as the trainer reads them, the tokenizer (its whole
serialized form: vocabulary, special tokens; its chat template), the settings the trainer reads, its version and
this format's. Tensors in
safetensors, nothing unpickled:

- `input_ids`, `labels` int64 (T,) and `offsets` int64 (N + 1,): row i is `[offsets[i]:offsets[i + 1]]`;
- `prompt_length` int64 (N,): the prompt's length (TRL), or the row's length whole (LLaMA-Factory; -1 for a row
  its processor drops).

A file that does not load or does not fit is prepared again; a cache that cannot be written is skipped (it only saves
time). `GRADIAN_ROWS_CACHE=0` turns it off.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from gradian.data.setup import TrainingSetup
from gradian.files import atomic_write, cache_dir

MIN_ROWS = 256  # smaller calls (one eval answer at a time) cost less than a file each
FORMAT = "trl-rows-1"
SETTINGS = ("assistant_only_loss", "completion_only_loss", "dataset_text_field", "eos_token", "chat_template")
Prepared = tuple[list[int], list[int], int]


def enabled(rows: int) -> bool:
    return rows >= MIN_ROWS and os.environ.get("GRADIAN_ROWS_CACHE", "1") != "0"


def trl_settings(setup: TrainingSetup) -> dict[str, Any]:
    """The settings TRL's preparation reads."""
    return {name: getattr(setup, name) for name in SETTINGS}


def key(rows: Sequence[dict[str, Any]], tokenizer: Any, settings: dict[str, Any], version: str) -> str:
    """sha256 of what a trainer's preparation of `rows` depends on: the rows, the tokenizer, the `settings` it reads
    and its `version` (`TRL 1.16.0`, `LLaMA-Factory 0.9.5`)."""
    digest = hashlib.sha256(FORMAT.encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    identity = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    for part in (identity, type(tokenizer).__name__, str(tokenizer.chat_template), str(tokenizer.eos_token),
                 json.dumps(settings, sort_keys=True, default=str), version):
        digest.update(hashlib.sha256(part.encode()).digest())
    for row in rows:
        digest.update(json.dumps(row, sort_keys=True, ensure_ascii=False, default=str).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def read(name: str, count: int) -> list[Prepared] | None:
    """The `count` rows kept under `name`, or None when there are none (or the file does not fit)."""
    from safetensors.numpy import load_file

    path = cache_dir("rows") / f"{name}.safetensors"
    try:
        tensors = load_file(str(path))
        ids, labels, offsets, prompts = (tensors[k] for k in ("input_ids", "labels", "offsets", "prompt_length"))
    except Exception:  # absent, damaged, or another layout: prepare again
        return None
    if offsets.shape != (count + 1,) or prompts.shape != (count,) or ids.shape != labels.shape \
            or offsets[0] != 0 or offsets[-1] != len(ids) or np.any(np.diff(offsets) < 0):
        return None
    return [(ids[a:b].tolist(), labels[a:b].tolist(), int(n))
            for a, b, n in zip(offsets[:-1], offsets[1:], prompts, strict=True)]


def save(name: str, prepared: Sequence[Prepared]) -> None:
    """Keep `prepared` under `name`; nothing when the cache folder cannot be written."""
    from safetensors.numpy import save

    lengths = [len(ids) for ids, _, _ in prepared]
    tensors = {
        "input_ids": np.fromiter((t for ids, _, _ in prepared for t in ids), dtype=np.int64, count=sum(lengths)),
        "labels": np.fromiter((t for _, labels, _ in prepared for t in labels), dtype=np.int64, count=sum(lengths)),
        "offsets": np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64),
        "prompt_length": np.asarray([n for _, _, n in prepared], dtype=np.int64),
    }
    try:
        folder = cache_dir("rows")
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write(folder / f"{name}.safetensors", save(tensors))
    except OSError:
        pass  # a cache that cannot be written only costs time
