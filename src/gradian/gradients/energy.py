"""Each LoRA matrix's share of the projection budget: its gradient energy on a sample of training rows.

Projected separately, matrix m adds a term ⟨P gₘ, P hₘ⟩ of variance ≈ ‖gₘ‖²‖hₘ‖² / kₘ to an inner product of
two examples' features, for kₘ floats of the budget. For a fixed total Σ kₘ the variance is smallest with
kₘ ∝ E‖gₘ‖², the matrix's mean squared gradient norm. The energy of LoRA gradients is concentrated: on
SmolLM2-135M's shape (all-linear, r=8, random weights) the 10 largest of 420 matrices hold 59% of it, and
equal shares give about 24 times the variance of shares by energy.

The pass computes the sample's exact gradients; extraction projects those (up to `KEEP_BYTES`) once the
shares fix the projection, and writes the side numbers the same backward took (`sides.SideTaker`: the harmful
positions, RepSim), so the sampled rows cost one backward, not two.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from gradian.data.render import Rendered
from gradian.files import atomic_write
from gradian.gradients.batches import Progress, row_batches, sampled_rows
from gradian.gradients.extract import ParameterScale, SampledGradients, example_gradients, make_projector
from gradian.gradients.hooks import lora_matrices
from gradian.gradients.settings import GradientSettings
from gradian.gradients.sides import SideTaker

ENERGY_ROWS = 64  # training rows sampled for the shares
KEEP_BYTES = 1 << 30  # most memory for exact gradients kept to project later: the sample's (here), the queries'
# (`scores.query`)


def gradient_energy(
    model: nn.Module,
    rendered: Sequence[Rendered],
    settings: GradientSettings,
    *,
    max_rows: int = ENERGY_ROWS,
    scale: ParameterScale | None = None,
    progress: Progress | None = None,
    keep_bytes: int = 0,
    taker: SideTaker | None = None,
) -> tuple[tuple[float, ...], SampledGradients | None]:
    """Mean over a seeded sample of trained rows of ‖∇Wₘ‖²_F for every LoRA matrix m, PEFT's order.

    Exact per-example gradients (no projection), scaled by `scale` first when the features will be. The
    gradients of the sample's first batches, up to `keep_bytes`, come back too (None when none fit), with the
    side numbers `taker` takes from the same backward.
    """
    rows = sampled_rows(rendered, settings.seed, max_rows)
    matrices = lora_matrices(model)
    sizes = [m.size for m in matrices]
    totals = torch.zeros(len(matrices), dtype=torch.float64)
    kept_rows: list[int] = []
    kept: list[torch.Tensor] = []
    sides: list[dict[str, np.ndarray]] = []  # per kept batch: side name → (B, width)
    taker = taker or SideTaker(model, matrices)
    with example_gradients(model, scale=scale, matrices=matrices, every_logit=taker.every_logit) as compute, \
            taker.hooks():
        for batch_rows, batch in row_batches(model, rendered, rows, settings, progress):
            flat = compute(batch)  # (B, Σ sizes), exact
            taken = taker.take(batch["attention_mask"])  # every batch: the hooks' buffers are emptied
            totals += torch.stack([part.double().square().sum() for part in flat.split(sizes, dim=1)]).cpu()
            if (len(kept_rows) + len(batch_rows)) * flat.shape[1] * flat.element_size() <= keep_bytes:
                kept_rows += batch_rows
                kept.append(flat.cpu())
                sides.append(taken)
    energy = tuple(float(total) / max(len(rows), 1) for total in totals)
    if not kept:
        return energy, None
    return energy, SampledGradients(kept_rows, kept, SampledGradients.key_of(model, rendered, kept_rows, scale),
                                    {name: np.concatenate([s[name] for s in sides]) for name in taker.along},
                                    dict(taker.along))


def share_budget(
    model: nn.Module,
    rendered: Sequence[Rendered],
    settings: GradientSettings,
    budget: str,
    *,
    scale: ParameterScale | None = None,
    progress: Progress | None = None,
    cache: Path | None = None,
    taker: SideTaker | None = None,
) -> tuple[GradientSettings, SampledGradients | None]:
    """`settings` with the projection budget shared as `--proj-budget` says, and the energy pass's gradients.

    energy: `budget_weights` from `gradient_energy` (unchanged when nothing is projected); size: equal shares.
    With `cache`, the weights are kept in that file, keyed by the adapter, the sampled rows and the scaling: a
    rerun reuses them, so a float that a GPU sums in another order cannot change the projection and void the
    features already stored. The sampled rows' exact gradients come back when this call computed them (else
    None): pass them to `extract_train_features`, which projects them instead of computing them again, and
    writes the side numbers `taker` took from the same backward.
    """
    if budget == "size" or make_projector(model, settings).is_exact:
        return dataclasses.replace(settings, budget_weights=None), None
    key = SampledGradients.key_of(model, rendered, sampled_rows(rendered, settings.seed, ENERGY_ROWS), scale)
    weights, sampled = _cached(cache, key), None
    if weights is None:
        weights, sampled = gradient_energy(model, rendered, settings, scale=scale, progress=progress,
                                           keep_bytes=KEEP_BYTES, taker=taker)
        if cache is not None:
            atomic_write(cache, json.dumps({"key": key, "weights": weights}, indent=1))
    return dataclasses.replace(settings, budget_weights=weights), sampled


def _cached(cache: Path | None, key: dict) -> tuple[float, ...] | None:
    """The weights in `cache` when it holds them for `key`; None when absent, stale or unreadable."""
    try:
        saved = json.loads(cache.read_text()) if cache is not None and cache.exists() else None
        return tuple(float(w) for w in saved["weights"]) if saved and saved["key"] == key else None
    except (ValueError, KeyError, TypeError, OSError):
        return None
