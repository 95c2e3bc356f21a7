"""Each LoRA matrix's share of the projection budget: its gradient energy on a sample of training rows.

Projected separately, matrix m adds a term ⟨P gₘ, P hₘ⟩ of variance ≈ ‖gₘ‖²‖hₘ‖² / kₘ to an inner product of
two examples' features, for kₘ floats of the budget. For a fixed total Σ kₘ the variance is smallest with
kₘ ∝ E‖gₘ‖², the matrix's mean squared gradient norm. The energy of LoRA gradients is concentrated: on
SmolLM2-135M's shape (all-linear, r=8, random weights) the 10 largest of 420 matrices hold 59% of it, and
equal shares give about 24 times the variance of shares by energy.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from gradian.data.render import Rendered
from gradian.gradients.extract import (
    ParameterScale,
    Progress,
    dropout_off,
    lora_backward,
    make_projector,
    row_batches,
    sampled_rows,
)
from gradian.gradients.hooks import capture_gradients, lora_matrices
from gradian.gradients.settings import GradientSettings


def gradient_energy(
    model: nn.Module,
    rendered: list[Rendered],
    settings: GradientSettings,
    *,
    max_rows: int = 64,
    scale: ParameterScale | None = None,
    progress: Progress | None = None,
) -> tuple[float, ...]:
    """Mean over a seeded sample of trained rows of ‖∇Wₘ‖²_F for every LoRA matrix m, PEFT's order.

    Exact per-example gradients (no projection), scaled by `scale` first when the features will be.
    """
    rows = sampled_rows(rendered, settings.seed, max_rows)
    matrices = lora_matrices(model)
    totals = torch.zeros(len(matrices), dtype=torch.float64)

    def on_grad(index: int, grads: torch.Tensor) -> None:  # grads (B, out, in), one LoRA matrix
        if scale is not None:
            grads = grads * scale.tensors[index].to(grads)
        totals[index] += grads.double().square().sum().cpu()

    with dropout_off(model):
        for batch in row_batches(model, rendered, rows, settings, progress):
            with capture_gradients(matrices, batch["attention_mask"], on_grad):
                lora_backward(model, matrices, batch)
    return tuple(float(total) / max(len(rows), 1) for total in totals)


def shared_by_energy(
    model: nn.Module,
    rendered: list[Rendered],
    settings: GradientSettings,
    *,
    scale: ParameterScale | None = None,
    progress: Progress | None = None,
) -> GradientSettings:
    """`settings` with `budget_weights` from `gradient_energy`; unchanged when nothing is projected."""
    if make_projector(model, settings).is_exact:
        return settings
    weights = gradient_energy(model, rendered, settings, scale=scale, progress=progress)
    return dataclasses.replace(settings, budget_weights=weights)
