"""What attribution measures against, made once: the failing eval rows' query pairs, the query direction v and the
failing queries' hidden states, and how a row's harm is read.

`stages.query` builds it (on rank 0, sharing with the other ranks what their extraction needs); extraction takes
`query.direction` along its backward (each row's harmful positions) and `query.states` along its forward (each
row's RepSim) as plain inputs, and the ranking reads the rows' harm the way `query.row_harm` names, here and
nowhere else (`settings.row_harm_of` decides it).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from gradian.gradients.batches import collate, pad_id_of
from gradian.gradients.extract import summed_nll
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
    states: np.ndarray | None = None  # (Q, d) the failing queries' mean last hidden states, for RepSim

    @property
    def harm_direction(self) -> list[torch.Tensor] | None:
        """v where extraction's backward takes each row's harmful positions along it (row harm `positions`)."""
        return self.direction if self.row_harm == "positions" else None


def query_direction(model: nn.Module, pairs: Sequence[QueryPair], kind: str) -> list[torch.Tensor]:
    """v = Σ_q q / ‖q‖, q = ∇θ f of each pair (f as `scores.queries`), one tensor per LoRA matrix."""
    weights = [m.module.weight for m in lora_matrices(model)]
    pad_id = pad_id_of(model)
    total = [torch.zeros_like(w, dtype=torch.float64) for w in weights]
    for pair in pairs:
        rows = query_rows(pair, kind)
        if not rows:
            continue
        batch = to_model(collate([(ids, labels) for ids, labels, _ in rows], pad_id), model)
        with requires_grad(weights):
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                           position_ids=batch["position_ids"]).logits  # (R, T, V)
            margin = torch.stack([-sign * summed_nll(logits[r : r + 1], batch["labels"][r : r + 1])
                                  for r, (_, _, sign) in enumerate(rows)]).sum()  # f = Σ sign · log p
            grads = torch.autograd.grad(margin, weights)
        norm = torch.stack([(g.double() ** 2).sum() for g in grads]).sum().sqrt()
        if norm > 0:
            for acc, g in zip(total, grads, strict=True):
                acc += g.double() / norm
    return [t.to(w.dtype) for t, w in zip(total, weights, strict=True)]


def query_states(model: Any, queries: Sequence[Any], *, batch_size: int = 16) -> np.ndarray:
    """(Q, d) the mean last hidden states of each failing prompt with the fine-tuned model's own answer."""
    return mean_hidden_states(model, [list(r.prompt_ids) + list(r.finetuned.ids) for r in queries],
                              batch_size=batch_size)


def failing_queries(regression: Any, pairs: list[Any]) -> list[Any]:
    """The regression rows the queries come from, in the regression's order: what relevance is measured to."""
    chosen = {pair.eval_id for pair in pairs}
    return [row for row in regression.rows if row.id in chosen]


def to_model(batch: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """The batch's tensors on the model's device."""
    device = next(model.parameters()).device
    return {key: value.to(device) for key, value in batch.items()}


@contextmanager
def requires_grad(weights: list[torch.Tensor]) -> Iterator[None]:
    """The weights require gradients inside, as they did before after."""
    before = [w.requires_grad for w in weights]
    for w in weights:
        w.requires_grad_(True)
    try:
        yield
    finally:
        for w, b in zip(weights, before, strict=True):
            w.requires_grad_(b)
