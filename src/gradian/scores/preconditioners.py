"""Preconditioners P in the effect e = −qᵀ P g.

- `identity`: P = I (TracIn-like).
- `adam`: P = diag(1/(√v̂ + ε)) from the run's `optimizer.pt` (LESS). It is a diagonal in LoRA parameter
  space, so it cannot be applied to projected features: `adam()` returns a `ParameterScale` that
  extraction multiplies into each exact per-example weight gradient before projection; scoring then
  uses `identity` on those features (queries stay plain, as in LESS).
- `gauss-newton`: P = (ΦᵀΦ/N + λI)⁻¹ in projected space (TRAK), Φ the (N, k) training features,
  λ = `damping_ratio` × the mean non-zero eigenvalue of ΦᵀΦ/N. Solved in the primal (k×k) when N ≥ k
  and through the N×N kernel (Woodbury) when N < k, so small training sets stay cheap.
- `kfac`, `ekfac`: block-diagonal over LoRA matrices, Kronecker-factored (`scores.kfac`); they need the
  factors of one extra pass over the training rows (`gradients.factors.fit_factors`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from gradian.errors import InputError, reason
from gradian.gradients.extract import ParameterScale
from gradian.gradients.factors import KroneckerFactors
from gradian.gradients.hooks import lora_matrices
from gradian.gradients.projection import KroneckerProjector
from gradian.scores.kfac import EKFAC, KFAC
from gradian.settings import PRECONDITIONERS

# Relative damping per preconditioner, chosen on the scenario benchmark (BENCHMARKS.md, damping sweep).
DAMPING = {"gauss-newton": 10.0, "kfac": 1.0, "ekfac": 1.0}


def adam(optimizer_path: str | Path, model: nn.Module) -> ParameterScale:
    """1/(√v̂ + ε) per LoRA weight from an Adam/AdamW `optimizer.pt`, matched to PEFT's order and checked by shape."""
    path = Path(optimizer_path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - any unreadable file is the user's input problem
        raise InputError(
            f"cannot read optimizer state safely ({reason(error, 160)}); pass the optimizer.pt of a checkpoint.", path
        ) from None
    matrices = lora_matrices(model)
    groups = state.get("param_groups", []) if isinstance(state, dict) else []
    order = [(index, group) for group in groups for index in group["params"]]
    if len(order) != len(matrices):
        raise InputError(
            f"optimizer state holds {len(order)} parameters but the adapter has {len(matrices)} "
            "LoRA matrices; pass the optimizer.pt of this run",
            path,
        )
    tensors = []
    for (index, group), matrix in zip(order, matrices, strict=True):
        entry = state["state"].get(index, {})
        v = entry.get("exp_avg_sq")
        if v is None or tuple(v.shape) != matrix.shape:
            raise InputError(
                f"optimizer entry {index} does not match {matrix.name} {matrix.shape}; "
                "is this the optimizer.pt of this adapter?",
                path,
            )
        step = float(entry.get("step", 1))
        v_hat = v.double() / (1 - group.get("betas", (0.9, 0.999))[1] ** max(step, 1.0))
        tensors.append(1.0 / (v_hat.sqrt() + group.get("eps", 1e-8)))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    return ParameterScale(f"adam:{digest}", tensors)


class Identity:
    name = "identity"

    def fit(self, chunks: Iterable[np.ndarray]) -> Identity:
        return self

    def apply(self, queries: np.ndarray) -> np.ndarray:
        return np.asarray(queries, dtype=np.float64)


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


Preconditioner = Identity | GaussNewton | KFAC | EKFAC


def make_preconditioner(name: str, *, factors: KroneckerFactors | None = None,
                        projector: KroneckerProjector | None = None,
                        damping: float | None = None) -> Preconditioner:
    """The scoring-side preconditioner; `adam` is applied at extraction, so it scores as identity.

    `damping` (relative to the spectrum) defaults to what the benchmark chose for each preconditioner.
    """
    if name in ("identity", "adam"):
        return Identity()
    ratio = {"damping_ratio": damping if damping is not None else DAMPING[name]} if name in DAMPING else {}
    if name == "gauss-newton":
        return GaussNewton(**ratio)
    if name in ("kfac", "ekfac"):
        if factors is None or projector is None:
            raise ValueError(f"{name} needs the Kronecker factors and the projector")
        return (KFAC if name == "kfac" else EKFAC)(factors, projector, **ratio)
    raise InputError(f"unknown preconditioner {name!r}; choose one of {', '.join(PRECONDITIONERS)}")
