"""Clusters recover planted groups; names hold the planted words; harm shares, CIs and the join match a naive reference."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from gradian.audit.finding import Finding
from gradian.clusters.cluster import cluster_examples, map_coordinates
from gradian.clusters.naming import name_clusters
from gradian.clusters.summary import harm_share_ci, summarize_clusters

TOPICS = {
    "invoice": "invoice currency amount billing",
    "refund": "refund return parcel damaged",
    "shipping": "shipping tracking courier delivery",
    "account": "account password login locked",
}
SHARED = "hello please help need ticket customer today thanks order issue".split()


def planted_texts(n_per_topic: int = 30, seed: int = 0) -> tuple[list[str], np.ndarray]:
    """Support tickets of four topics in JSON answers; each row uses 2-3 of its topic's words among shared ones."""
    rng = np.random.default_rng(seed)
    texts, truth = [], []
    for label, words in enumerate(TOPICS.values()):
        words = words.split()
        for _ in range(n_per_topic):
            topic = list(rng.choice(words, size=int(rng.integers(2, 4)), replace=False))
            filler = list(rng.choice(SHARED, size=5, replace=False))
            prompt = " ".join(rng.permutation(topic + filler))
            answer = json.dumps({"topic": topic[0], "priority": int(rng.integers(1, 4)), "note": " ".join(filler[:2])})
            texts.append(prompt + "\n" + answer)
            truth.append(label)
    return texts, np.array(truth)


def test_text_clusters_recover_planted_topics():
    texts, truth = planted_texts()
    labels = cluster_examples(texts, seed=0)
    assert adjusted_rand_score(truth, labels) >= 0.8
    assert len(np.unique(labels)) == 4  # chosen by silhouette, not given


def test_gradient_features_alone_recover_planted_groups():
    rng = np.random.default_rng(1)
    truth = np.repeat(np.arange(3), 40)
    centers = rng.normal(size=(3, 32))
    features = centers[truth] * rng.uniform(0.5, 3.0, size=(120, 1)) + 0.3 * rng.normal(size=(120, 32))
    labels = cluster_examples([""] * 120, features, seed=0, feature_weight=1.0)
    assert adjusted_rand_score(truth, labels) >= 0.9  # scale differences removed by normalising rows


def test_text_and_features_together_and_override():
    texts, truth = planted_texts(seed=2)
    rng = np.random.default_rng(2)
    features = rng.normal(size=(4, 16))[truth] + 0.5 * rng.normal(size=(len(texts), 16))
    labels = cluster_examples(texts, features, seed=0)
    assert adjusted_rand_score(truth, labels) >= 0.8
    assert len(np.unique(cluster_examples(texts, features, n_clusters=2, seed=0))) == 2
    assert map_coordinates(texts, features).shape == (len(texts), 2)


def test_prompt_completion_pairs_are_clustered_and_named():
    """Two categories whose prompts share most words; mostly the answers' intents tell them apart."""
    rng = np.random.default_rng(5)
    pairs, truth = [], []
    for i in range(80):
        label = i % 2
        words = " ".join(rng.choice(SHARED, size=6, replace=False))
        topic = ["refund", "invoice"][label] if i % 8 < 2 else ""  # 1 prompt in 4 names its topic
        answer = json.dumps({"intent": ["refund_request", "invoice_copy"][label], "id": int(rng.integers(99))})
        pairs.append((f"{words} {topic} {' '.join(rng.choice(SHARED, size=4))}", answer))
        truth.append(label)
    labels = cluster_examples(pairs, seed=0)
    assert adjusted_rand_score(truth, labels) == 1.0
    assert {name.split(", ")[0] for name in name_clusters(pairs, labels).values()} <= {
        "refund", "request", "invoice", "copy"}


def test_degenerate_inputs_give_one_cluster():
    assert cluster_examples(["a b", "c d"]).tolist() == [0, 0]
    assert cluster_examples(["{}", "[]", "{}", "1"]).tolist() == [0, 0, 0, 0]
    same = cluster_examples(["invoice currency"] * 6)
    assert len(np.unique(same)) == 1


