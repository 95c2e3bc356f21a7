"""The Kronecker projection: seeded, within budget, inner products preserved within the JL tolerance."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradian.gradients.projection import KroneckerProjector, plan_projection

SHAPES = [(4, 96), (96, 4), (4, 64), (32, 4)] * 6  # LoRA A (r, d_in) and B (d_out, r) pairs


def test_budget_is_respected_and_small_gradients_stay_exact():
    assert sum(p.dim for p in plan_projection(SHAPES, 1024)) <= 1024
    exact = plan_projection(SHAPES, 10**6)
    assert all(p.k_rows == p.rows and p.k_cols == p.cols for p in exact)
    assert KroneckerProjector(SHAPES, None, 0).is_exact
    with pytest.raises(ValueError):
        plan_projection(SHAPES, len(SHAPES) - 1)


def test_same_seed_same_projection_other_seed_differs():
    grads = torch.randn(3, 4, 96, dtype=torch.float64)
    a, b, c = (KroneckerProjector(SHAPES, 512, seed).project(0, grads) for seed in (7, 7, 8))
    assert torch.equal(a, b) and not torch.allclose(a, c)


def project_all(projector, grads):
    return torch.cat([projector.project(i, g) for i, g in enumerate(grads)], dim=1)


@pytest.mark.parametrize("proj_dim", [256, 1024])
def test_inner_products_preserved_within_jl_tolerance(proj_dim):
    generator = torch.Generator().manual_seed(0)
    n = 12
    grads = [torch.randn(n, rows, cols, generator=generator, dtype=torch.float64) for rows, cols in SHAPES]
    exact = torch.cat([g.flatten(1) for g in grads], dim=1)
    errors = []
    for seed in range(5):
        projector = KroneckerProjector(SHAPES, proj_dim, seed)
        projected = project_all(projector, grads)
        assert projected.shape == (n, projector.dim) and projector.dim <= proj_dim
        norms = exact.norm(dim=1)
        truth = (exact @ exact.T) / torch.outer(norms, norms)
        errors.append(((projected @ projected.T) / torch.outer(norms, norms) - truth).abs().max().item())
    # JL: |⟨Πa,Πb⟩ − ⟨a,b⟩| ≲ c·√(log n / k)·|a||b|; the structured map is held to c = 4
    assert np.median(errors) < 4 * np.sqrt(np.log(n) / projector.dim)
    assert np.median(errors) > 0  # it is a projection, not the identity


def test_equal_weights_are_the_equal_split_and_weights_set_the_shares():
    assert plan_projection(SHAPES, 700, [2.5] * len(SHAPES)) == plan_projection(SHAPES, 700)
    weights = [100.0] + [1.0] * (len(SHAPES) - 1)  # one matrix holds most of the energy
    plans = plan_projection(SHAPES, 700, weights)
    assert sum(p.dim for p in plans) <= 700 and all(p.dim >= 1 for p in plans)
    assert plans[0].dim == SHAPES[0][0] * SHAPES[0][1], "the heavy matrix fits its share: kept exact"
    assert plans[1].dim < plan_projection(SHAPES, 700)[1].dim, "the light ones give up floats for it"
    with pytest.raises(ValueError):
        plan_projection(SHAPES, 700, [1.0] * (len(SHAPES) - 1))


def test_shares_by_energy_preserve_inner_products_better_when_energy_is_concentrated():
    """Variance Σ‖gₘ‖²‖hₘ‖²/kₘ is smallest with kₘ ∝ energy: measured here against equal shares, float64."""
    generator = torch.Generator().manual_seed(1)
    n, proj_dim = 16, 480
    energy = [10.0 if i % 6 == 0 else 0.1 for i in range(len(SHAPES))]  # 4 of 24 matrices hold 90%
    grads = [torch.randn(n, rows, cols, generator=generator, dtype=torch.float64) * (e / (rows * cols)) ** 0.5
             for (rows, cols), e in zip(SHAPES, energy, strict=True)]
    exact = torch.cat([g.flatten(1) for g in grads], dim=1)
    norms = exact.norm(dim=1)
    truth = (exact @ exact.T) / torch.outer(norms, norms)

    def error(weights) -> float:
        errors = []
        for seed in range(8):
            projected = project_all(KroneckerProjector(SHAPES, proj_dim, seed, weights), grads)
            errors.append(((projected @ projected.T) / torch.outer(norms, norms) - truth).square().mean().item())
        return float(np.mean(errors))

    assert error(energy) < 0.5 * error(None)


def test_factors_moved_to_another_device_in_one_copy_keep_each_matrix_shape_and_order():
    """Off the CPU every factor travels in one buffer, split back per matrix; the meta device checks the split."""
    projector = KroneckerProjector([(8, 64), (64, 8), (4, 4), (16, 48)], proj_dim=96, seed=3)
    for index in range(len(projector.plans)):
        on_cpu = projector.factors(index, torch.device("cpu"), torch.float32)
        moved = projector.factors(index, torch.device("meta"), torch.float32)
        assert [None if f is None else (f.shape, f.dtype) for f in on_cpu] == [
            None if f is None else (f.shape, f.dtype) for f in moved
        ]
        assert all(f is None or f.device.type == "meta" for f in moved)
    assert any(f is not None for i in range(4) for f in projector.factors(i, torch.device("cpu"), torch.float32))
