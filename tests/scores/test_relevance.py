"""Relevance baselines against naive float64 references: TF-IDF, BM25, RepSim, aggregation, the two references."""

from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np
import pytest
import torch

from benchmarks.harness.baselines import bm25_scores
from conftest import make_tiny_model
from gradian.scenarios.evaluate import category_oracle, random_scores
from gradian.scores import relevance as rel

TRAIN = ["refund my order please", "the invoice amount is late", "invoice invoice currency amount",
         "hello I need help with shipping", "shipping was late for my order 77", "account help"]
QUERIES = ["my invoice amount", "shipping late", "nothing in common"]


def words(text: str) -> list[str]:
    return [w.lower() for w in re.findall(rel.WORDS, text)]


def naive_tfidf(train, queries):
    """scikit-learn's TF-IDF by hand: raw counts × (ln((1 + n) / (1 + df)) + 1), rows l2-normalised, cosine."""
    docs = [Counter(words(t)) for t in [*train, *queries]]
    vocab = sorted(set().union(*docs))
    n = len(docs)
    idf = {w: math.log((1 + n) / (1 + sum(w in d for d in docs))) + 1 for w in vocab}
    vectors = np.array([[d[w] * idf[w] for w in vocab] for d in docs], dtype=np.float64)
    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-300)
    return vectors[: len(train)] @ vectors[len(train):].T


def naive_bm25(train, queries, k1=1.5, b=0.75):
    docs = [words(t) for t in train]
    avgdl = sum(len(d) for d in docs) / len(docs)
    out = np.zeros((len(train), len(queries)))
    for i, doc in enumerate(docs):
        counts = Counter(doc)
        for j, query in enumerate(queries):
            for term in words(query):  # every occurrence of a query word counts
                df = sum(term in d for d in docs)
                idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
                f = counts[term]
                out[i, j] += idf * f * (k1 + 1) / (f + k1 * (1 - b + b * len(doc) / avgdl))
    return out


def test_tfidf_equals_the_naive_formula():
    np.testing.assert_allclose(rel.tfidf_similarity(TRAIN, QUERIES), naive_tfidf(TRAIN, QUERIES), atol=1e-12)


def test_bm25_equals_the_okapi_formula_and_ranks_the_matching_rows_first():
    scores = bm25_scores(TRAIN, QUERIES)
    np.testing.assert_allclose(scores, naive_bm25(TRAIN, QUERIES), atol=1e-12)
    assert np.argmax(scores[:, 0]) == 2  # "invoice invoice currency amount": two invoices, short row
    assert np.argmax(scores[:, 1]) == 4
    assert np.all(scores[:, 2] == 0)  # no shared word scores zero everywhere


def test_aggregate_max_and_mean():
    sim = np.array([[0.1, 0.9], [0.5, 0.5]])
    np.testing.assert_allclose(rel.aggregate(sim, "max"), [0.9, 0.5])
    np.testing.assert_allclose(rel.aggregate(sim, "mean"), [0.5, 0.5])
    assert rel.aggregate(np.zeros((3, 0)), "max").tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="aggregate"):
        rel.aggregate(sim, "median")


@pytest.mark.parametrize("batch_size", [1, 3, 16])
def test_repsim_batched_and_padded_equals_one_row_at_a_time(tiny_tokenizer, batch_size):
    """Padding must not leak into the mean: each sequence alone, every token averaged, float64."""
    model = make_tiny_model(tiny_tokenizer, seed=3, dtype=torch.float64).eval()
    rng = np.random.default_rng(0)
    train = [rng.integers(3, len(tiny_tokenizer), size=n).tolist() for n in (5, 12, 3, 9, 7)]
    queries = [rng.integers(3, len(tiny_tokenizer), size=n).tolist() for n in (4, 10)]

    def naive_mean(sequence):
        with torch.no_grad():
            hidden = model(input_ids=torch.tensor([sequence]), output_hidden_states=True).hidden_states[-1][0]
        return hidden.mean(dim=0).numpy()

    train_h = np.stack([naive_mean(s) for s in train])
    query_h = np.stack([naive_mean(s) for s in queries])
    expected = np.array([[a @ b / np.linalg.norm(a) / np.linalg.norm(b) for b in query_h] for a in train_h])
    np.testing.assert_allclose(rel.mean_hidden_states(model, train, batch_size=batch_size), train_h, atol=1e-10)
    np.testing.assert_allclose(rel.repsim(model, train, queries, batch_size=batch_size), expected, atol=1e-10)


def test_cosine_of_a_zero_row_is_zero():
    from gradian.gradients.sides import cosine

    out = cosine(np.array([[0.0, 0.0], [1.0, 1.0]]), np.array([[2.0, 2.0]]))
    np.testing.assert_allclose(out, [[0.0], [1.0]])


def test_category_oracle_puts_every_category_row_first_and_reads_two_causes():
    ids = [f"t{i}" for i in range(8)]
    truth = {"category_ids": ["t1", "t5"], "causes": [{"cause": "fence", "culprit_ids": ["t6"], "category": "ship"}]}
    categories = ["a", "b", "a", "ship", "a", "b", "ship", "a"]
    order = np.argsort(-category_oracle(ids, truth, seed=1, row_categories=categories))
    assert set(order[:4]) == {1, 5, 3, 6}
    order = np.argsort(-category_oracle(ids, truth, seed=1))
    assert set(order[:2]) == {1, 5}
    assert not np.array_equal(random_scores(50, 0), random_scores(50, 1))
