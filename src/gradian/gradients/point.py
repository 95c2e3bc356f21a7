"""Where along the adapter the gradients are read: every LoRA B matrix times s, the stages that take gradients
inside (`--adapter-scale`). s = 1 reads the fine-tune itself; LoRA's B starts at 0, so s < 1 reads a point on the
way from the base to it, where a row the base already answers alike carries less of the gradient than a row that
teaches something new (BENCHMARKS.md, "The gradients read on the way from the base"). The adapter's weights are put
back by `restored_weights`, which TracIn-CP uses around each checkpoint it loads too."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from gradian.errors import InputError
from gradian.gradients.hooks import lora_matrices


def adapter_name(model: nn.Module) -> str:
    """The PEFT model's active adapter; InputError for a model without one."""
    if not hasattr(model, "peft_config"):
        raise InputError("the model has no PEFT adapter; load the base model with its LoRA adapter first.")
    return getattr(model, "active_adapter", None) or "default"


@contextmanager
def restored_weights(model: nn.Module) -> Iterator[None]:
    """Put the adapter weights the model holds now back on exit, also after an error."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    adapter = adapter_name(model)
    saved = {key: value.detach().clone() for key, value in get_peft_model_state_dict(model, adapter_name=adapter)
             .items()}
    try:
        yield
    finally:
        set_peft_model_state_dict(model, saved, adapter_name=adapter)


@contextmanager
def adapter_point(model: nn.Module, scale: float) -> Iterator[None]:
    """Every LoRA B matrix of `model` times `scale` inside the block; the adapter's weights put back after."""
    if scale == 1.0:
        yield
        return
    with restored_weights(model):
        with torch.no_grad():
            for matrix in lora_matrices(model):
                if ".lora_B." in matrix.name:
                    matrix.module.weight.mul_(scale)
        yield


def gradient_point(settings: Any, checkpoints: Sequence[Any]) -> float:
    """The scale the gradient stages read at: `adapter_scale` where they read the final adapter alone; 1 for TracIn
    over `checkpoints` or captured steps (points of their own) and for `--rank activation` (the fine-tune's own
    states)."""
    if checkpoints or settings.checkpoints == "captured" or getattr(settings, "rank", None) == "activation":
        return 1.0
    return float(settings.adapter_scale)
