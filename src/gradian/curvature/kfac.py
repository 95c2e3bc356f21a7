"""K-FAC and EK-FAC preconditioners, block-diagonal over LoRA matrices, in the projected feature space.

Matrix m's block of a feature is vec Ĝ (row-major (k_rows, k_cols), as `KroneckerProjector.project` flattens).
Its curvature is approximated by S ⊗ A (`curvature.factors`), with eigendecompositions S = Q_S diag(s) Q_Sᵀ and
A = Q_A diag(a) Q_Aᵀ, so a query block Q̂ (k_rows, k_cols) is preconditioned in the Kronecker eigenbasis:

    P Q̂ = Q_S [(Q_Sᵀ Q̂ Q_A) / (Λ + λ)] Q_Aᵀ

- `kfac`: Λ[a, b] = s_a · a_b, the eigenvalues of S ⊗ A (Kronfluence's `kfac`, one damping on the product).
- `ekfac`: Λ[a, b] = mean_i (Q_Sᵀ Ĝ_i Q_A)[a, b]², the training features' second moment in that eigenbasis
  (George et al. 2018; Kronfluence's `ekfac`), fitted from the stored per-example features.

Damping is relative to each block's spectrum, as Kronfluence and `gauss-newton` do: λ_m = `damping_ratio` × the
mean of Λ over block m (0.1 here; `make_preconditioner` passes the benchmark's choice), so the rule is
scale-free and a block with a tiny spectrum is not inverted into noise. Rows whose feature is all zero (dropped rows) do not count in the EK-FAC mean.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

import numpy as np

from gradian.curvature.factors import KroneckerFactors
from gradian.gradients.projection import KroneckerProjector

Damped = TypeVar("Damped", bound="KFAC")


class KFAC:
    """(S ⊗ A + λ I)⁻¹ per LoRA matrix, through the eigenbases of S and A."""

    name = "kfac"

    def __init__(self, factors: KroneckerFactors, projector: KroneckerProjector, damping_ratio: float = 0.1) -> None:
        if len(factors.activations) != len(projector.plans):
            raise ValueError(f"{len(factors.activations)} factor pairs for {len(projector.plans)} LoRA matrices")
        self.plans, self.offsets = projector.plans, projector.offsets
        self.damping_ratio = damping_ratio
        self.damping: list[float] | None = None
        self.bases = [_eigh(s) + _eigh(a) for s, a in zip(factors.gradients, factors.activations, strict=True)]
        self.eigenvalues: list[np.ndarray] = []  # Λ_m (k_rows, k_cols) once fitted

    def fit(self, chunks: Iterable[np.ndarray]) -> KFAC:
        """Kronecker eigenvalues s ⊗ a and the damping; the training features are not needed (not read)."""
        self.eigenvalues = [np.outer(vals_s, vals_a) for vals_s, _, vals_a, _ in self.bases]
        return self._damp()

    def _damp(self: Damped) -> Damped:
        self.damping = [self.damping_ratio * float(lam.mean()) or 1e-12 for lam in self.eigenvalues]
        return self

    def apply(self, queries: np.ndarray) -> np.ndarray:
        """(Q, k) → (Q, k): every matrix's block rotated, divided by Λ + λ, rotated back."""
        if self.damping is None:
            raise RuntimeError(f"{self.name} preconditioner used before fit()")
        q = np.asarray(queries, dtype=np.float64)
        out = np.empty_like(q)
        for m, plan in enumerate(self.plans):
            _, vecs_s, _, vecs_a = self.bases[m]
            block = q[:, self.offsets[m] : self.offsets[m + 1]].reshape(len(q), plan.k_rows, plan.k_cols)
            rotated = vecs_s.T @ block @ vecs_a  # (Q, k_rows, k_cols)
            rotated /= self.eigenvalues[m] + self.damping[m]
            out[:, self.offsets[m] : self.offsets[m + 1]] = (vecs_s @ rotated @ vecs_a.T).reshape(len(q), -1)
        return out


class EKFAC(KFAC):
    """K-FAC's eigenbases with eigenvalues refitted on the per-example training features (train chunks)."""

    name = "ekfac"

    def fit(self, chunks: Iterable[np.ndarray]) -> EKFAC:
        """Λ_m = mean over non-zero training rows of (Q_Sᵀ Ĝ_i Q_A)², in float64, one chunk at a time."""
        sums = [np.zeros((plan.k_rows, plan.k_cols)) for plan in self.plans]
        n = 0
        for chunk in chunks:
            chunk = np.asarray(chunk, dtype=np.float64)  # (C, k)
            chunk = chunk[np.any(chunk != 0, axis=1)]
            n += len(chunk)
            for m, plan in enumerate(self.plans):
                _, vecs_s, _, vecs_a = self.bases[m]
                block = chunk[:, self.offsets[m] : self.offsets[m + 1]].reshape(len(chunk), plan.k_rows, plan.k_cols)
                sums[m] += ((vecs_s.T @ block @ vecs_a) ** 2).sum(axis=0)  # (k_rows, k_cols)
        if n == 0:
            raise ValueError("EK-FAC needs at least one non-zero training feature")
        self.eigenvalues = [total / n for total in sums]
        return self._damp()


def _eigh(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (clipped at 0: the factors are PSD up to rounding) and eigenvectors of a symmetric matrix."""
    values, vectors = np.linalg.eigh(np.asarray(matrix, dtype=np.float64))
    return np.clip(values, 0, None), vectors
