"""Where a harmful row does its harm: each supervised token's share of the row's effect.

A row's effect is a sum over its supervised tokens, e_i = −Σ_t qᵀ ∇ℓ_{i,t} (identity preconditioner, the final
adapter), so the token with the largest qᵀ ∇ℓ_{i,t} is where the row pushes the model toward the failure most (a
cut row: the EOS where the answer stops; a fenced row: the opening fence). One number per token is a directional
derivative of that token's loss along the query direction v = Σ_q q / ‖q‖ in the full LoRA parameter space:
J v for the (T,) per-token losses, exact, from one forward pass per batch with v as the LoRA weights' tangent
(forward-mode AD: the memory of a forward pass, where two reverse passes through the vocabulary-sized logits took
1.6 GB per row on SmolLM2-135M); checked against one backward pass per token in float64 in tests/scores/test_token_harm.py:

    harm_{i,t} = vᵀ ∇ℓ_{i,t}

The report shows, for each of its top rows, the token with the largest harm and its share of the row's harm.

Ranking every row wants its harmful part for nearly nothing: `position_harms` splits the row's effect by position
instead of by token, from the backward pass of the row's summed loss (`hooks.capture_positions`): with g_{m,s} the
gradient at LoRA matrix m's output at position s and x_{m,s} its input,

    h_{i,s} = Σ_m g_{m,s}ᵀ V_m x_{m,s},        Σ_s h_{i,s} = vᵀ∇L_i

Position s's part holds its own token's loss (ℓ_s's path through s) and what the later tokens read from s through
attention; a cut row's EOS is its last position, which nothing later reads. It is the backward extraction runs
anyway, so `attribute` takes it there (`gradients.sides`); `position_harms` is that pass on its own. On the suite's
dev half the two splits rank alike (BENCHMARKS.md), and the tokens' forward-mode pass costs more than a training
epoch of its own (it doubles every matmul).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel

from gradian.data.render import IGNORE, Rendered
from gradian.gradients.batches import collate, pad_id_of, plan_batches, row_batches
from gradian.gradients.extract import GradientSettings, dropout_off, lora_backward, trained_logits
from gradian.gradients.hooks import capture_positions, gradient_roots, harmful_part, lora_matrices


def token_harms(model: nn.Module, rows: Sequence[Rendered], direction: list[torch.Tensor], *,
                batch_size: int = 16) -> list[np.ndarray]:
    """Per row, (T_i,) harm vᵀ∇ℓ_t of each supervised token in order (positive: a step on it lowers f)."""
    batches = [list(range(start, min(start + batch_size, len(rows)))) for start in range(0, len(rows), batch_size)]
    return [harm for _, harms in _harm_batches(model, rows, direction, batches) for harm in harms]


def row_harms(model: nn.Module, rows: Sequence[Rendered], direction: list[torch.Tensor], *, batch_size: int = 16,
              bar: Callable[[Iterable, str], Iterable] | None = None) -> np.ndarray:
    """(N,) each row's harm from its harmful tokens alone, H_i = Σ_t max(0, vᵀ∇ℓ_{i,t}) (memory flat in N).

    A row's effect sums its tokens, and a culprit teaches one wrong decision (the early EOS, the opening fence)
    among many right ones (the rest of a valid answer, as its clean neighbours teach): the sum lets the right tokens
    cancel the wrong one, the harmful tokens' part does not (`gradian.scores.combine`, BENCHMARKS.md). Rows are
    batched by length as extraction batches them (`plan_batches`: less padding, a padded-token budget).
    """
    batches: Iterable[list[int]] = plan_batches({i: len(row.input_ids) for i, row in enumerate(rows) if not row.dropped},
                                                GradientSettings(batch_size=batch_size))  # never trained: no harm
    batches = bar(batches, "harm per token") if bar is not None else batches
    out = np.zeros(len(rows))  # (N,)
    for batch, harms in _harm_batches(model, rows, direction, batches):
        out[batch] = [np.clip(harm, 0.0, None).sum() for harm in harms]
    return out


def position_harms(model: nn.Module, rows: Sequence[Rendered], direction: list[torch.Tensor], *,
                   batch_size: int = 16, bar: Callable[[Iterable, str], Iterable] | None = None) -> np.ndarray:
    """(N,) each row's harm from its harmful positions alone, H_i = Σ_s max(0, h_{i,s}) (module docstring), from
    one backward pass per batch of rows, batched by length as extraction batches them (memory flat in N).
    Extraction computes the same in its own backward (`extract_train_features(direction=)`); this is the pass on
    its own, for a store already extracted."""
    out = np.zeros(len(rows))  # (N,)
    for positions, _, h in position_effects(model, rows, direction, batch_size=batch_size, bar=bar):
        out[positions] = harmful_part([h]).cpu().numpy()
    return out


def position_effects(model: nn.Module, rows: Sequence[Rendered], direction: list[torch.Tensor], *,
                     batch_size: int = 16, bar: Callable[[Iterable, str], Iterable] | None = None,
                     ) -> Iterator[tuple[list[int], dict[str, torch.Tensor], torch.Tensor]]:
    """Per batch of trained rows: their positions in `rows`, the batch, and (B, T) h_s, each position's part of the
    row's effect along `direction` summed over the LoRA matrices (a dropped row was never trained: no batch)."""
    matrices = lora_matrices(model)
    parts: list[torch.Tensor] = []  # (B, T) per LoRA matrix, of the current batch

    def progress(batches: Iterable) -> Iterable:
        return bar(batches, "harm per position") if bar is not None else batches

    with dropout_off(model), capture_positions(matrices, direction, parts.append), gradient_roots(matrices) as roots:
        trained = [i for i, row in enumerate(rows) if not row.dropped]
        for positions, batch in row_batches(model, rows, trained, GradientSettings(batch_size=batch_size), progress):
            lora_backward(model, batch, roots)  # the hooks fill `parts`
            yield positions, batch, torch.stack(parts).sum(0)  # (B, T)
            parts.clear()


