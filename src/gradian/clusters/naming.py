"""Name each cluster by its most distinctive words: class-based TF-IDF (c-TF-IDF, as BERTopic does).

All rows of a cluster are joined into one document; a word scores high when it is frequent in that cluster and
rare across clusters: W(t, c) = tf(t, c) * log(1 + A / f(t)), with tf(t, c) the word's share of cluster c's words,
A the mean number of words per cluster and f(t) the word's count over all clusters.

Words found in more than UBIQUITOUS_SHARE of the rows are left out first: chat roles ("user", "assistant") and the
keys every answer has ("intent") name no cluster, yet a cluster of short rows would give them a high share.
"""

from __future__ import annotations

import numpy as np
from sklearn.feature_extraction.text import CountVectorizer

from gradian.clusters.cluster import STOP_WORDS, WORD_PATTERN, Texts, joined

UBIQUITOUS_SHARE = 0.9


def name_clusters(texts: Texts, labels: np.ndarray, top_k: int = 3) -> dict[int, str]:
    """`{cluster: "invoice, currency, amount"}`: the `top_k` highest c-TF-IDF words of each cluster."""
    labels = np.asarray(labels)
    texts = joined(texts)
    clusters = sorted(int(c) for c in np.unique(labels))
    weights, vocabulary = class_tfidf(texts, labels, clusters)
    names = {}
    for row, cluster in enumerate(clusters):
        order = np.lexsort((vocabulary, -weights[row]))  # highest weight first, ties alphabetical
        words = [vocabulary[i] for i in order[:top_k] if weights[row, i] > 0]
        names[cluster] = ", ".join(words) if words else f"cluster {cluster}"
    return names


def class_tfidf(texts: list[str], labels: np.ndarray, clusters: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """c-TF-IDF weights (C, V) and the vocabulary (V,), rows in the order of `clusters`."""
    counts, vocabulary = _word_counts(texts, UBIQUITOUS_SHARE if len(texts) >= 10 else 1.0)
    if counts is None:
        counts, vocabulary = _word_counts(texts, 1.0)  # every word is everywhere: keep them all
    if counts is None:  # no words in any text
        return np.zeros((len(clusters), 0)), np.array([], dtype=object)
    membership = np.stack([np.asarray(labels) == c for c in clusters]).astype(np.float64)  # (C, N)
    per_cluster = np.asarray((counts.T @ membership.T).T)  # (C, V) word counts per cluster
    words_per_cluster = per_cluster.sum(axis=1, keepdims=True)  # (C, 1)
    tf = per_cluster / np.maximum(words_per_cluster, 1.0)
    average_words = words_per_cluster.mean()
    frequency = per_cluster.sum(axis=0)  # (V,), > 0 for every word in the vocabulary
    idf = np.log1p(average_words / frequency)
    return tf * idf, vocabulary


def _word_counts(texts: list[str], max_share: float):
    """Word counts (N, V) and vocabulary, or (None, None) when no word is left."""
    vectorizer = CountVectorizer(token_pattern=WORD_PATTERN, stop_words=STOP_WORDS, max_df=max_share)
    try:
        return vectorizer.fit_transform(texts), vectorizer.get_feature_names_out()
    except ValueError:  # empty vocabulary, or max_df removed every word
        return None, None
