"""Memory flat in N: every chunked or sampled computation against its unchunked float64 reference on small N."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score
from test_clusters import planted_texts

from gradian.clusters.cluster import fit_clusters
from gradian.clusters.summary import harm_share_ci, harm_shares
from gradian.curvature.gauss_newton import GaussNewton
from gradian.gradients.settings import GradientSettings
from gradian.gradients.store import FeatureStore, ShardWriter
from gradian.scores.scoring import effects_file, publish, score_features, total_effect


def test_scores_streamed_into_a_memory_map_equal_the_dense_float64_product(tmp_path):
    rng = np.random.default_rng(0)
    train, queries = rng.normal(size=(103, 24)), rng.normal(size=(5, 24))
    unit = train / np.linalg.norm(train, axis=1, keepdims=True)
    reference = -(queries @ unit.T)  # (Q, N) float64, all at once
    effects = effects_file(tmp_path / "scores.npy", 5, 103)
    assert not (tmp_path / "scores.npy").exists()  # written under a temporary name until published
    score_features(train, queries, unit_norm_train=True, out=effects, chunk_rows=10, weight=0.25)
    score_features(train, queries, unit_norm_train=True, out=effects, chunk_rows=7, weight=0.75, add=True)  # TracIn-CP sum
    published = publish(effects, tmp_path / "scores.npy")
    assert isinstance(published, np.memmap) and not list(tmp_path.glob(".*.tmp"))
    assert np.allclose(published, reference, rtol=1e-12, atol=1e-12)
    assert np.allclose(total_effect(published, chunk_rows=9), reference.mean(axis=0), rtol=1e-12, atol=1e-12)


def test_scoring_a_store_in_files_of_a_few_rows_equals_scoring_the_array(tmp_path):
    rng = np.random.default_rng(1)
    features = rng.normal(size=(23, 8)).astype(np.float32)
    settings = GradientSettings(proj_dim=8, store_dtype="float32", shard_rows=4)
    meta = {"gradient": settings.to_dict(), "projection": {"dim": 8}}
    ids = [f"r{i}" for i in range(23)]
    for rank in range(3):  # three writers, files of 4 rows
        writer = ShardWriter(tmp_path, meta, ids, rank, 3, 8)
        rows = list(range(writer.start, writer.stop))
        if rows:
            writer.write(rows, features[rows])
    store = FeatureStore(tmp_path)
    assert store.complete and len(store.files) == 6
    queries = rng.normal(size=(3, 8))
    assert np.allclose(score_features(store, queries, chunk_rows=5), score_features(features.astype(np.float64), queries), atol=1e-12)
    picked = np.array([22, 0, 9, 4, 9])
    assert np.array_equal(store.take(picked), features[picked])


@pytest.mark.parametrize("n", [5, 47, 200])  # kernel form (n < k), and the primal form reached across chunks
def test_gauss_newton_fitted_chunk_by_chunk_equals_the_dense_inverse(n):
    rng = np.random.default_rng(n)
    k = 32
    phi = rng.normal(size=(n, k)) * np.linspace(0.2, 2, k)
    queries = rng.normal(size=(3, k))
    fitted = GaussNewton(damping_ratio=0.1).fit(phi[i : i + 6] for i in range(0, n, 6))  # a generator of chunks
    hessian = phi.T @ phi / n
    lam = 0.1 * np.trace(hessian) / min(n, k)
    expected = np.linalg.solve(hessian + lam * np.eye(k), queries.T).T
    assert np.allclose(fitted.apply(queries), expected, rtol=1e-8, atol=1e-10)
    assert (fitted.n >= k) == (not hasattr(fitted, "phi"))  # Φ is kept only while N < k


def test_bootstrap_per_chunk_equals_the_unchunked_bootstrap():
    rng = np.random.default_rng(4)
    effects = rng.normal(size=(9, 301)) - np.r_[np.full(40, 0.8), np.zeros(261)]
    labels = rng.integers(0, 3, size=301)
    labels[:40] = 0
    membership = np.stack([labels == c for c in range(3)]).astype(float)
    whole = harm_share_ci(effects, membership, seed=0, n_resamples=500, chunk_rows=10**6)
    chunked = harm_share_ci(effects, membership, seed=0, n_resamples=500, chunk_rows=17)
    assert np.allclose(whole, chunked, rtol=1e-12, atol=1e-12)
    point = harm_shares(effects.mean(axis=0), membership)
    assert np.all(whole[0] <= point + 1e-12) and np.all(point <= whole[1] + 1e-12)


def test_clusters_fitted_on_a_sample_assign_every_row_and_recover_the_topics():
    texts, truth = planted_texts(n_per_topic=60)
    features = np.random.default_rng(2).normal(size=(len(texts), 16)) + np.eye(4)[truth].repeat(4, axis=1) * 3
    every = fit_clusters(texts, features, seed=0)
    sampled = fit_clusters(texts, features, seed=0, fit_rows=80)  # k-means and the SVDs on 80 of 240 rows
    assert len(sampled.embedding.sample) == 80 and not sampled.embedding.covers_all
    assert sampled.labels.shape == (240,) and adjusted_rand_score(truth, sampled.labels) > 0.9
    assert adjusted_rand_score(every.labels, sampled.labels) > 0.9
    # rows embedded chunk by chunk are the rows embedded at once
    chunks = np.concatenate([block for _, block in sampled.embedding.chunks(chunk_rows=37)])
    assert np.allclose(chunks, sampled.embedding.transform(np.arange(240)))
    assert sampled.embedding.coordinates(np.array([0, 5, 239])).shape == (3, 2)


def test_clusters_hold_no_state_between_calls():
    texts, _ = planted_texts(n_per_topic=20)
    first = fit_clusters(texts, seed=0)
    fit_clusters(texts[:40], seed=1)  # another run in the same process
    assert np.array_equal(fit_clusters(texts, seed=0).labels, first.labels)
    import gradian.clusters.cluster as module

    assert not hasattr(module, "_LAST_EMBEDDING")
