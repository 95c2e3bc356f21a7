"""Hooks on PEFT's LoRA matrices: each example's exact gradient of every LoRA weight, from one batched backward.

A LoRA layer computes h = W x + s·B(A x). PEFT runs `lora_A[adapter]` and `lora_B[adapter]` as plain
`nn.Linear` modules, so for example i the weight gradients are sums of outer products over its tokens:

    ∇A_i = Σ_t g_{A,t} x_tᵀ      g_{A,t} = ∂L/∂(A x_t) = s·Bᵀ δ_t       (r, d_in)
    ∇B_i = Σ_t g_{B,t} u_tᵀ      g_{B,t} = ∂L/∂(B u_t) = s·δ_t,  u_t = A x_t   (d_out, r)

A forward hook keeps each module's input (x or u); a hook on its output tensor receives g during the
backward of the summed per-example losses and hands the per-example matrix to a callback at once, so
memory holds one module's gradients at a time. The scaling s is inside g already (autograd applies it).
"""

from __future__ import annotations

import hashlib
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from gradian.errors import InputError


@dataclass(frozen=True)
class LoraMatrix:
    """One trainable LoRA weight, in the order of `model.named_parameters()` (PEFT's order)."""

    name: str
    module: nn.Linear
    shape: tuple[int, int]  # (out_features, in_features) of the weight

    @property
    def size(self) -> int:
        return self.shape[0] * self.shape[1]


def lora_matrices(model: nn.Module) -> list[LoraMatrix]:
    """The active adapter's `lora_A`/`lora_B` weights, in `model.named_parameters()` order (PEFT's, the optimizer's).

    Loaded with `is_trainable=False` or not, the same matrices are found; any other parameter of the adapter
    (DoRA magnitudes, LoRA embeddings, lora_bias, modules_to_save) is refused rather than silently ignored.
    """
    adapter = getattr(model, "active_adapter", None) or "default"
    matrices = []
    modules = dict(model.named_modules())
    for name, param in model.named_parameters():
        parts = name.split(".")
        mine = adapter in parts and any(part.startswith("lora_") for part in parts)
        if not mine and not param.requires_grad:
            continue
        module_name, _, leaf = name.rpartition(".")
        module = modules.get(module_name) if module_name else None
        plain = leaf == "weight" and parts[-3:-1] in (["lora_A", adapter], ["lora_B", adapter])
        if not plain or type(module) is not nn.Linear:
            raise InputError(
                f"parameter {name} is not a plain LoRA matrix; Gradian attributes plain LoRA adapters "
                "on Linear layers only (no DoRA, lora_bias, embeddings or modules_to_save)"
            )
        matrices.append(LoraMatrix(name, module, (int(param.shape[0]), int(param.shape[1]))))
    if not matrices:
        raise InputError(f"the model has no LoRA matrices of adapter {adapter!r}; load a LoRA adapter with PEFT")
    return matrices


def lora_fingerprint(model: nn.Module) -> str:
    """A hash of the adapter's weights: caches keyed by it are redone when the adapter in a folder is retrained."""
    digest = hashlib.sha256()
    for name, parameter in sorted(model.named_parameters(), key=lambda item: item[0]):
        if "lora_" in name or "modules_to_save" in name:
            digest.update(name.encode())
            digest.update(parameter.detach().to("cpu", torch.float32).numpy().tobytes())
    return digest.hexdigest()


GradCallback = Callable[[int, torch.Tensor], None]


@contextmanager
def capture_gradients(matrices: list[LoraMatrix], on_grad: GradCallback) -> Iterator[None]:
    """Call `on_grad(index, G)` with G (B, out, in), example-wise weight gradients, during the next backward.

    Padding needs no mask: its labels are ignored and no real token attends to it (the causal mask hides
    right padding, the attention mask left padding), so g is exactly zero there and adds nothing to the sums.
    """

    def forward_hook(index: int):
        def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            if output.requires_grad:
                x = inputs[0].detach()  # (B, T, in)
                # g (B, T, out) → Σ_t g_t x_tᵀ (B, out, in)
                output.register_hook(lambda g: on_grad(index, torch.bmm(g.transpose(1, 2), x.to(g.dtype))))

        return hook

    with _forward_hooks(matrices, forward_hook):
        yield


