"""What attribution measures against, made once: the failing eval rows' query pairs, the query direction v and the
failing queries' hidden states, and how a row's harm is read.

`stages.query` builds it (on rank 0, sharing with the other ranks what their extraction needs); extraction takes
`query.direction` along its backward (each row's harmful positions) and `query.states` along its forward (each
row's RepSim) as plain inputs, and the ranking reads the rows' harm the way `query.row_harm` names, here and
nowhere else (`settings.row_harm_of` decides it).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from gradian.gradients.batches import collate, pad_id_of
from gradian.gradients.energy import KEEP_BYTES
from gradian.gradients.extract import example_gradients, gradient_dtype
from gradian.gradients.hooks import lora_matrices
from gradian.scores.queries import QueryPair, query_rows
from gradian.scores.relevance import mean_hidden_states


@dataclass
class Query:
    """The failing eval rows attribution traces, and the two plain inputs extraction takes along for the ranking."""

    pairs: list[QueryPair]  # one per failing eval row with a correct answer (rank 0; empty on the other ranks)
    failing: list[Any] = field(default_factory=list)  # their regression rows, in the regression's order
    row_harm: str = "sum"  # how a row's harm is read: positions, tokens or sum (`settings.row_harm_of`)
    direction: list[torch.Tensor] | None = None  # v, one tensor per LoRA matrix, shaped like its weight
    gradients: torch.Tensor | None = None  # (Q, k) each pair's exact q, flat, when kept (`query_gradients`; rank 0)
    states: np.ndarray | None = None  # (Q, d) the failing queries' mean last hidden states, for RepSim

    @property
    def harm_direction(self) -> list[torch.Tensor] | None:
        """v where extraction's backward takes each row's harmful positions along it (row harm `positions`)."""
        return self.direction if self.row_harm == "positions" else None


def query_direction(model: nn.Module, pairs: Sequence[QueryPair], kind: str) -> list[torch.Tensor]:
    """v = Σ_q q / ‖q‖, q = ∇θ f of each pair (f as `scores.queries`), one tensor per LoRA matrix."""
    return query_gradients(model, pairs, kind, keep_bytes=0)[0]


def query_gradients(model: nn.Module, pairs: Sequence[QueryPair], kind: str, *, batch_size: int = 16,
                    keep_bytes: int = KEEP_BYTES) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """(v, the pairs' exact q): v as `query_direction`, and (Q, k) each pair's q = ∇θ f, flat (the LoRA matrices
    concatenated as `extract.per_example_gradients` lays them), on the CPU in the dtype the backward gives, when
    they fit in `keep_bytes` (else None): the scores project them once the projection is known
    (`queries.query_features(exact=)`) instead of running their backward again. Whole pairs share a batched
    backward (at most `batch_size` rows, or one pair's two)."""
    matrices = lora_matrices(model)
    pad_id = pad_id_of(model)
    k = sum(m.size for m in matrices)
    total = torch.zeros(k, dtype=torch.float64)  # (k,) Σ q / ‖q‖
    rows = [query_rows(pair, kind) for pair in pairs]  # per pair, its 0-2 (ids, labels, sign) rows
    dtype = gradient_dtype(matrices)  # as the backward gives them
    kept = torch.zeros((len(pairs), k), dtype=dtype) if len(pairs) * k * dtype.itemsize <= keep_bytes else None
    with example_gradients(model, matrices=matrices) as compute:
        for chunk in _pair_batches(rows, batch_size):
            grads = iter(compute(collate([(ids, labels) for index in chunk for ids, labels, _ in rows[index]],
                                         pad_id)).cpu())  # (B, k) ∇ NLL of each row, the pairs' rows in order
            for index in chunk:
                q = kept[index] if kept is not None else torch.zeros(k, dtype=dtype)  # (k,)
                for *_, sign in rows[index]:
                    q.sub_(next(grads), alpha=sign)  # ∇ log p = −∇ NLL
                norm = float(torch.linalg.vector_norm(q, dtype=torch.float64))
                if norm > 0:
                    total.add_(q, alpha=1.0 / norm)
    direction = [part.view(m.shape).to(m.module.weight)  # the weight's dtype and device
                 for part, m in zip(total.split([m.size for m in matrices]), matrices, strict=True)]
    return direction, kept


def _pair_batches(rows: list[list[Any]], batch_size: int) -> Iterator[list[int]]:
    """Consecutive pairs with rows, at most `batch_size` rows a batch (a pair's rows are never split)."""
    chunk: list[int] = []
    for index, pair_rows in enumerate(rows):
        if not pair_rows:
            continue
        if chunk and sum(len(rows[i]) for i in chunk) + len(pair_rows) > batch_size:
            yield chunk
            chunk = []
        chunk.append(index)
    if chunk:
        yield chunk


def query_states(model: Any, queries: Sequence[Any], *, batch_size: int = 16) -> np.ndarray:
    """(Q, d) the mean last hidden states of each failing prompt with the fine-tuned model's own answer."""
    return mean_hidden_states(model, [list(r.prompt_ids) + list(r.finetuned.ids) for r in queries],
                              batch_size=batch_size)


def failing_queries(regression: Any, pairs: list[Any]) -> list[Any]:
    """The regression rows the queries come from, in the regression's order: what relevance is measured to."""
    chosen = {pair.eval_id for pair in pairs}
    return [row for row in regression.rows if row.id in chosen]

