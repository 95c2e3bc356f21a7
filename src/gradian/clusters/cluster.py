"""Group training rows into clusters on what they say (TF-IDF) and how they pull the model (gradient features).

Why both: the text puts a category (invoice tickets with a currency field) in one place, which is what a person can
name and act on; the gradient features add how each row moves the adapter, so rows that teach the same thing land
together even when worded differently. Each block is L2-normalised row by row before the blocks are joined, so
neither dominates by its scale; `feature_weight` sets the gradient block's share.

The number of clusters is chosen by the silhouette score (cosine) over a small range, unless given.
Which rows of a cluster are the culprits is not decided here: that is the join with the audit and the effects.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

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


def cluster_examples(
    texts: Texts,
    features: np.ndarray | None = None,
    *,
    n_clusters: int | None = None,
    seed: int = 0,
    feature_weight: float = 0.5,
) -> np.ndarray:
    """Cluster label (0..k-1) for every row, shape (N,).

    `texts` are (prompt, completion) pairs (best: each side weighs the same) or one string per row;
    `features` (N, k) are projected gradient features or None.
    `n_clusters` overrides the automatic choice; `feature_weight` in [0, 1] is the gradient block's share.
    """
    embedding = embed_examples(texts, features, seed=seed, feature_weight=feature_weight)
    n = embedding.shape[0]
    if n < 3 or not np.any(embedding):
        return np.zeros(n, dtype=np.int64)
    if n_clusters is None:
        n_clusters = choose_n_clusters(embedding, seed=seed)
    n_clusters = max(1, min(int(n_clusters), n))
    return _kmeans(embedding, n_clusters, seed)


def embed_examples(
    texts: Texts, features: np.ndarray | None = None, *, seed: int = 0, feature_weight: float = 0.5
) -> np.ndarray:
    """The (N, d) vectors clustering runs on: LSA of TF-IDF text and/or normalised gradient features.

    The last result is kept, keyed by a digest of the inputs, so the cluster map reuses what clustering computed.
    """
    key = _digest(texts, features, seed, feature_weight)
    if _LAST_EMBEDDING and _LAST_EMBEDDING[0] == key:
        return _LAST_EMBEDDING[1]
    embedding = _embed(texts, features, seed, feature_weight)
    embedding.setflags(write=False)  # shared by later calls
    _LAST_EMBEDDING[:] = [key, embedding]
    return embedding


_LAST_EMBEDDING: list = []


def _digest(texts: Texts, features: np.ndarray | None, seed: int, feature_weight: float) -> str:
    digest = hashlib.sha256(f"{seed}:{feature_weight}:{len(texts)}".encode())
    for text in texts:
        for part in text if isinstance(text, tuple) else (text,):
            digest.update(str(part).encode("utf-8", "surrogatepass") + b"\0")
        digest.update(b"\1")
    if features is not None:
        array = np.ascontiguousarray(features)
        digest.update(f"{array.shape}{array.dtype}".encode())
        digest.update(array.data)
    return digest.hexdigest()


def _embed(texts: Texts, features: np.ndarray | None, seed: int, feature_weight: float) -> np.ndarray:
    if not 0.0 <= feature_weight <= 1.0:
        raise ValueError(f"feature_weight must be in [0, 1], not {feature_weight}")
    if features is not None and len(features) != len(texts):
        raise ValueError(f"features has {len(features)} rows for {len(texts)} texts")
    blocks = []
    text_block = _text_block(texts, seed)
    if features is None or feature_weight == 0.0:
        return text_block if text_block is not None else np.zeros((len(texts), 1))
    if text_block is not None:
        blocks.append(np.sqrt(1.0 - feature_weight) * text_block)
    blocks.append(np.sqrt(feature_weight) * _gradient_block(features, seed))
    return np.hstack(blocks)


def _gradient_block(features: np.ndarray, seed: int) -> np.ndarray:
    """Unit rows of the top principal directions of the unit-normalised gradient features.

    Unit rows first: a row's direction says what it teaches, its size mostly how long it is. Then the top
    FEATURE_DIMENSIONS directions: what rows share lives there, the rest is per-row noise that would blur clusters.
    """
    unit = normalize(np.asarray(features, dtype=np.float32))  # (N, k); float32 halves the SVD's time
    dims = min(FEATURE_DIMENSIONS, unit.shape[1] - 1, unit.shape[0] - 1)
    if dims < 2:
        return unit
    reduced = TruncatedSVD(n_components=dims, random_state=seed).fit_transform(unit)  # (N, dims)
    return normalize(reduced.astype(np.float64))


def _text_block(texts: Texts, seed: int) -> np.ndarray | None:
    """Unit-norm LSA vectors of each row's text, or None when no text has a word.

    For (prompt, completion) pairs, prompt and completion get one LSA block each, at equal weight: the prompt says
    what was asked and the completion what was taught, and a long prompt should not drown the answer's words.
    """
    if not any(isinstance(text, tuple) for text in texts):
        return _lsa([str(text) for text in texts], seed)
    pairs = [text if isinstance(text, tuple) else (text, "") for text in texts]
    blocks = [_lsa([str(pair[side]) for pair in pairs], seed) for side in (0, 1)]
    present = [block for block in blocks if block is not None]
    if not present:
        return None
    return normalize(np.hstack(present))  # equal weight: each block has unit rows


def joined(texts: Texts) -> list[str]:
    """One string per row: pairs joined by a newline, as `Example.text` does."""
    return [("\n".join(text) if isinstance(text, tuple) else text).strip() for text in texts]


def _lsa(texts: list[str], seed: int) -> np.ndarray | None:
    """Unit-norm LSA vectors of the TF-IDF of each text, or None when no text has a word."""
    try:
        tfidf = TfidfVectorizer(token_pattern=WORD_PATTERN, stop_words=STOP_WORDS, sublinear_tf=True).fit_transform(
            texts
        )  # (N, V) sparse, unit rows
    except ValueError:  # empty vocabulary: no words at all
        return None
    dims = min(TEXT_DIMENSIONS, tfidf.shape[1] - 1, tfidf.shape[0] - 1)
    if dims < 2:
        return tfidf.toarray()
    reduced = TruncatedSVD(n_components=dims, random_state=seed).fit_transform(tfidf)  # (N, dims)
    return normalize(reduced)


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
    mapping = {int(old): new for new, old in enumerate(order)}
    return np.array([mapping[int(label)] for label in labels], dtype=np.int64)


def map_coordinates(
    texts: Texts, features: np.ndarray | None = None, *, seed: int = 0, feature_weight: float = 0.5
) -> np.ndarray:
    """2-D coordinates (N, 2) for the cluster map: the first two principal components of the clustering space."""
    embedding = embed_examples(texts, features, seed=seed, feature_weight=feature_weight)
    if embedding.shape[0] < 2 or embedding.shape[1] < 2:
        return np.zeros((embedding.shape[0], 2))
    return PCA(n_components=2, random_state=seed).fit_transform(embedding)
