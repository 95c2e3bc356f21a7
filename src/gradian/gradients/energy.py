"""Each LoRA matrix's share of the projection budget: its gradient energy on a sample of training rows.

Projected separately, matrix m adds a term ⟨P gₘ, P hₘ⟩ of variance ≈ ‖gₘ‖²‖hₘ‖² / kₘ to an inner product of
two examples' features, for kₘ floats of the budget. For a fixed total Σ kₘ the variance is smallest with
kₘ ∝ E‖gₘ‖², the matrix's mean squared gradient norm. The energy of LoRA gradients is concentrated: on
SmolLM2-135M's shape (all-linear, r=8, random weights) the 10 largest of 420 matrices hold 59% of it, and
equal shares give about 24 times the variance of shares by energy.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from gradian.data.render import Rendered
from gradian.gradients.extract import (
    ParameterScale,
    Progress,
    collate,
    dropout_off,
    lora_backward,
    plan_batches,
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
    rows = [i for i, row in enumerate(rendered) if not row.dropped]
    if len(rows) > max_rows:
        picked = np.random.default_rng(settings.seed).choice(len(rows), size=max_rows, replace=False)
        rows = [rows[i] for i in sorted(picked)]
    matrices = lora_matrices(model)
    device = next(model.parameters()).device
    totals = torch.zeros(len(matrices), dtype=torch.float64)

    def on_grad(index: int, grads: torch.Tensor) -> None:  # grads (B, out, in), one LoRA matrix
        if scale is not None:
            grads = grads * scale.tensors[index].to(grads)
        totals[index] += grads.double().square().sum().cpu()

    pad_id = getattr(getattr(model, "config", None), "pad_token_id", None) or 0
    batches = plan_batches({i: len(rendered[i].input_ids) for i in rows}, settings)
    with dropout_off(model):
        for batch_rows in progress(batches) if progress is not None else batches:
            pairs = [(rendered[i].input_ids, rendered[i].labels) for i in batch_rows]
            batch = {k: v.to(device) for k, v in collate(pairs, pad_id, settings.padding_side).items()}
            with capture_gradients(matrices, batch["attention_mask"], on_grad):
                lora_backward(model, matrices, batch)
    return tuple(float(total) / max(len(rows), 1) for total in totals)
