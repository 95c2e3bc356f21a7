"""K-FAC factors equal a naive per-token float64 reference; KFAC/EKFAC equal their dense Kronecker solves."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model
from scipy.linalg import block_diag

from conftest import make_tiny_model
from gradian.curvature.factors import fit_factors
from gradian.curvature.kfac import EKFAC, KFAC
from gradian.data.render import IGNORE, Rendered
from gradian.gradients.batches import collate
from gradian.gradients.extract import make_projector, per_example_gradients, summed_nll
from gradian.gradients.hooks import lora_matrices
from gradian.gradients.settings import GradientSettings

torch.set_num_threads(2)
PROJ_DIMS = [None, 300, 84]  # exact; one side projected per matrix; both sides projected


@pytest.fixture(scope="module")
def model(tiny_tokenizer):
    base = make_tiny_model(tiny_tokenizer, seed=2, dtype=torch.float64)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    return get_peft_model(base, config)


@pytest.fixture(scope="module")
def rendered(tiny_tokenizer):
    generator = torch.Generator().manual_seed(3)
    rows = []
    for i, n in enumerate((9, 4, 14, 6, 11, 7, 5, 12)):
        ids = torch.randint(4, len(tiny_tokenizer), (n,), generator=generator).tolist()
        cut = n // 2
        rows.append(Rendered(f"r{i}", ids, [IGNORE] * cut + ids[cut:], n, cut, dropped=i == 5))
    return rows


def naive(model, rendered, projector):
    """Unpadded batch-1 autograd with retain_grad: per-matrix A, S and per-example projected gradients Ĝ_i."""
    matrices = lora_matrices(model)
    seen: dict[int, tuple] = {}

    def keep(index):
        def hook(module, inputs, output):
            output.retain_grad()
            seen[index] = (inputs[0], output)

        return hook

    hooks = [m.module.register_forward_hook(keep(i)) for i, m in enumerate(matrices)]
    sums_a = [np.zeros((p.k_cols, p.k_cols)) for p in projector.plans]
    sums_s = [np.zeros((p.k_rows, p.k_rows)) for p in projector.plans]
    per_example, tokens, rows = [], 0, [row for row in rendered if not row.dropped]
    model.eval()
    for row in rows:
        summed_nll(model(input_ids=torch.tensor([row.input_ids])).logits, torch.tensor([row.labels])).backward()
        feature = []
        for i in range(len(projector.plans)):
            left, right = projector.factors(i, torch.device("cpu"), torch.float64)
            x, g = seen[i][0][0].detach(), seen[i][1].grad[0]  # (T, in), (T, out)
            x_hat = (x if right is None else x @ right).numpy()  # (T, k_cols)
            g_hat = (g if left is None else g @ left).numpy()  # (T, k_rows)
            sums_a[i] += x_hat.T @ x_hat
            sums_s[i] += g_hat.T @ g_hat
            feature.append((g_hat.T @ x_hat).ravel())  # Ĝ_i = Σ_t ĝ x̂ᵀ, row-major
        per_example.append(np.concatenate(feature))
        tokens += len(row.input_ids)
        model.zero_grad()
    for hook in hooks:
        hook.remove()
    return [a / tokens for a in sums_a], [s / len(rows) for s in sums_s], np.stack(per_example)


def spans(projector):
    """(starts, stops) of every matrix's block in a feature."""
    return projector.offsets[:-1], projector.offsets[1:]


def settings(proj_dim, side="right"):
    return GradientSettings(proj_dim=proj_dim, batch_size=3, padding_side=side)


@pytest.mark.parametrize("proj_dim,side", [(None, "right"), (300, "left"), (84, "right")])
def test_factors_equal_naive_per_token_reference(model, rendered, proj_dim, side):
    projector = make_projector(model, settings(proj_dim))
    factors = fit_factors(model, rendered, projector, settings(proj_dim, side))
    activations, gradients, per_example = naive(model, rendered, projector)
    assert factors.n_rows == 7 and factors.n_tokens == sum(len(r.input_ids) for r in rendered if not r.dropped)
    for got, expected in zip(factors.activations + factors.gradients, activations + gradients, strict=True):
        assert np.allclose(got, expected, rtol=1e-9, atol=1e-13)
        assert np.trace(expected) > 0
    # the naive Ĝ_i are the features extraction stores: the reference sits in the same space
    batch = collate([(r.input_ids, r.labels) for r in rendered if not r.dropped], 0)
    assert np.allclose(per_example_gradients(model, batch, projector).numpy(), per_example, rtol=1e-9, atol=1e-12)
    if proj_dim is not None:
        plans = projector.plans
        assert any(p.k_rows < p.rows for p in plans) and any(p.k_cols < p.cols for p in plans)


