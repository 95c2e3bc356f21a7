"""Each preconditioner equals its dense float64 reference on a tiny model; scoring chunked == unchunked."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model

from conftest import make_tiny_model
from gradian.curvature import Identity, adam
from gradian.curvature.gauss_newton import GaussNewton
from gradian.data.render import IGNORE
from gradian.errors import InputError
from gradian.gradients.batches import collate
from gradian.gradients.extract import per_example_gradients
from gradian.scores.scoring import score_features, total_effect

torch.set_num_threads(2)


@pytest.fixture
def model(tiny_tokenizer):
    base = make_tiny_model(tiny_tokenizer, seed=4, dtype=torch.float64)
    return get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False))


def batch(vocab, n, seed=0):
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        ids = torch.randint(4, vocab, (3 + i % 4,), generator=generator).tolist()
        rows.append((ids, [IGNORE] + ids[1:]))
    return collate(rows, 0)


def trained_optimizer(model, vocab, path):
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    for step in range(3):
        data = batch(vocab, 4, seed=10 + step)
        loss = model(**{k: data[k] for k in ("input_ids", "attention_mask")}, labels=data["labels"]).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    torch.save(optimizer.state_dict(), path)
    return optimizer


def test_adam_scale_equals_dense_reference(model, tiny_tokenizer, tmp_path):
    optimizer = trained_optimizer(model, len(tiny_tokenizer), tmp_path / "optimizer.pt")
    scale = adam(tmp_path / "optimizer.pt", model)
    params = [p for p in model.parameters() if p.requires_grad]
    beta2, eps = optimizer.param_groups[0]["betas"][1], optimizer.param_groups[0]["eps"]
    dense = []
    for p in params:
        state = optimizer.state[p]
        v_hat = state["exp_avg_sq"].double() / (1 - beta2 ** float(state["step"]))
        dense.append((1 / (v_hat.sqrt() + eps)).flatten())
    diag = torch.cat(dense)
    data = batch(len(tiny_tokenizer), 5)
    exact = per_example_gradients(model, data)
    scaled = per_example_gradients(model, data, scale=scale)
    assert torch.allclose(scaled, exact * diag, rtol=1e-9, atol=1e-12)
    queries = np.random.default_rng(0).normal(size=(3, exact.shape[1]))
    expected = -(queries @ np.diag(diag.numpy()) @ exact.numpy().T)
    assert np.allclose(score_features(scaled.numpy(), queries), expected, rtol=1e-9)


def test_adam_rejects_another_runs_optimizer(model, tmp_path):
    torch.save({"state": {0: {"exp_avg_sq": torch.ones(3, 3)}}, "param_groups": [{"params": [0]}]}, tmp_path / "o.pt")
    with pytest.raises(InputError, match="optimizer state holds 1"):
        adam(tmp_path / "o.pt", model)
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(InputError):
        adam(tmp_path / "bad.pt", model)


def rescaled(pq: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Scoring gives every preconditioned query its query's norm back, so no query dominates the mean."""
    return pq / np.linalg.norm(pq, axis=1, keepdims=True) * np.linalg.norm(q, axis=1, keepdims=True)


@pytest.mark.parametrize("n", [6, 400])  # fewer rows than features (kernel form) and more (primal form)
def test_gauss_newton_equals_dense_inverse(model, tiny_tokenizer, n):
    rng = np.random.default_rng(n)
    k = 48
    phi = rng.normal(size=(n, k)) * np.linspace(0.1, 3, k)
    queries = rng.normal(size=(4, k))
    gn = GaussNewton(damping_ratio=0.1).fit([phi[: n // 2], phi[n // 2 :]])
    hessian = phi.T @ phi / n
    nonzero = np.linalg.eigvalsh(hessian)[-min(n, k) :]
    lam = 0.1 * nonzero.mean()
    assert np.isclose(gn.damping, lam)
    expected = -(rescaled(queries @ np.linalg.inv(hessian + lam * np.eye(k)), queries) @ phi.T)
    assert np.allclose(score_features(phi, queries, preconditioner=gn, chunk_rows=7), expected, rtol=1e-8, atol=1e-10)


def test_gauss_newton_on_real_gradients(model, tiny_tokenizer):
    phi = per_example_gradients(model, batch(len(tiny_tokenizer), 9)).numpy()
    q = per_example_gradients(model, batch(len(tiny_tokenizer), 2, seed=5)).numpy()
    hessian = phi.T @ phi / len(phi)
    lam = 0.1 * np.trace(hessian) / len(phi)
    expected = -(rescaled(np.linalg.solve(hessian + lam * np.eye(len(hessian)), q.T).T, q) @ phi.T)
    assert np.allclose(score_features(phi, q, preconditioner=GaussNewton()), expected, rtol=1e-6, atol=1e-8)


def test_scoring_chunked_equals_unchunked_and_unit_norm():
    rng = np.random.default_rng(1)
    train, queries = rng.normal(size=(50, 16)), rng.normal(size=(3, 16))
    whole = score_features(train, queries, chunk_rows=1000)
    assert np.allclose(score_features(train, queries, chunk_rows=7), whole)
    assert np.allclose(whole, -(queries @ train.T), atol=1e-5)
    normed = score_features(train, queries, unit_norm_train=True, preconditioner=Identity(), chunk_rows=9)
    assert np.allclose(normed, whole / np.linalg.norm(train, axis=1), atol=1e-5)
    assert np.allclose(total_effect(whole), whole.mean(0))
