"""`adam`: P = diag(1/(√v̂ + ε)) from the run's `optimizer.pt` (LESS), read here and nowhere else.

`adam_inverse_sqrt` is the formula, in one place: `adam()` applies it to the saved second moments, the callback's
capture (`callback.capture`) to those of the live optimizer at each step.

It is a diagonal in LoRA parameter space, so it cannot be applied to projected features: `adam()` returns a
`ParameterScale` that extraction multiplies into each exact per-example weight gradient before projection;
scoring then uses `identity` on those features (queries stay plain, as in LESS).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from torch import nn

from gradian.errors import InputError, reason
from gradian.gradients.extract import ParameterScale
from gradian.gradients.hooks import lora_matrices


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
        beta2, eps = group.get("betas", (0.9, 0.999))[1], group.get("eps", 1e-8)
        tensors.append(adam_inverse_sqrt(v.double(), float(entry.get("step", 1)), beta2, eps))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    return ParameterScale(f"adam:{digest}", tensors)


def adam_inverse_sqrt(exp_avg_sq: torch.Tensor, step: float, beta2: float, eps: float) -> torch.Tensor:
    """1/(√v̂ + ε) elementwise, in `exp_avg_sq`'s dtype: v̂ = v / (1 − β₂ᵗ) is Adam's bias-corrected second moment
    after `step` = t updates (an entry saved before its first update counts as t = 1)."""
    v_hat = exp_avg_sq / (1.0 - beta2 ** max(step, 1.0))
    return 1.0 / (v_hat.sqrt() + eps)


def scale_for(preconditioner: str, optimizer_path: Path | None, model: nn.Module,
                    where: str | None) -> ParameterScale | None:
    """The scale extraction applies for `preconditioner` (Adam's, else none); `where` names the run for the error
    when the adam preconditioner has no optimizer.pt to read."""
    if preconditioner != "adam":
        return None
    if optimizer_path is None:
        raise InputError("the adam preconditioner needs the run's optimizer.pt; pass --run with a checkpoint folder.",
                         where)
    return adam(optimizer_path, model)
