"""Where along the adapter the gradients are read: every LoRA B matrix times s, the stages that take gradients
inside (`--adapter-scale`). s = 1 reads the fine-tune itself; LoRA's B starts at 0, so s < 1 reads a point on the
way from the base to it, where a row the base already answers alike carries less of the gradient than a row that
teaches something new (BENCHMARKS.md, "The gradients read on the way from the base")."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn


@contextmanager
def adapter_point(model: nn.Module, scale: float) -> Iterator[None]:
    """Every LoRA B matrix of `model` times `scale` inside the block; the weights restored exactly after."""
    if scale == 1.0:
        yield
        return
    saved = [(p, p.detach().clone()) for name, p in model.named_parameters() if ".lora_B." in name]
    with torch.no_grad():
        for parameter, _ in saved:
            parameter.mul_(scale)
    try:
        yield
    finally:
        with torch.no_grad():
            for parameter, value in saved:
                parameter.copy_(value)


def gradient_point(settings: Any, checkpoints: Sequence[Any]) -> float:
    """The scale the gradient stages read at: `adapter_scale` where they read the final adapter alone; 1 for TracIn
    over `checkpoints` or captured steps (points of their own) and for `--rank activation` (the fine-tune's own
    states)."""
    if checkpoints or settings.checkpoints == "captured" or getattr(settings, "rank", None) == "activation":
        return 1.0
    return float(settings.adapter_scale)
