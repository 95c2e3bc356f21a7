"""`gauss-newton`: P = (ΦᵀΦ/N + λI)⁻¹ in projected space (TRAK), Φ the (N, k) training features.

λ = `damping_ratio` × the mean non-zero eigenvalue of ΦᵀΦ/N. Solved in the primal (k×k) when N ≥ k and through the
N×N kernel (Woodbury) when N < k, so small training sets stay cheap.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


class GaussNewton:
    """(ΦᵀΦ/N + λI)⁻¹ q with λ relative to the spectrum, fitted from training feature chunks."""

    name = "gauss-newton"

    def __init__(self, damping_ratio: float = 0.1) -> None:
        self.damping_ratio = damping_ratio
        self.damping: float | None = None

    def fit(self, chunks: Iterable[np.ndarray]) -> GaussNewton:
        """Accumulate ΦᵀΦ one chunk at a time: memory O(k²) whatever N (Φ itself is kept only while N < k)."""
        gram_k: np.ndarray | None = None  # (k, k) Σ ΦᵀΦ
        kept: list[np.ndarray] | None = []  # Φ's chunks, dropped once N reaches k (then the primal form is used)
        n = 0
        for chunk in chunks:
            part = np.asarray(chunk, dtype=np.float64)  # (C, k)
            gram_k = part.T @ part if gram_k is None else gram_k + part.T @ part
            n += len(part)
            if kept is not None:
                kept.append(part)
                if n >= part.shape[1]:
                    kept = None
        if gram_k is None:
            raise ValueError("gauss-newton needs at least one training row")
        k = gram_k.shape[0]
        self.n, self.k = n, k
        if kept is not None:  # n < k, kernel form: keep Φ (n, k)
            self.phi = np.concatenate(kept)
            gram = self.phi @ self.phi.T / n  # (n, n), same non-zero spectrum as ΦᵀΦ/N
        else:
            gram = gram_k / n  # (k, k)
        eigenvalues, vectors = np.linalg.eigh(gram)
        self.damping = self.damping_ratio * float(np.trace(gram)) / min(n, k) or 1e-12
        self.eigenvalues, self.vectors = np.clip(eigenvalues, 0, None), vectors
        return self

    def apply(self, queries: np.ndarray) -> np.ndarray:
        """(Q, k) → (Q, k) preconditioned queries."""
        q = np.asarray(queries, dtype=np.float64)
        lam, vals, vecs = self.damping, self.eigenvalues, self.vectors
        if self.n >= self.k:
            return ((q @ vecs) / (vals + lam)) @ vecs.T
        # Woodbury: (ΦᵀΦ/n + λI)⁻¹ = (I − Φᵀ(nλI + ΦΦᵀ)⁻¹Φ)/λ, with ΦΦᵀ/n = V diag(vals) Vᵀ
        inner = ((q @ self.phi.T) @ vecs) / (self.n * (vals + lam))  # (Q, n)
        return (q - (inner @ vecs.T) @ self.phi) / lam
