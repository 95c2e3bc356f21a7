"""Query gradients: the direction in LoRA space that moves a failing eval row toward its correct answer.

For prompt x, correct answer y⁺ and the fine-tuned model's failing output y⁻ (token ids), the
measurement f is a margin toward the CORRECT answer and the query is q = ∇θ f, unit-normalised:

- `naive`:             f = log p(y⁺|x)
- `contrastive`:       f = log p(y⁺|x) − log p(y⁻|x)        (shared tokens cancel, full sequences)
- `contrastive-first`: f = log p(y⁺_j|x, y_<j) − log p(y⁻_j|x, y_<j) at the first position j where the
                       answers differ (an answer that ended counts as differing from one that goes on)

A "repaired" y⁺ (the failing output kept up to where it failed, continued correctly) is passed in as
`positive_ids` by the caller; the same kinds then apply. Queries use the training features' projector.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from gradian.data.render import IGNORE
from gradian.gradients.batches import collate, pad_id_of
from gradian.gradients.extract import GradientSettings, example_gradients, make_projector

KINDS = ("naive", "contrastive", "contrastive-first")


@dataclass
class QueryPair:
    """One failing eval row: its prompt, the correct answer y⁺ and the failing output y⁻ (token ids)."""

    eval_id: str
    prompt_ids: list[int]
    positive_ids: list[int]
    negative_ids: list[int] | None = None


def first_divergence(positive: list[int], negative: list[int]) -> int | None:
    """First index where the answers differ (an answer that ended differs from one that goes on)."""
    for j in range(max(len(positive), len(negative))):
        if j >= len(positive) or j >= len(negative) or positive[j] != negative[j]:
            return j
    return None


def answer_row(prompt: list[int], answer: list[int], only: int | None) -> tuple[list[int], list[int]]:
    """(input_ids, labels) with loss on the answer, or on answer token `only` when given."""
    labels = [IGNORE] * len(prompt) + [
        token if only is None or j == only else IGNORE for j, token in enumerate(answer)
    ]
    return prompt + answer, labels


def query_rows(pair: QueryPair, kind: str) -> list[tuple[list[int], list[int], float]]:
    """(input_ids, labels, sign) rows whose signed summed-NLL gradients add up to −q (before normalising)."""
    if kind not in KINDS:
        raise ValueError(f"unknown query kind {kind!r}; expected one of {KINDS}")
    if kind == "naive" or pair.negative_ids is None:
        return [(*answer_row(pair.prompt_ids, pair.positive_ids, None), 1.0)]
    only = None
    if kind == "contrastive-first":
        only = first_divergence(pair.positive_ids, pair.negative_ids)
        if only is None:
            return []  # identical answers: no margin, zero query
    rows = []
    for answer, sign in ((pair.positive_ids, 1.0), (pair.negative_ids, -1.0)):
        if only is None or only < len(answer):
            rows.append((*answer_row(pair.prompt_ids, answer, only), sign))
    return rows


def query_features(
    model: nn.Module, pairs: list[QueryPair], *, kind: str, settings: GradientSettings, unit_norm: bool = True,
    exact: torch.Tensor | None = None,
) -> np.ndarray:
    """(Q, k) query gradients q = ∇θ f (f = margin toward the correct answer), projected like training features.

    A contrastive kind on a pair without a negative falls back to the naive query for that pair.
    A pair whose answers are identical gets a zero row. With `exact`, the pairs' (Q, Σ LoRA sizes) exact q as
    `query.query_gradients` kept them, they are projected, not computed again.
    """
    projector = make_projector(model, settings)
    queries = np.zeros((len(pairs), projector.dim), dtype=np.float64)
    device = next(model.parameters()).device
    if exact is not None:
        for start in range(0, len(pairs), settings.batch_size):
            flat = exact[start : start + settings.batch_size].to(device)  # (B, Σ LoRA sizes)
            queries[start : start + len(flat)] = projector.project_exact(flat).double().cpu().numpy()
        return unit(queries) if unit_norm else queries
    pad_id = pad_id_of(model)
    rows = [(index, *row) for index, pair in enumerate(pairs) for row in query_rows(pair, kind)]
    with example_gradients(model, projector) as compute:
        for start in range(0, len(rows), settings.batch_size):  # rows of several pairs share a batched backward
            chunk = rows[start : start + settings.batch_size]
            batch = collate([(ids, labels) for _, ids, labels, _ in chunk], pad_id, settings.padding_side)
            grads = compute(batch).double().cpu().numpy()  # (rows, k): ∇ NLL each
            for (index, *_, sign), grad in zip(chunk, grads, strict=True):
                queries[index] -= sign * grad  # ∇ log p = −∇ NLL
    return unit(queries) if unit_norm else queries


def unit(rows: np.ndarray) -> np.ndarray:
    """Each row over its norm; a zero row stays zero."""
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return np.divide(rows, norms, out=np.zeros_like(rows), where=norms > 0)