def test_names_hold_the_planted_distinctive_words():
    texts, truth = planted_texts()
    names = name_clusters(texts, truth, top_k=4)
    for label, words in enumerate(TOPICS.values()):
        assert set(names[label].split(", ")) == set(words.split())
    assert all(word not in names[0] for word in ("topic", "priority", "note"))  # JSON keys shared by all


def test_names_skip_json_punctuation_numbers_and_stop_words():
    texts = ['{"amount": 12.5, "currency": "EUR"} the invoice', '{"a": 1} the parcel refund']
    names = name_clusters(texts, np.array([0, 1]), top_k=3)
    assert set(names[0].split(", ")) <= {"amount", "currency", "eur", "invoice"}
    assert "the" not in names[1] and "12" not in names[0]


def naive_harm_shares(effects: np.ndarray, labels: np.ndarray) -> dict[int, float]:
    mean = [sum(float(effects[q, i]) for q in range(effects.shape[0])) / effects.shape[0]
            for i in range(effects.shape[1])]
    harm = [max(-m, 0.0) for m in mean]
    total = sum(harm)
    return {int(c): sum(h for h, label in zip(harm, labels, strict=True) if label == c) / total for c in set(labels.tolist())}


def test_summary_matches_naive_reference_and_join_is_exact():
    ids = [f"r{i}" for i in range(8)]
    labels = np.array([0, 0, 0, 1, 1, 1, 1, 1])
    effects = np.array([
        [-3.0, -2.0, 1.0, 0.5, -0.5, 0.2, 0.1, -0.1],
        [-1.0, -4.0, 0.0, 0.3, -0.3, -0.2, 0.4, 0.2],
        [-2.0, -3.0, -1.0, 0.1, 0.2, 0.0, -0.6, 0.3],
    ])
    findings = [
        Finding("truncated_completion", "critical", "t", "f", example_ids=["r0", "r1", "r3"]),
        Finding("truncated_completion", "critical", "t", "f", example_ids=["r2"]),
        Finding("duplicate", "warning", "d", "f", example_ids=["r7"]),
        Finding("many_epochs", "warning", "run-wide", "f"),
    ]
    summaries = summarize_clusters(ids, labels, effects, {0: "invoice", 1: "other"}, findings, seed=0)
    reference = naive_harm_shares(effects, labels)
    assert [s.id for s in summaries] == [0, 1]  # most harmful first
    for summary in summaries:
        assert summary.harm_share == pytest.approx(reference[summary.id], rel=1e-12)
        size_share = (labels == summary.id).mean()
        assert summary.size_share == pytest.approx(size_share)
        assert summary.lift == pytest.approx(reference[summary.id] / size_share)
        low, high = summary.harm_share_ci
        assert low <= summary.harm_share <= high
        assert summary.mean_effect == pytest.approx(effects.mean(axis=0)[labels == summary.id].mean())
    top = summaries[0]
    assert top.example_ids == ["r0", "r1", "r2"]
    assert top.flag_rates == {
        "duplicate": {"inside": 0.0, "outside": 1 / 5},
        "truncated_completion": {"inside": 1.0, "outside": 1 / 5},
    }
    assert "many_epochs" not in top.flag_rates  # run-wide findings do not join per row


def test_the_lower_bound_matches_a_naive_resample_loop_and_no_upper_end_is_claimed():
    rng = np.random.default_rng(3)
    effects = rng.normal(size=(12, 20)) - np.r_[np.full(5, 1.0), np.zeros(15)]
    labels = np.r_[np.zeros(5), np.ones(15)].astype(int)
    membership = np.stack([labels == 0, labels == 1]).astype(float)
    low, high = harm_share_ci(effects, membership, seed=0, n_resamples=4000)
    draws = []
    loop_rng = np.random.default_rng(10)
    for _ in range(4000):
        rows = loop_rng.integers(0, 12, size=12)
        reference = naive_harm_shares(effects[rows], labels)
        draws.append(reference[0])
    assert low[0] == pytest.approx(np.percentile(draws, 2.5), abs=0.03)
    assert list(high) == [1.0, 1.0]


def test_single_query_bound_is_the_point():
    summaries = summarize_clusters(["a", "b"], np.array([0, 1]), np.array([[-1.0, -3.0]]), {}, [])
    assert summaries[0].harm_share_ci == (0.75, 1.0)
    assert summaries[0].name == "cluster 1"
