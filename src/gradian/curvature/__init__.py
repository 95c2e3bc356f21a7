"""Curvature: the preconditioner P in the effect e = −qᵀ P g, and the factors and run files it is fitted from.

One swappable role per file:

- `preconditioner.py`: the role (`fit(chunks)`, `apply(queries)`), `Identity`, `make_preconditioner` by name and
  `fit_preconditioner` (fits what the named one needs);
- `adam.py`: Adam's 1/√v̂ from the run's `optimizer.pt`, a `ParameterScale` extraction applies before projection;
- `gauss_newton.py`: (ΦᵀΦ/N + λI)⁻¹ in projected space (TRAK);
- `factors.py`: the K-FAC factors S and A of every LoRA matrix, from one batched pass over the training rows;
- `kfac.py`: K-FAC and EK-FAC, block-diagonal over LoRA matrices, in the Kronecker eigenbasis.

A new preconditioner is one file with a class that has `name`, `fit` and `apply`, a branch in
`make_preconditioner`, and its name in `settings.PreconditionerName`.
"""

from __future__ import annotations

from gradian.curvature.adam import adam, scale_for
from gradian.curvature.preconditioner import Identity, Preconditioner, fit_preconditioner, make_preconditioner

__all__ = ["Identity", "Preconditioner", "adam", "fit_preconditioner", "make_preconditioner", "scale_for"]