def _harm_batches(model: nn.Module, rows: Sequence[Rendered], direction: list[torch.Tensor],
                  batches: Iterable[list[int]]) -> Iterator[tuple[list[int], list[np.ndarray]]]:
    """Per batch of row positions, each row's (T_i,) token harms: one forward pass, v the LoRA weights' tangent."""
    matrices = lora_matrices(model)
    name_of = {id(parameter): name for name, parameter in model.named_parameters()}
    pad_id, device = pad_id_of(model), next(model.parameters()).device
    with torch.no_grad(), fwAD.dual_level(), sdpa_kernel(SDPBackend.MATH):  # math: a forward derivative everywhere
        # each LoRA weight carries its part of v as a tangent: the losses' tangent is J v, in one forward pass
        duals = {name_of[id(m.module.weight)]: fwAD.make_dual(m.module.weight, d.to(m.module.weight.dtype))
                 for m, d in zip(matrices, direction, strict=True)}
        for positions in batches:
            chunk = [rows[i] for i in positions]
            batch = {key: value.to(device) for key, value in collate([(r.input_ids, r.labels) for r in chunk],
                                                                      pad_id).items()}
            logits, labels = trained_logits(model, batch, forward=lambda **inputs: functional_call(
                model, duals, args=(), kwargs=inputs))  # (B, K, V) dual, at the trained positions; (B, K)
            mask = labels != IGNORE
            logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
            losses = F.cross_entropy(logits.transpose(1, 2), labels.clamp(min=0), reduction="none")  # (B, K)
            harm = fwAD.unpack_dual(losses).tangent  # (B, K) vᵀ∇ℓ_t
            yield positions, [harm[b][mask[b]].double().cpu().numpy() for b in range(len(chunk))]


def harm_token(tokenizer: Any, row: Rendered, harm: np.ndarray) -> dict[str, Any] | None:
    """The token where `row` does most harm: its position among the supervised tokens (from 1), its text, its share."""
    positive = np.clip(harm, 0.0, None)
    if positive.sum() <= 0:
        return None
    j = int(np.argmax(harm))
    targets = [label for label in row.labels[1:] if label != IGNORE]
    return {"position": j + 1, "of": len(targets), "token": tokenizer.decode([targets[j]]),
            "share": float(positive[j] / positive.sum())}
