"""K-FAC factors of every LoRA matrix in the projected space the feature store holds, from one batched pass.

For matrix m the stored feature of example i is vec Ĝ_i with Ĝ_i = Σ_t ĝ_t x̂_tᵀ, ĝ_t = Lᵀ g_t (k_rows) and
x̂_t = Rᵀ x_t (k_cols), L and R the projector's factors (identity on an exact side). K-FAC approximates
E_i[vec Ĝ_i vec Ĝ_iᵀ] by S ⊗ A (row-major vec, like `weight.flatten()`), with

    A = Σ_tokens x̂ x̂ᵀ / n_tokens      (k_cols, k_cols), every non-padding token (as Kronfluence counts them)
    S = Σ_tokens ĝ ĝᵀ / n_rows        (k_rows, k_rows), i.e. the per-token mean × mean tokens per row

so that, tokens taken as independent, S ⊗ A ≈ E_i[Σ_t (ĝ_t ĝ_tᵀ) ⊗ (x̂_t x̂_tᵀ)] has the magnitude of the
per-example Fisher. A token whose g is zero (one that no supervised token depends on) adds nothing to S but
still counts in A: inputs to a layer are shared by every loss downstream, and it keeps A independent of where
the labels fall. Accumulated in float64; dropout off, losses as extraction sums them (`summed_nll`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from gradian.data.render import Rendered
from gradian.gradients.batches import Progress, row_batches, sampled_rows
from gradian.gradients.extract import dropout_off, lora_backward
from gradian.gradients.hooks import LoraMatrix, gradient_roots, lora_matrices
from gradian.gradients.projection import KroneckerProjector
from gradian.gradients.settings import GradientSettings


@dataclass
class KroneckerFactors:
    """Per LoRA matrix, in PEFT's order: A (k_cols, k_cols) and S (k_rows, k_rows), float64."""

    activations: list[np.ndarray]
    gradients: list[np.ndarray]
    n_rows: int
    n_tokens: int


def fit_factors(
    model: nn.Module,
    rendered: Sequence[Rendered],
    projector: KroneckerProjector,
    settings: GradientSettings,
    progress: Progress | None = None,
    max_rows: int | None = None,
) -> KroneckerFactors:
    """A and S of every LoRA matrix over the trained rows (`dropped` skipped); `max_rows` = a seeded sample."""
    rows = sampled_rows(rendered, settings.seed, max_rows)
    matrices = lora_matrices(model)
    device = next(model.parameters()).device
    sums_a = [torch.zeros(p.k_cols, p.k_cols, dtype=torch.float64, device=device) for p in projector.plans]
    sums_s = [torch.zeros(p.k_rows, p.k_rows, dtype=torch.float64, device=device) for p in projector.plans]
    n_tokens = 0
    with dropout_off(model), gradient_roots(matrices) as roots:  # as extraction
        for _, batch in row_batches(model, rendered, rows, settings, progress):
            _accumulate(model, matrices, projector, batch, roots, sums_a, sums_s)
            n_tokens += int(batch["attention_mask"].sum())
    return KroneckerFactors(
        activations=[(a / max(n_tokens, 1)).cpu().numpy() for a in sums_a],
        gradients=[(s / max(len(rows), 1)).cpu().numpy() for s in sums_s],
        n_rows=len(rows),
        n_tokens=n_tokens,
    )


def _accumulate(
    model: nn.Module,
    matrices: list[LoraMatrix],
    projector: KroneckerProjector,
    batch: dict[str, torch.Tensor],
    roots: list[torch.Tensor],
    sums_a: list[torch.Tensor],
    sums_s: list[torch.Tensor],
) -> None:
    """One forward/backward of the summed NLL; hooks add Σ x̂x̂ᵀ (forward) and Σ ĝĝᵀ (backward) per matrix."""
    mask = batch["attention_mask"].to(torch.float64)[..., None]  # (B, T, 1)

    def add(total: torch.Tensor, values: torch.Tensor, side: torch.Tensor | None) -> None:
        values = values.to(torch.float64)  # (B, T, n)
        values = values if side is None else values @ side  # (B, T, k)
        flat = values.reshape(-1, values.shape[-1])  # (B·T, k)
        total += flat.T @ flat  # (k, k)

    def forward_hook(index: int):
        left, right = projector.factors(index, mask.device, torch.float64)

        def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            # x (B, T, in) → x̂ (B, T, k_cols); padding's x is not zero, so it is masked (g is zero there already)
            add(sums_a[index], inputs[0].detach().to(torch.float64) * mask, right)
            if output.requires_grad:
                output.register_hook(lambda g: add(sums_s[index], g, left))  # g (B, T, out) → ĝ (B, T, k_rows)

        return hook

    handles = [m.module.register_forward_hook(forward_hook(i)) for i, m in enumerate(matrices)]
    try:
        lora_backward(model, batch, roots)
    finally:
        for handle in handles:
            handle.remove()
