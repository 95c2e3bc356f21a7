"""Seeded Kronecker projections of LoRA weight gradients (LoGra-style), so a feature fits in a few KB.

A weight gradient G (out, in) is mapped to Lᵀ G R (k_out, k_in) with Gaussian L (out, k_out) and
R (in, k_in) scaled by 1/√k, so E[⟨Lᵀ G₁ R, Lᵀ G₂ R⟩] = ⟨G₁, G₂⟩ (a Johnson–Lindenstrauss map of vec G by
R ⊗ L). A side that fits its share is kept exact (L or R = identity): LoRA's rank side usually is.
The budget `proj_dim` is shared over the matrices by water-filling, in equal shares or in shares by given
weights (gradient energy, see `gradients.energy`): a matrix smaller than its share stays exact, the rest
split what is left; when every LoRA weight fits, nothing is projected. Each matrix's random factors come
from a generator seeded by (seed, matrix index), so shards, reruns and queries use the same projector.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class MatrixPlan:
    """How one weight (rows, cols) is projected: to (k_rows, k_cols); k == side means that side is exact."""

    rows: int
    cols: int
    k_rows: int
    k_cols: int

    @property
    def dim(self) -> int:
        return self.k_rows * self.k_cols

    @property
    def is_exact(self) -> bool:
        return self.dim == self.rows * self.cols


def plan_projection(
    shapes: list[tuple[int, int]], proj_dim: int | None, weights: Sequence[float] | None = None
) -> list[MatrixPlan]:
    """Share `proj_dim` floats over the matrices; None or a budget ≥ the full gradient size = exact.

    Shares follow `weights` (one per matrix, e.g. its mean squared gradient norm: the split that minimises the
    variance of projected inner products is proportional to it), else they are equal. Water-filling: a matrix
    whose share exceeds its size is kept exact and the rest is shared again; every matrix gets at least 1 float.
    """
    sizes = [rows * cols for rows, cols in shapes]
    if proj_dim is None or sum(sizes) <= proj_dim:
        return [MatrixPlan(rows, cols, rows, cols) for rows, cols in shapes]
    if proj_dim < len(shapes):
        raise ValueError(f"proj_dim={proj_dim} is smaller than the number of LoRA matrices ({len(shapes)})")
    if weights is not None and (len(weights) != len(shapes) or not all(w >= 0 for w in weights)):
        raise ValueError(f"need one weight ≥ 0 per LoRA matrix ({len(shapes)}), got {len(weights)}")
    weights = [1.0] * len(shapes) if weights is None or not sum(weights) > 0 else list(weights)
    order = sorted(range(len(shapes)), key=lambda i: sizes[i] / weights[i] if weights[i] > 0 else 0.0)
    alloc, remaining, weight_left = [0] * len(shapes), proj_dim, sum(weights)
    for left, index in enumerate(order):  # the matrices that saturate first go first
        floor = len(shapes) - left - 1  # one float kept for each matrix still to come
        share = int(remaining * weights[index] / weight_left) if weight_left > 0 else 0
        alloc[index] = max(1, min(sizes[index], share, remaining - floor))
        remaining -= alloc[index]
        weight_left -= weights[index]
    return [_fit(rows, cols, budget) for (rows, cols), budget in zip(shapes, alloc, strict=True)]


def _fit(rows: int, cols: int, budget: int) -> MatrixPlan:
    """k_rows·k_cols ≤ budget, the smaller side kept exact when the budget allows it."""
    if rows * cols <= budget:
        return MatrixPlan(rows, cols, rows, cols)
    small, large = sorted((rows, cols))
    k_small = small if small * 2 <= budget else min(small, max(1, math.isqrt(budget)))
    k_large = min(large, max(1, budget // k_small))
    k_rows, k_cols = (k_small, k_large) if rows <= cols else (k_large, k_small)
    return MatrixPlan(rows, cols, k_rows, k_cols)


class KroneckerProjector:
    """Projects per-example weight gradients G (B, rows, cols) of each LoRA matrix to (B, k_rows·k_cols)."""

    def __init__(
        self, shapes: list[tuple[int, int]], proj_dim: int | None, seed: int, weights: Sequence[float] | None = None
    ) -> None:
        self.plans = plan_projection(shapes, proj_dim, weights)
        self.seed = seed
        self.offsets = [0]
        for plan in self.plans:
            self.offsets.append(self.offsets[-1] + plan.dim)
        self._factors: dict[tuple[torch.device, torch.dtype], list[tuple[torch.Tensor | None, ...]]] = {}

    @property
    def dim(self) -> int:
        return self.offsets[-1]

    @property
    def is_exact(self) -> bool:
        return all(plan.is_exact for plan in self.plans)

    def factors(self, index: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor | None, ...]:
        """(L, R) for matrix `index`, None where that side is exact; drawn on CPU so every device agrees."""
        key = (device, dtype)
        if key not in self._factors:
            self._factors[key] = self._draw(device, dtype)
        return self._factors[key][index]

    def _draw(self, device: torch.device, dtype: torch.dtype) -> list[tuple[torch.Tensor | None, ...]]:
        """Every matrix's (L, R) at once, moved to `device` in one copy (one per matrix stalls a GPU hundreds of times)."""
        drawn = [
            tuple(None if k == n else (self._gaussian(index, side, n, k) / math.sqrt(k)).to(dtype)
                  for side, (n, k) in enumerate(((plan.rows, plan.k_rows), (plan.cols, plan.k_cols))))
            for index, plan in enumerate(self.plans)
        ]
        tensors = [factor for pair in drawn for factor in pair if factor is not None]
        if device.type == "cpu" or not tensors:
            return drawn
        moved = iter(torch.cat([t.flatten() for t in tensors]).to(device).split([t.numel() for t in tensors]))
        return [tuple(None if factor is None else next(moved).view(factor.shape) for factor in pair) for pair in drawn]

    def _gaussian(self, index: int, side: int, n: int, k: int) -> torch.Tensor:
        """(n, k) standard normal, from its own generator: seed, matrix index and side fix it."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + 2 * index + side)
        return torch.randn(n, k, generator=generator, dtype=torch.float64)

    def project(self, index: int, grads: torch.Tensor) -> torch.Tensor:
        """(B, rows, cols) → (B, k_rows·k_cols), row-major like `weight.flatten()`."""
        if self.plans[index].is_exact:
            return grads.reshape(grads.shape[0], -1)
        left, right = self.factors(index, grads.device, grads.dtype)
        if right is not None:
            grads = grads @ right  # (B, rows, k_cols)
        if left is not None:
            grads = left.T @ grads  # (B, k_rows, k_cols)
        return grads.reshape(grads.shape[0], -1)

    def project_exact(self, flat: torch.Tensor) -> torch.Tensor:
        """(B, Σ rows·cols) exact gradients, matrices concatenated in plan order → (B, dim), each as `project` maps it."""
        parts = flat.split([plan.rows * plan.cols for plan in self.plans], dim=1)
        return torch.cat([self.project(index, part.reshape(-1, plan.rows, plan.cols))
                          for index, (part, plan) in enumerate(zip(parts, self.plans, strict=True))], dim=1)

    def to_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "dim": self.dim, "plans": [list(vars(plan).values()) for plan in self.plans]}
