"""Baselines only the benchmarks rank with.

- BM25 (Okapi) of a training row, as a document, for a failing eval prompt, as a query. Its words are
  `gradian.scores.relevance`'s (runs of letters), so it reads the same tokens as the TF-IDF relevance the combined
  rank uses; `relevance.aggregate` turns its (N, Q) matrix into one score per row.
- The answer-length control (issue 47): `--rank activation`'s difference of differences
  (`gradian.scores.activation`) with the answer's token length as the only feature. A family on which it ranks
  the culprits well is one whose cause shows in the rows' length, and measures no attribution power there.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy import sparse
from sklearn.feature_extraction.text import CountVectorizer

from gradian.scores.relevance import WORDS

BM25_K1 = 1.5  # Okapi's defaults (Robertson and Zaragoza 2009; Lucene, rank_bm25)
BM25_B = 0.75


def bm25_scores(
    train_texts: Sequence[str], query_texts: Sequence[str], *, k1: float = BM25_K1, b: float = BM25_B
) -> np.ndarray:
    """(N, Q) Okapi BM25 of each training row (a document) for each query, every query word counted as often as it
    occurs: Σ_t qtf(t) · idf(t) · f(t,d)(k1 + 1) / (f(t,d) + k1(1 − b + b·|d|/avgdl)),
    idf(t) = ln(1 + (N − n_t + 0.5) / (n_t + 0.5)) (Lucene's form, never negative)."""
    counter = CountVectorizer(token_pattern=WORDS).fit(train_texts)
    docs = sparse.csr_matrix(counter.transform(train_texts), dtype=np.float64)  # (N, V) f(t, d)
    queries = sparse.csr_matrix(counter.transform(query_texts), dtype=np.float64)  # (Q, V) qtf(t)
    n_docs = docs.shape[0]
    df = np.bincount(docs.indices, minlength=docs.shape[1])  # (V,) n_t
    idf = np.log1p((n_docs - df + 0.5) / (df + 0.5))  # (V,)
    length = np.asarray(docs.sum(axis=1)).ravel()  # (N,) |d|
    norm = k1 * (1 - b + b * length / max(length.mean(), 1e-12))  # (N,)
    weights = docs.copy()
    row_of = np.repeat(np.arange(n_docs), np.diff(docs.indptr))  # the row of every stored entry
    f = docs.data
    weights.data = idf[docs.indices] * f * (k1 + 1) / (f + norm[row_of])
    return np.asarray((weights @ queries.T).toarray(), dtype=np.float64)  # (N, Q)


def length_control_scores(failing: Sequence[int], intended: Sequence[int], trained: Sequence[int],
                          own: Sequence[int]) -> np.ndarray:
    """(N,) the answer-length control, higher = more suspect:

        v   = mean_q ( |ŷ_q| − |y_q| )     the fine-tune's failing answers' length minus the references', in tokens
        d_i = |c_i| − |b_i|                row i's answer as trained minus the base's own answer to its prompt
        score_i = d_i · sign(v)

    the activation ranking's cos(d_i, v) with one feature, where a cosine is only a sign and would tie every row
    on the same side; the projection keeps how far each row moves the length. v = 0 scores every row 0."""
    direction = float(np.mean(np.asarray(failing, dtype=np.float64) - np.asarray(intended, dtype=np.float64)))
    differences = np.asarray(trained, dtype=np.float64) - np.asarray(own, dtype=np.float64)  # (N,)
    return differences * np.sign(direction)


def length_control(model: Any, tokenizer: Any, audit: Any, failing: Sequence[Any], out_dir: str | Path) -> np.ndarray:
    """(N,) `length_control_scores` of a run's training rows, read as `--rank activation` reads them: the rows as
    trained, the base's own answers from the same cache in `out_dir` (generated when absent), the failing answers
    and references as `activation.intended_pairs` renders them. Rows with no supervised answer score 0."""
    from gradian.scores.activation import intended_pairs, own_answers

    def length(sequence: tuple[list[int], list[bool]]) -> int:
        return sum(sequence[1])

    pairs = intended_pairs(failing, audit.eval_examples or [], tokenizer, audit.setup)
    own = own_answers(model, tokenizer, audit, out_dir)  # generated as `--rank activation` generates them
    scores = np.zeros(len(audit.rendered))  # (N,)
    if own.rows:
        scores[own.rows] = length_control_scores([length(f) for f, _ in pairs], [length(r) for _, r in pairs],
                                                 [length(t) for t in own.trained], [len(a.ids) for a in own.answers])
    return scores
