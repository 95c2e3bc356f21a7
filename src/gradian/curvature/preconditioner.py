"""The preconditioner role: P in the effect e = −qᵀ P g, `fit(chunks of training features)` then `apply(queries)`.

- `identity`: P = I (TracIn-like).
- `adam`: P = diag(1/(√v̂ + ε)) from the run's `optimizer.pt` (`curvature.adam`), applied at extraction; it scores
  as identity.
- `gauss-newton`: P = (ΦᵀΦ/N + λI)⁻¹ in projected space (TRAK; `curvature.gauss_newton`).
- `kfac`, `ekfac`: block-diagonal over LoRA matrices, Kronecker-factored (`curvature.kfac`); they need the
  factors of one extra pass over the training rows (`curvature.factors.fit_factors`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from torch import nn

from gradian.curvature.factors import KroneckerFactors, fit_factors
from gradian.curvature.gauss_newton import GaussNewton
from gradian.curvature.kfac import EKFAC, KFAC
from gradian.errors import InputError
from gradian.gradients.extract import make_projector
from gradian.gradients.projection import KroneckerProjector
from gradian.gradients.settings import GradientSettings
from gradian.settings import PRECONDITIONERS

# Relative damping per preconditioner, chosen on the scenario benchmark (BENCHMARKS.md, damping sweep).
DAMPING = {"gauss-newton": 10.0, "kfac": 1.0, "ekfac": 1.0}


class Identity:
    name = "identity"

    def fit(self, chunks: Iterable[np.ndarray]) -> Identity:
        return self

    def apply(self, queries: np.ndarray) -> np.ndarray:
        return np.asarray(queries, dtype=np.float64)


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


def fit_preconditioner(name: str, model: nn.Module, rendered: Sequence[Any], gradient: GradientSettings, *,
                       damping: float | None = None,
                       progress: Callable[[Iterable], Iterable] | None = None) -> Preconditioner:
    """The scoring-side P of `name`; K-FAC and EK-FAC first fit their Kronecker factors in one pass over the rows."""
    factors = projector = None
    if name in ("kfac", "ekfac"):
        projector = make_projector(model, gradient)
        factors = fit_factors(model, rendered, projector, gradient, progress=progress)
    return make_preconditioner(name, factors=factors, projector=projector, damping=damping)
