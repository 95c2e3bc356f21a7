"""Text baselines only the benchmarks rank with: BM25 (Okapi) of a training row, as a document, for a failing eval
prompt, as a query. Its words are `gradian.scores.relevance`'s (runs of letters), so it reads the same tokens as the
TF-IDF relevance the combined rank uses; `relevance.aggregate` turns its (N, Q) matrix into one score per row.
"""

from __future__ import annotations

from collections.abc import Sequence

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
