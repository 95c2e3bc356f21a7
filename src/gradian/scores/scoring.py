"""Effects of training rows on failing eval rows: e_{q,i} = −q̂ᵀ P g_i, in chunks so memory stays flat.

NEGATIVE = a gradient step on row i lowers the margin toward the correct answer, i.e. row i pushed the
model toward the failure (a step moves θ by −η P g_i and the margin by −η qᵀ P g_i).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from gradian.gradients.store import FeatureStore
from gradian.scores.preconditioners import Preconditioner, make_preconditioner

Train = FeatureStore | np.ndarray


def _chunks(train: Train, chunk_rows: int) -> Iterator[tuple[int, np.ndarray]]:
    if isinstance(train, FeatureStore):
        yield from train.chunks(chunk_rows)
        return
    for start in range(0, len(train), chunk_rows):
        yield start, np.asarray(train[start : start + chunk_rows])


def score(
    train: Train,
    queries: np.ndarray,
    *,
    preconditioner: Preconditioner | None = None,
    unit_norm_train: bool = False,
    chunk_rows: int = 4096,
) -> np.ndarray:
    """(Q, N) per-query effects. A preconditioner not fitted yet is fitted on `train` first."""
    preconditioner = preconditioner or make_preconditioner("identity")
    if getattr(preconditioner, "damping", 0) is None:  # fitted on the training features (gauss-newton, ekfac…)
        preconditioner.fit(chunk for _, chunk in _chunks(train, chunk_rows))
    pq = preconditioner.apply(queries)  # (Q, k)
    norms = np.linalg.norm(pq, axis=1, keepdims=True)  # each query weighs the same after P too, so none dominates
    pq = np.divide(pq, norms, out=np.zeros_like(pq), where=norms > 0) * np.linalg.norm(queries, axis=1, keepdims=True)
    n_rows = train.n_rows if isinstance(train, FeatureStore) else len(train)
    effects = np.zeros((len(pq), n_rows), dtype=np.float64)
    for start, chunk in _chunks(train, chunk_rows):
        chunk = chunk.astype(np.float64)  # (C, k)
        if unit_norm_train:
            norms = np.linalg.norm(chunk, axis=1, keepdims=True)
            chunk = np.divide(chunk, norms, out=np.zeros_like(chunk), where=norms > 0)
        effects[:, start : start + len(chunk)] = -(pq @ chunk.T)  # (Q, C)
    return effects


def total_effect(effects: np.ndarray) -> np.ndarray:
    """(N,) effect per training row: the mean over queries (each query unit-normalised upstream)."""
    return effects.mean(axis=0) if len(effects) else np.zeros(effects.shape[1])
