"""Training rows into batches as extraction batches them: grouped by length under a row and a padded-token budget,
padded with position ids that count real tokens, and hashed so caches keyed by the rows are redone when one is edited.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
from torch import nn

from gradian.data.render import IGNORE, Rendered
from gradian.gradients.settings import GradientSettings

Progress = Callable[[Iterable], Iterable]


def collate(rows: Sequence[tuple[list[int], list[int]]], pad_id: int, side: str = "right") -> dict[str, torch.Tensor]:
    """Pad (input_ids, labels) rows; position ids count real tokens so left padding changes nothing.

    A row's first label is dropped (IGNORE): nothing precedes that token, so the loss never predicts it, but
    under left padding a pad would (a row trained on every token, BOS included, got a pad's loss term).
    """
    width = max(len(ids) for ids, _ in rows)
    batch = {
        key: np.full((len(rows), width), fill, dtype=np.int64)
        for key, fill in (("input_ids", pad_id), ("labels", IGNORE), ("attention_mask", 0))
    }
    for i, (ids, labels) in enumerate(rows):
        span = slice(width - len(ids), width) if side == "left" else slice(0, len(ids))
        batch["input_ids"][i, span] = ids
        batch["labels"][i, span] = labels
        batch["labels"][i, span.start] = IGNORE
        batch["attention_mask"][i, span] = 1
    tensors = {key: torch.from_numpy(value) for key, value in batch.items()}
    tensors["position_ids"] = (tensors["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    return tensors


def pad_id_of(model: nn.Module) -> int:
    """The id batches are padded with: the model config's pad token, else 0 (padded positions are masked out)."""
    return getattr(getattr(model, "config", None), "pad_token_id", None) or 0


def plan_batches(lengths: dict[int, int], settings: GradientSettings) -> list[list[int]]:
    """Rows grouped by length (longest first) under the row and padded-token budgets; deterministic."""
    batches: list[list[int]] = []
    for row in sorted(lengths, key=lambda r: (-lengths[r], r)):
        current = batches[-1] if batches else None
        if (
            current
            and len(current) < settings.batch_size
            and lengths[current[0]] * (len(current) + 1) <= settings.max_tokens
        ):
            current.append(row)
        else:
            batches.append([row])
    return batches


def rows_sha(rendered: Sequence[Rendered]) -> str:
    """A hash of the rows' tokens and labels: caches keyed by it are redone when a row is edited.

    Each row as its length, then its tokens and labels as int64 bytes: no text of the whole set is built.
    """
    digest = hashlib.sha256()
    for row in rendered:
        for values in ([len(row.input_ids)], row.input_ids, row.labels):
            digest.update(array("q", values).tobytes())
    return digest.hexdigest()


def sampled_rows(rendered: Sequence[Rendered], seed: int, max_rows: int | None = None) -> list[int]:
    """Indices of the trained rows (`dropped` skipped), in order; with `max_rows`, a sample seeded by `seed`."""
    rows = [i for i, row in enumerate(rendered) if not row.dropped]
    if max_rows is not None and len(rows) > max_rows:
        picked = np.random.default_rng(seed).choice(len(rows), size=max_rows, replace=False)
        rows = [rows[i] for i in sorted(picked)]
    return rows


def row_batches(
    model: nn.Module, rendered: Sequence[Rendered], rows: list[int], settings: GradientSettings,
    progress: Progress | None = None,
) -> Iterator[tuple[list[int], dict[str, torch.Tensor]]]:
    """(batch rows, batch) over `rows` of `rendered`, batched as extraction batches them, on the model's device."""
    device = next(model.parameters()).device
    batches = plan_batches({i: len(rendered[i].input_ids) for i in rows}, settings)
    for batch_rows in progress(batches) if progress is not None else batches:
        pairs = [(rendered[i].input_ids, rendered[i].labels) for i in batch_rows]
        yield batch_rows, {k: v.to(device) for k, v in collate(pairs, pad_id_of(model), settings.padding_side).items()}