@contextmanager
def capture_positions(matrices: list[LoraMatrix], direction: list[torch.Tensor],
                      on_part: Callable[[torch.Tensor], None]) -> Iterator[None]:
    """Call `on_part(h)` with h (B, T) = g_tᵀ V x_t, each position's part of vᵀ∇L along `direction` V (one tensor
    per matrix, shaped like its weight), once per LoRA matrix during the next backward: Σ over matrices and
    positions is vᵀ∇L_i, as Σ_t g_t x_tᵀ is ∇W_i (padding: g = 0, so h = 0)."""

    def forward_hook(index: int):
        def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            if not output.requires_grad:
                return
            x, v = inputs[0].detach(), direction[index].to(inputs[0])  # (B, T, in), (out, in)
            if v.shape[1] <= v.shape[0]:  # the product in the smaller width: gᵀ V x = (g V)·x, in ≤ out
                output.register_hook(lambda g: on_part(((g @ v.to(g.dtype)) * x.to(g.dtype)).sum(-1)))  # (B, T)
            else:  # = g·(V x), out < in
                vx = x @ v.T  # (B, T, out)
                output.register_hook(lambda g: on_part((g * vx.to(g.dtype)).sum(-1)))  # (B, T)

        return hook

    with _forward_hooks(matrices, forward_hook):
        yield


@contextmanager
def _forward_hooks(matrices: list[LoraMatrix], hook_of: Callable[[int], Callable]) -> Iterator[None]:
    """`hook_of(index)` as a forward hook on each LoRA matrix, removed after."""
    handles = [matrix.module.register_forward_hook(hook_of(index)) for index, matrix in enumerate(matrices)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def capture_last_hidden(model: typing.Any, on_hidden: Callable[[torch.Tensor], None]) -> Iterator[None]:
    """Call `on_hidden(h)` with h (B, T, d), the last hidden states (the output embeddings' input: after the final
    norm, what `output_hidden_states` returns last), at each forward."""
    head: nn.Module = model.get_output_embeddings()
    handle = head.register_forward_pre_hook(lambda module, inputs: on_hidden(inputs[0].detach()))
    try:
        yield
    finally:
        handle.remove()


def harmful_part(parts: list[torch.Tensor]) -> torch.Tensor:
    """(B,) Σ_s max(0, h_s) of one batch, h (B, T) the sum of `capture_positions`' parts over the LoRA matrices;
    empties `parts` for the next batch."""
    harm = torch.stack(parts).sum(0).double().clamp(min=0.0).sum(-1)  # (B,)
    parts.clear()
    return harm


@contextmanager
def gradient_roots(matrices: list[LoraMatrix]) -> Iterator[list[torch.Tensor]]:
    """Freeze the LoRA weights (the hooks assemble their gradients per example) but where the backward must end.

    A LoRA matrix whose input needs no gradient (the first ones reached from the token ids) would leave its
    output without one, so its weight is kept trainable and the backward ends there: it skips the embeddings'
    path, as a training step does. Yields those weights, filled during the forward: the targets of the backward.
    """
    params = [matrix.module.weight for matrix in matrices]
    flags = [param.requires_grad for param in params]
    roots: list[torch.Tensor] = []

    def pre_hook(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        if torch.is_grad_enabled() and not inputs[0].requires_grad and not module.weight.requires_grad:
            weight = typing.cast(torch.Tensor, module.weight)
            weight.requires_grad_(True)
            roots.append(weight)

    for param in params:
        param.requires_grad_(False)
    handles = [matrix.module.register_forward_pre_hook(pre_hook) for matrix in matrices]
    try:
        yield roots
    finally:
        for handle in handles:
            handle.remove()
        for param, flag in zip(params, flags, strict=True):
            param.requires_grad_(flag)
