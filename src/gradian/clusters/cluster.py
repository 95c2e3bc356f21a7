"""Group training rows into clusters on what they say (TF-IDF) and how they pull the model (gradient features).

Why both: the text puts a category (invoice tickets with a currency field) in one place, which is what a person can
name and act on; the gradient features add how each row moves the adapter, so rows that teach the same thing land
together even when worded differently. Each block is L2-normalised row by row before the blocks are joined, so
neither dominates by its scale; `feature_weight` sets the gradient block's share.

The number of clusters is chosen by the silhouette score (cosine) over a small range, unless given.

Fitted on a sample, applied to every row: the TF-IDF vocabularies, the SVDs and k-means are fitted on at most
FIT_SAMPLE rows (a seeded sample; every row below that), then every row is embedded and assigned to its nearest
centre a chunk at a time, so memory stays flat in N. The fitted space is an `Embedding`, handed to the report for
the cluster map (nothing is kept between calls).
Which rows of a cluster are the culprits is not decided here: that is the join with the audit and the effects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from sklearn.cluster import KMeans
from sklearn.decomposition import PCA, TruncatedSVD
from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS, TfidfVectorizer
from sklearn.metrics import silhouette_score
from sklearn.preprocessing import normalize

# One row's text: a single string, or a (prompt, completion) pair.
Texts = Sequence[str | tuple[str, str]]
# Runs of two or more letters: JSON punctuation, quotes and numbers (amounts, ids) carry no topic, and
# snake_case values split into words ("invoice_copy" -> "invoice", "copy") so they share words with the prompt.
WORD_PATTERN = r"(?u)[^\W\d_]{2,}"
# scikit-learn's English stop words minus the content words in it that name fields and topics of real data
# ("amount", "bill", "name", "detail"...): a cluster of invoices should be called "invoice, currency, amount".
CONTENT_WORDS = frozenset(
    "amount bill name detail system call interest empty fill full found find part show top bottom back front move "
    "give fire computer describe".split()
)
STOP_WORDS = sorted(ENGLISH_STOP_WORDS - CONTENT_WORDS)
# LSA dimensions for the text block: enough for dozens of topics, small enough for KMeans on 100k rows.
TEXT_DIMENSIONS = 64
# Principal directions kept of the gradient features (thousands of projected dimensions, mostly noise).
FEATURE_DIMENSIONS = 32
# Range searched for the number of clusters: a person reads a handful of clusters, not fifty.
MIN_CLUSTERS, MAX_CLUSTERS = 2, 12
# Silhouette dips smaller than this do not end the search for its first peak (see choose_n_clusters).
SILHOUETTE_TOLERANCE = 0.02
# A candidate k may not leave a cluster smaller than this: a handful of rows is an anecdote, not a group.
MIN_CLUSTER_ROWS = 3
# Silhouette on at most this many rows (seeded sample): exact below it, O(n^2) above.
SILHOUETTE_SAMPLE = 3000
# Rows the embedding and k-means are fitted on (seeded sample); every row is then assigned in chunks.
FIT_SAMPLE = 20000
CHUNK_ROWS = 8192


class FeatureRows(Protocol):
    """Gradient features by row: an (N, k) array or a `FeatureStore` (its `take` reads only the rows asked for)."""

    @property
    def shape(self) -> Any: ...

    def __len__(self) -> int: ...

    def take(self, indices: Any) -> np.ndarray: ...


def cluster_examples(
    texts: Texts,
    features: FeatureRows | None = None,
    *,
    n_clusters: int | None = None,
    seed: int = 0,
    feature_weight: float = 0.5,
) -> np.ndarray:
    """Cluster label (0..k-1) for every row, shape (N,); `fit_clusters` returns the fitted space too."""
    return fit_clusters(texts, features, n_clusters=n_clusters, seed=seed, feature_weight=feature_weight).labels


@dataclass
class Clustering:
    labels: np.ndarray  # (N,) cluster of every row, largest cluster 0
    embedding: Embedding  # the space the clusters were fitted in: the report draws its map from it


def fit_clusters(
    texts: Texts,
    features: FeatureRows | None = None,
    *,
    n_clusters: int | None = None,
    seed: int = 0,
    feature_weight: float = 0.5,
    fit_rows: int = FIT_SAMPLE,
) -> Clustering:
    """Cluster every row: k-means fitted on a sample of at most `fit_rows` rows, every row assigned in chunks.

    `texts` are (prompt, completion) pairs (best: each side weighs the same) or one string per row;
    `features` (N, k) are projected gradient features (an array or a `FeatureStore`) or None.
    `n_clusters` overrides the automatic choice; `feature_weight` in [0, 1] is the gradient block's share.
    """
    embedding = embed_examples(texts, features, seed=seed, feature_weight=feature_weight, fit_rows=fit_rows)
    vectors = embedding.sample_vectors  # (S, d)
    n = len(texts)
    if n < 3 or not np.any(vectors):
        return Clustering(np.zeros(n, dtype=np.int64), embedding)
    if n_clusters is None:
        n_clusters = choose_n_clusters(vectors, seed=seed)
    n_clusters = max(1, min(int(n_clusters), len(vectors)))
    model = KMeans(n_clusters=n_clusters, n_init=4, random_state=seed)
    fitted = model.fit_predict(vectors)
    if embedding.covers_all:
        labels = fitted
    else:
        labels = np.concatenate([model.predict(block) for _, block in embedding.chunks()])  # (N,)
    return Clustering(_relabel_by_size(labels), embedding)


def embed_examples(
    texts: Texts, features: FeatureRows | None = None, *, seed: int = 0, feature_weight: float = 0.5,
    fit_rows: int = FIT_SAMPLE,
) -> Embedding:
    """The space clustering runs in (LSA of TF-IDF text and/or normalised gradient features), fitted on a sample."""
    return Embedding(texts, features, seed=seed, feature_weight=feature_weight, fit_rows=fit_rows)


class Embedding:
    """LSA of each side's text and the top principal directions of the gradient features, fitted on `sample`.

    `sample_vectors` (S, d) are the sample's vectors; `transform(rows)` embeds any rows in the same space.
    """

    def __init__(self, texts: Texts, features: FeatureRows | None, *, seed: int, feature_weight: float,
                 fit_rows: int) -> None:
        if not 0.0 <= feature_weight <= 1.0:
            raise ValueError(f"feature_weight must be in [0, 1], not {feature_weight}")
        if features is not None and len(features) != len(texts):
            raise ValueError(f"features has {len(features)} rows for {len(texts)} texts")
        n = len(texts)
        self.texts, self.features, self.seed, self.feature_weight = texts, features, seed, feature_weight
        self.sample = np.arange(n) if n <= fit_rows else \
            np.sort(np.random.default_rng(seed).choice(n, size=fit_rows, replace=False))
        self.covers_all = len(self.sample) == n
        sample_texts = [texts[i] for i in self.sample]
        self.text_fit = _TextFit(sample_texts, seed)
        use_features = features is not None and feature_weight > 0.0
        self.gradient_fit = _GradientFit(_feature_rows(features, self.sample), seed) if use_features else None
        self.sample_vectors = self._join(self.text_fit.sample_vectors,
                                         self.gradient_fit.sample_vectors if self.gradient_fit else None, n=len(
                                             self.sample))
        self._map: PCA | None = None

    @property
    def method(self) -> str:
        return "pca" if self.gradient_fit is None else "pca of text and gradient features"

    def _join(self, text: np.ndarray | None, gradient: np.ndarray | None, n: int) -> np.ndarray:
        if gradient is None:
            return text if text is not None else np.zeros((n, 1))
        blocks = [np.sqrt(1.0 - self.feature_weight) * text] if text is not None else []
        return np.hstack([*blocks, np.sqrt(self.feature_weight) * gradient])

    def transform(self, rows: np.ndarray) -> np.ndarray:
        """(len(rows), d) vectors of the given rows."""
        rows = np.asarray(rows, dtype=np.int64)
        if self.covers_all:
            return self.sample_vectors[rows]
        text = self.text_fit.transform([self.texts[i] for i in rows])
        gradient = self.gradient_fit.transform(_feature_rows(self.features, rows)) if self.gradient_fit else None
        return self._join(text, gradient, n=len(rows))

    def chunks(self, chunk_rows: int = CHUNK_ROWS):
        """(start, vectors of rows [start, start + chunk)) over every row."""
        for start in range(0, len(self.texts), chunk_rows):
            yield start, self.transform(np.arange(start, min(start + chunk_rows, len(self.texts))))

    def coordinates(self, rows: np.ndarray) -> np.ndarray:
        """2-D coordinates (len(rows), 2) for the cluster map: the first two principal directions of the sample."""
        vectors = self.sample_vectors
        if len(vectors) < 2 or vectors.shape[1] < 2:
            return np.zeros((len(rows), 2))
        if self._map is None:
            self._map = PCA(n_components=2, random_state=self.seed).fit(vectors)
        return self._map.transform(self.transform(rows))


def _feature_rows(features: FeatureRows | None, rows: np.ndarray) -> np.ndarray:
    if features is None:
        return np.zeros((len(rows), 0))
    if isinstance(features, np.ndarray):
        return features[rows]
    return features.take(rows)  # a FeatureStore: reads only these rows


class _GradientFit:
    """Unit rows of the top principal directions of the unit-normalised gradient features.

    Unit rows first: a row's direction says what it teaches, its size mostly how long it is. Then the top
    FEATURE_DIMENSIONS directions: what rows share lives there, the rest is per-row noise that would blur clusters.
    """

    def __init__(self, sample: np.ndarray, seed: int) -> None:
        unit = normalize(np.asarray(sample, dtype=np.float32))  # (S, k); float32 halves the SVD's time
        dims = min(FEATURE_DIMENSIONS, unit.shape[1] - 1, unit.shape[0] - 1)
        self.svd = TruncatedSVD(n_components=dims, random_state=seed) if dims >= 2 else None
        self.sample_vectors = unit if self.svd is None else normalize(self.svd.fit_transform(unit).astype(np.float64))

    def transform(self, features: np.ndarray) -> np.ndarray:
        unit = normalize(np.asarray(features, dtype=np.float32))
        return unit if self.svd is None else normalize(self.svd.transform(unit).astype(np.float64))


class _TextFit:
    """Unit-norm LSA vectors of each row's text (None when no text has a word).

    For (prompt, completion) pairs, prompt and completion get one LSA block each, at equal weight: the prompt says
    what was asked and the completion what was taught, and a long prompt should not drown the answer's words.
    """

    def __init__(self, sample: Texts, seed: int) -> None:
        self.pairs = any(isinstance(text, tuple) for text in sample)
        self.sides = [_Lsa(side, seed) for side in _sides(sample, self.pairs)]
        self.sample_vectors = self._combine([side.sample_vectors for side in self.sides])

    def _combine(self, blocks: list[np.ndarray | None]) -> np.ndarray | None:
        present = [block for block in blocks if block is not None]
        if not present:
            return None
        return normalize(np.hstack(present)) if self.pairs else present[0]  # equal weight: each block has unit rows

    def transform(self, texts: Texts) -> np.ndarray | None:
        return self._combine([side.transform(part) for side, part in zip(self.sides, _sides(texts, self.pairs),
                                                                          strict=True)])


def _sides(texts: Texts, pairs: bool) -> list[list[str]]:
    if not pairs:
        return [[str(text) for text in texts]]
    split = [text if isinstance(text, tuple) else (text, "") for text in texts]
    return [[str(pair[side]) for pair in split] for side in (0, 1)]


class _Lsa:
    """TF-IDF (vocabulary fitted on the sample) reduced by SVD to TEXT_DIMENSIONS, unit rows."""

    def __init__(self, texts: list[str], seed: int) -> None:
        self.vectorizer = TfidfVectorizer(token_pattern=WORD_PATTERN, stop_words=STOP_WORDS, sublinear_tf=True)
        self.svd: TruncatedSVD | None = None
        try:
            tfidf = self.vectorizer.fit_transform(texts)  # (S, V) sparse, unit rows
        except ValueError:  # empty vocabulary: no words at all
            self.vectorizer, self.sample_vectors = None, None
            return
        dims = min(TEXT_DIMENSIONS, tfidf.shape[1] - 1, tfidf.shape[0] - 1)
        if dims < 2:
            self.sample_vectors = tfidf.toarray()
            return
        self.svd = TruncatedSVD(n_components=dims, random_state=seed)
        self.sample_vectors = normalize(self.svd.fit_transform(tfidf))  # (S, dims)

    def transform(self, texts: list[str]) -> np.ndarray | None:
        if self.vectorizer is None:
            return None
        tfidf = self.vectorizer.transform(texts)
        return tfidf.toarray() if self.svd is None else normalize(self.svd.transform(tfidf))


def joined(texts: Texts) -> list[str]:
    """One string per row: pairs joined by a newline, as `Example.text` does."""
    return [("\n".join(text) if isinstance(text, tuple) else text).strip() for text in texts]


def choose_n_clusters(embedding: np.ndarray, *, seed: int = 0) -> int:
    """The k at the first peak of the cosine silhouette over [MIN_CLUSTERS, MAX_CLUSTERS].

    k grows while the silhouette stays within SILHOUETTE_TOLERANCE of the best so far, and the best is returned.
    The first peak, not the highest: past the natural grouping, the silhouette often climbs again as a topic splits
    into small groups by which of its words a row uses, which no one acts on. The tolerance keeps a dip of a few
    thousandths (sampling noise) from stopping the walk early. No candidate may leave a cluster smaller than
    MIN_CLUSTER_ROWS rows.
    """
    n = embedding.shape[0]
    distinct = len(np.unique(np.round(embedding, 9), axis=0))
    upper = min(MAX_CLUSTERS, n - 1, distinct)
    if upper < MIN_CLUSTERS:
        return 1
    best_k, best_score = MIN_CLUSTERS, -np.inf
    for k in range(MIN_CLUSTERS, upper + 1):
        labels = _kmeans(embedding, k, seed)
        sizes = np.bincount(labels)
        if len(sizes) < 2 or sizes.min() < min(MIN_CLUSTER_ROWS, n // k):
            break
        sample = min(SILHOUETTE_SAMPLE, n)
        score = silhouette_score(embedding, labels, metric="cosine", sample_size=sample, random_state=seed)
        if score < best_score - SILHOUETTE_TOLERANCE:
            break
        if score > best_score:
            best_k, best_score = k, score
    return best_k


def _kmeans(embedding: np.ndarray, k: int, seed: int) -> np.ndarray:
    labels = KMeans(n_clusters=k, n_init=4, random_state=seed).fit_predict(embedding)
    return _relabel_by_size(labels)


def _relabel_by_size(labels: np.ndarray) -> np.ndarray:
    """Largest cluster first, so labels are stable across runs that find the same groups."""
    values, counts = np.unique(labels, return_counts=True)
    order = values[np.lexsort((values, -counts))]
    mapping = np.empty(len(values), dtype=np.int64)
    mapping[np.searchsorted(values, order)] = np.arange(len(order))  # old label's rank -> new label
    return mapping[np.searchsorted(values, labels)]  # (N,), no Python int per row


def map_coordinates(
    texts: Texts, features: FeatureRows | None = None, *, seed: int = 0, feature_weight: float = 0.5
) -> np.ndarray:
    """2-D coordinates (N, 2) of every row for the cluster map (`Embedding.coordinates` for a few rows)."""
    embedding = embed_examples(texts, features, seed=seed, feature_weight=feature_weight)
    return embedding.coordinates(np.arange(len(texts)))
