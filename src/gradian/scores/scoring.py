"""Effects of training rows on failing eval rows: e_{q,i} = −q̂ᵀ P g_i, in chunks so memory stays flat.

NEGATIVE = a gradient step on row i lowers the margin toward the correct answer, i.e. row i pushed the
model toward the failure (a step moves θ by −η P g_i and the margin by −η qᵀ P g_i).

The (Q, N) effects can be written into a memory map (`effects_file`: the run's scores.npy), a chunk of rows at
a time, so scoring millions of rows holds one (Q, chunk) block and the (Q, k) queries, never (Q, N).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from gradian.curvature import Preconditioner, make_preconditioner
from gradian.gradients.store import FeatureStore

Train = FeatureStore | np.ndarray
CHUNK_ROWS = 4096  # rows per scored block: (Q, 4096) float64 and (4096, k) float64 at a time
# Effects whose spread is at most this share of their largest magnitude do not tell the rows apart: float64 sums
# of the same terms in another order (another processor's BLAS) differ by ~1e-16 of it, so 1e-9 leaves a wide margin
# and is still far below any difference a ranking could rest on.
TIE_RTOL = 1e-9


class NonFiniteEffects(RuntimeError):
    """Effects that are NaN or infinite: an internal error (exit 3), never a ranking."""


def _chunks(train: Train, chunk_rows: int) -> Iterator[tuple[int, np.ndarray]]:
    if isinstance(train, FeatureStore):
        yield from train.chunks(chunk_rows)
        return
    for start in range(0, len(train), chunk_rows):
        yield start, np.asarray(train[start : start + chunk_rows])


def score_features(
    train: Train,
    queries: np.ndarray,
    *,
    preconditioner: Preconditioner | None = None,
    unit_norm_train: bool = False,
    chunk_rows: int = CHUNK_ROWS,
    out: np.ndarray | None = None,
    weight: float = 1.0,
    add: bool = False,
) -> np.ndarray:
    """(Q, N) per-query effects × `weight`, into `out` when given (added to it with `add`), else a new array.

    A preconditioner not fitted yet is fitted on `train` first (one more pass over its chunks).
    """
    preconditioner = preconditioner or make_preconditioner("identity")
    if getattr(preconditioner, "damping", 0) is None:  # fitted on the training features (gauss-newton, ekfac…)
        preconditioner.fit(chunk for _, chunk in _chunks(train, chunk_rows))
    pq = preconditioner.apply(queries)  # (Q, k)
    norms = np.linalg.norm(pq, axis=1, keepdims=True)  # each query weighs the same after P too, so none dominates
    pq = np.divide(pq, norms, out=np.zeros_like(pq), where=norms > 0) * np.linalg.norm(queries, axis=1, keepdims=True)
    n_rows = train.n_rows if isinstance(train, FeatureStore) else len(train)
    if out is None:
        out, add = np.zeros((len(pq), n_rows), dtype=np.float64), False
    if out.shape != (len(pq), n_rows):
        raise ValueError(f"effects of shape {out.shape} cannot hold ({len(pq)}, {n_rows})")
    for start, chunk in _chunks(train, chunk_rows):
        chunk = chunk.astype(np.float64)  # (C, k)
        if unit_norm_train:
            norms = np.linalg.norm(chunk, axis=1, keepdims=True)
            chunk = np.divide(chunk, norms, out=np.zeros_like(chunk), where=norms > 0)
        block = -(pq @ chunk.T) * weight  # (Q, C)
        span = slice(start, start + len(chunk))
        out[:, span] = out[:, span] + block if add else block
    return out


def effects_file(path: Path, n_queries: int, n_rows: int) -> np.ndarray:
    """A new (Q, N) float64 memory map at a temporary name beside `path`; `publish` moves it into place."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    return np.lib.format.open_memmap(temporary, mode="w+", dtype=np.float64, shape=(n_queries, n_rows))


def publish(effects: np.ndarray, path: Path) -> np.ndarray:
    """Flush a memory map from `effects_file` and rename it to `path` (a reader never sees half of it)."""
    if isinstance(effects, np.memmap) and effects.filename is not None:
        effects.flush()
        os.replace(effects.filename, path)
    else:
        np.save(path, effects)
    return np.load(path, mmap_mode="r")


def total_effect(effects: np.ndarray, chunk_rows: int = CHUNK_ROWS * 16) -> np.ndarray:
    """(N,) effect per training row: the mean over queries (each query unit-normalised upstream), in chunks."""
    n_queries, n_rows = effects.shape
    total = np.zeros(n_rows)
    if n_queries:
        for start in range(0, n_rows, chunk_rows):
            total[start : start + chunk_rows] = np.asarray(effects[:, start : start + chunk_rows]).mean(axis=0)
    return total


def check_finite(effects: np.ndarray, chunk_rows: int = CHUNK_ROWS * 16) -> None:
    """Raise `NonFiniteEffects` (one sentence) when any (Q, N) effect is NaN or infinite, reading in chunks."""
    n_queries, n_rows = np.atleast_2d(effects).shape
    bad = sum(int((~np.isfinite(np.asarray(effects[:, s : s + chunk_rows]))).any(axis=0).sum())
              for s in range(0, n_rows, chunk_rows))
    if bad:
        raise NonFiniteEffects(f"{bad} of {n_rows} training rows have effects that are not finite (NaN or inf) on "
                               f"{n_queries} failing eval rows: the gradients or the queries overflowed")


def distinct(effect: np.ndarray, rtol: float = TIE_RTOL) -> bool:
    """Whether (N,) row effects tell the rows apart: their spread exceeds `rtol` of their largest magnitude (all
    zero, one row, or values a few float steps apart do not)."""
    effect = np.asarray(effect, dtype=np.float64)
    if effect.size < 2:
        return False
    return bool(np.ptp(effect) > rtol * np.max(np.abs(effect)))