def dense_kfac(activations, gradients, ratio):
    blocks = []
    for a, s in zip(activations, gradients, strict=True):
        fisher = np.kron(s, a)  # row-major vec of (k_rows, k_cols): vec(S X A) = (S ⊗ A) vec X
        damping = ratio * np.trace(s) * np.trace(a) / len(fisher)  # ratio × mean eigenvalue of S ⊗ A
        blocks.append(fisher + damping * np.eye(len(fisher)))
    return block_diag(*blocks)


@pytest.mark.parametrize("proj_dim", PROJ_DIMS)
def test_kfac_equals_dense_kronecker_solve(model, rendered, proj_dim):
    projector = make_projector(model, settings(proj_dim))
    activations, gradients, _ = naive(model, rendered, projector)
    factors = fit_factors(model, rendered, projector, settings(proj_dim))
    queries = np.random.default_rng(0).standard_normal((3, projector.dim))
    kfac = KFAC(factors, projector, damping_ratio=0.1)
    assert kfac.damping is None
    got = kfac.fit(iter(())).apply(queries)
    expected = np.linalg.solve(dense_kfac(activations, gradients, 0.1), queries.T).T
    assert np.allclose(got, expected, rtol=1e-7, atol=1e-10 * np.abs(expected).max())


@pytest.mark.parametrize("proj_dim", PROJ_DIMS)
def test_ekfac_equals_dense_eigenvalue_corrected_solve(model, rendered, proj_dim):
    projector = make_projector(model, settings(proj_dim))
    activations, gradients, per_example = naive(model, rendered, projector)
    factors = fit_factors(model, rendered, projector, settings(proj_dim))
    bases = [np.kron(np.linalg.eigh(s)[1], np.linalg.eigh(a)[1]) for a, s in zip(activations, gradients, strict=True)]
    rotated = [per_example[:, lo:hi] @ basis for basis, lo, hi in zip(bases, *spans(projector), strict=True)]
    lambdas = [np.mean(r**2, axis=0) for r in rotated]  # naive per-example second moment in the eigenbasis
    inverse = block_diag(
        *[b @ np.diag(1 / (lam + 0.1 * lam.mean())) @ b.T for b, lam in zip(bases, lambdas, strict=True)]
    )
    queries = np.random.default_rng(1).standard_normal((3, projector.dim))
    chunks = [per_example[:4], np.zeros((2, projector.dim)), per_example[4:]]  # zero rows = dropped: not counted
    got = EKFAC(factors, projector, damping_ratio=0.1).fit(iter(chunks)).apply(queries)
    expected = queries @ inverse
    assert np.allclose(got, expected, rtol=1e-7, atol=1e-10 * np.abs(expected).max())


def test_ekfac_eigenvalues_keep_the_trace_and_huge_damping_is_blockwise_identity(model, rendered):
    projector = make_projector(model, settings(300))
    factors = fit_factors(model, rendered, projector, settings(300))
    _, _, per_example = naive(model, rendered, projector)
    ekfac = EKFAC(factors, projector, damping_ratio=1e9).fit([per_example])
    for m, (lo, hi) in enumerate(zip(*spans(projector), strict=True)):
        # an orthogonal rotation keeps E‖Ĝ_m‖², so Σ Λ_m is the Fisher block's trace
        assert np.isclose(ekfac.eigenvalues[m].sum(), np.mean(np.sum(per_example[:, lo:hi] ** 2, axis=1)), rtol=1e-9)
    queries = np.random.default_rng(2).standard_normal((4, projector.dim))
    got = ekfac.apply(queries)
    for m, (lo, hi) in enumerate(zip(*spans(projector), strict=True)):
        assert np.allclose(got[:, lo:hi] * ekfac.damping[m], queries[:, lo:hi], rtol=1e-6, atol=1e-8)
    light = EKFAC(factors, projector, damping_ratio=1e-3).fit([per_example])
    hi = projector.offsets[1]
    assert not np.allclose(light.apply(queries)[:, :hi] * light.damping[0], queries[:, :hi], rtol=1e-2)


def test_max_rows_samples_deterministically(model, rendered):
    projector = make_projector(model, settings(300))
    first = fit_factors(model, rendered, projector, settings(300), max_rows=4)
    again = fit_factors(model, rendered, projector, settings(300), max_rows=4)
    assert first.n_rows == 4 and first.n_tokens < sum(len(r.input_ids) for r in rendered)
    assert all(np.array_equal(a, b) for a, b in zip(first.gradients, again.gradients, strict=True))
