"""Per-example LoRA gradients of training rows, batched, projected on the fly and stored resumably.

The loss of example i is the sum of its token NLLs over the supervised tokens, labels shifted as
transformers shifts them; the batch loss is the sum over examples (not the mean), so every example's
gradient stays separable and needs no rescaling. Dropout is off (eval mode): features are the gradient
of the trained model's loss, not of one random mask.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from gradian.data.base_model import loaded_identity
from gradian.data.render import IGNORE, Rendered
from gradian.errors import InputError
from gradian.gradients.batches import Progress, collate, pad_id_of, plan_batches, rows_sha
from gradian.gradients.hooks import (
    LoraMatrix,
    capture_gradients,
    gradient_roots,
    lora_fingerprint,
    lora_matrices,
)
from gradian.gradients.projection import KroneckerProjector
from gradian.gradients.settings import GradientSettings
from gradian.gradients.sides import Sides, SideTaker
from gradian.gradients.store import LAYOUT_VERSION, FeatureStore, ShardWriter

__all__ = [
    "GradientSettings",
    "ParameterScale",
    "ProjectedSample",
    "SampledGradients",
    "example_gradients",
    "extract_train_features",
    "make_projector",
    "per_example_gradients",
    "project_sample",
]

@dataclass
class ParameterScale:
    """A diagonal applied to every LoRA weight gradient before projection (e.g. Adam's 1/√v̂)."""

    name: str  # recorded in the store settings, e.g. "adam:<sha of optimizer.pt>"
    tensors: list[torch.Tensor]  # one per LoRA matrix, shaped like the weight, PEFT's order


@dataclass
class SampledGradients:
    """Exact gradients of sampled training rows, already computed: extraction projects them, no second backward."""

    rows: list[int]  # indices into the rendered rows
    batches: list[torch.Tensor]  # (b, Σ LoRA sizes) per batch of `rows`, in order, on CPU, scaled as the features
    # are, matrices in PEFT's order: kept as the backward gave them (one copy of them all cost more than their pass)
    key: dict[str, Any]  # adapter_sha256, base, scale and rows_sha of `rows`: extraction checks it matches
    sides: dict[str, np.ndarray] = field(default_factory=dict)  # side name → (n, width), from the same backward
    sides_along: dict[str, str] = field(default_factory=dict)  # side name → the digest it was taken along

    @staticmethod
    def key_of(model: nn.Module, rendered: Sequence[Rendered], rows: list[int], scale: ParameterScale | None) -> dict:
        return {"adapter_sha256": lora_fingerprint(model), "base": loaded_identity(model),
                "scale": scale.name if scale is not None else "identity",
                "rows_sha": rows_sha([rendered[i] for i in rows])}


def make_projector(
    model: nn.Module, settings: GradientSettings, matrices: list[LoraMatrix] | None = None
) -> KroneckerProjector:
    """The projector of `model`'s LoRA matrices under `settings`: training features and queries share it."""
    shapes = [m.shape for m in matrices or lora_matrices(model)]
    if settings.proj_dim is not None and settings.proj_dim < len(shapes):
        raise InputError(f"--proj-dim {settings.proj_dim} is smaller than the adapter's {len(shapes)} LoRA matrices, "
                         f"which keep at least one float each: give --proj-dim {len(shapes)} or more, or leave it out "
                         "for the automatic size.")
    return KroneckerProjector(shapes, settings.proj_dim, settings.seed, settings.budget_weights)


def summed_nll(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Σ over examples and supervised tokens of −log p(token): the sum keeps examples separable."""
    return target_nll(logits[:, :-1], labels[:, 1:])


def target_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Σ of −log p(target) over (B, K, V) logits and their (B, K) targets, IGNORE skipped, in float32 at least."""
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE,
                           reduction="sum")


def per_example_gradients(
    model: nn.Module,
    batch: dict[str, torch.Tensor],
    projector: KroneckerProjector | None = None,
    scale: ParameterScale | None = None,
    matrices: list[LoraMatrix] | None = None,
) -> torch.Tensor:
    """(B, k) gradients of each row's summed NLL w.r.t. the LoRA weights; exact and flat when projector=None.

    Exact rows are the concatenation of `weight.grad.flatten()` in `model.named_parameters()` order.
    One batch; `example_gradients` serves many with one set of hooks.
    """
    with example_gradients(model, projector, scale, matrices) as compute:
        return compute(batch)


def gradient_dtype(matrices: list[LoraMatrix]) -> torch.dtype:
    """The dtype the per-example gradients come in: the LoRA weights', float32 for half-precision ones."""
    weight_dtype = matrices[0].module.weight.dtype
    return torch.float32 if weight_dtype in (torch.float16, torch.bfloat16) else weight_dtype


@contextmanager
def example_gradients(
    model: nn.Module,
    projector: KroneckerProjector | None = None,
    scale: ParameterScale | None = None,
    matrices: list[LoraMatrix] | None = None,
    every_logit: bool = False,
) -> Iterator[Callable[[dict[str, torch.Tensor]], torch.Tensor]]:
    """`compute(batch)` → (B, k) as `per_example_gradients`, its hooks registered once for every batch
    (`every_logit`: as `lora_backward` takes it)."""
    matrices = matrices or lora_matrices(model)
    device = next(model.parameters()).device
    dtype = gradient_dtype(matrices)
    dims = [m.size for m in matrices] if projector is None else [plan.dim for plan in projector.plans]
    parts: list[torch.Tensor | None] = [None] * len(matrices)  # (B, k_m) per LoRA matrix, of the current batch

    def on_grad(index: int, grads: torch.Tensor) -> None:  # grads (B, out, in), one LoRA matrix
        grads = grads if grads.dtype == dtype else grads.to(dtype)
        if scale is not None:
            grads = grads * scale.tensors[index].to(grads)  # diagonal preconditioner, before projection
        flat = grads.flatten(1) if projector is None else projector.project(index, grads)  # (B, k_m)
        previous = parts[index]
        parts[index] = flat if previous is None else previous + flat  # a module called twice adds up

    def compute(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        batch = {key: value.to(device) for key, value in batch.items()}
        lora_backward(model, batch, roots, every_logit=every_logit)  # the hooks fill `parts` as the gradient passes
        n_rows = batch["input_ids"].shape[0]
        features = torch.cat(
            [part if part is not None else torch.zeros(n_rows, dim, device=device, dtype=dtype)
             for part, dim in zip(parts, dims, strict=True)],
            dim=1,
        )  # (B, k)
        parts[:] = [None] * len(matrices)  # not held until the next batch (exact gradients can be large)
        return features

    with dropout_off(model), capture_gradients(matrices, on_grad), gradient_roots(matrices) as roots:
        yield compute


@contextmanager
def dropout_off(model: nn.Module) -> Iterator[None]:
    """Eval mode inside (features are the trained model's gradients, not one dropout mask's); put back after."""
    was_training = model.training
    if was_training:
        model.eval()
    try:
        yield
    finally:
        if was_training:
            model.train()


def lora_backward(model: nn.Module, batch: dict[str, torch.Tensor], roots: list[torch.Tensor], *,
                  every_logit: bool = False) -> None:
    """One forward and backward of the batch's summed NLL; hooks on the LoRA matrices see their gradients.

    Inside `hooks.gradient_roots`, whose `roots` are where the backward ends. No roots: the embeddings' output
    requires grad already (`enable_input_require_grads`), and the backward ends there; only LoRA parameters
    can be trainable (`lora_matrices`) and they are frozen, so no `.grad` is written.

    The output layer projects only the positions whose next token carries loss in some row (`logits_to_keep`, where
    the model takes it): a prompt position's logits add nothing to the loss or its gradient, and the vocabulary
    projection is the largest matmul of a small model. `every_logit` projects every position (a hook that reads the
    output layer's input, RepSim's, needs all of them).
    """
    loss = target_nll(*trained_logits(model, batch, every_logit=every_logit))  # sum, not mean: examples separable
    if roots:
        torch.autograd.grad(loss, roots)
    else:
        loss.backward()


def trained_logits(model: nn.Module, batch: dict[str, torch.Tensor], *, every_logit: bool = False,
                   forward: Callable[..., Any] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, K, V) the logits at the K positions whose next token is trained in some row (every position with
    `every_logit`), and (B, K) those next tokens, IGNORE where a row's is not trained: all a loss over the trained
    tokens reads. `forward(**inputs)` runs the model (default: `model` itself)."""
    labels = batch["labels"]  # (B, T)
    kept = torch.arange(labels.shape[1] - 1, device=labels.device) if every_logit else \
        (labels[:, 1:] != IGNORE).any(0).nonzero().squeeze(1)  # (K,) positions s whose label s + 1 is trained
    inputs = {key: batch[key] for key in ("input_ids", "attention_mask", "position_ids")}
    run = forward or model
    if every_logit or not takes_logits_to_keep(model):
        logits = run(**inputs).logits[:, kept]  # (B, K, V)
    else:
        logits = run(**inputs, logits_to_keep=kept).logits  # (B, K, V)
    return logits, labels[:, kept + 1]


def takes_logits_to_keep(model: nn.Module) -> bool:
    """Whether the causal LM under `model` (a PeftModel or not) takes `logits_to_keep`, as transformers' do."""
    base_of = getattr(model, "get_base_model", None)
    base: Any = base_of() if callable(base_of) else model
    return "logits_to_keep" in inspect.signature(base.forward).parameters


def extract_train_features(
    model: nn.Module,
    rendered: Sequence[Rendered],
    store_dir: str | Path,
    *,
    settings: GradientSettings,
    shard: tuple[int, int] = (0, 1),
    progress: Progress | None = None,
    scale: ParameterScale | None = None,
    sampled: SampledGradients | ProjectedSample | None = None,
    direction: list[torch.Tensor] | None = None,
    representations: np.ndarray | None = None,
) -> FeatureStore:
    """Write the features of shard `shard` = (rank, world) of `rendered` into `store_dir`; resumes a stopped run.

    Process `rank` writes its block of the store's files (`store.owned_files`); batches are planned inside each
    file, so any number of processes writes the same bytes. Rows marked `dropped` (never trained) get zero
    features. Different settings than an existing store → it is recomputed from scratch (old files removed).
    The rows of `sampled` (the energy pass's, see `gradients.energy`) are projected from their exact gradients
    instead of computed again; pass a `ProjectedSample` (`project_sample`) when every process should write the
    same projected rows.

    With `direction` V (one tensor per LoRA matrix, shaped like its weight) the same backward also gives each row's
    harm from its harmful positions along V; with `representations` (Q, d), the failing queries' mean last hidden
    states, the same forward gives each row's RepSim to them. Both go into side stores beside the features
    (`gradients.sides`: resumable, one writer per file; `sides.position_harms_of` and `sides.repsim_of` read them).
    The energy pass's rows come with their sides when its backward took them along the same (`gradient_energy(taker=)`);
    rows whose features were already there (a store made for another query, the energy pass's rows taken along
    something else) get them from a forward and backward of their own, their features left as they were.
    """
    rank, world = shard
    matrices = lora_matrices(model)
    projector = make_projector(model, settings, matrices)
    ids = [row.example_id for row in rendered]
    meta = store_meta(model, rendered, settings, projector, scale, matrices)
    writer = ShardWriter(Path(store_dir), meta, ids, rank, world, projector.dim)
    sides = Sides(SideTaker(model, matrices, direction=direction, representations=representations),
                  Path(store_dir), meta, ids, shard)
    dropped = [i for i in range(writer.start, writer.stop) if rendered[i].dropped]
    if dropped and not writer.is_done(dropped):  # never trained: no gradient
        writer.write(dropped, np.zeros((len(dropped), projector.dim), dtype=np.float32))
    sides.write_zeros(dropped)
    lengths = {i: len(rendered[i].input_ids) for i in range(writer.start, writer.stop) if not rendered[i].dropped}
    redo: dict[int, int] = {}  # the energy pass's rows whose sides it did not take
    if sampled is not None:
        projected = sampled if isinstance(sampled, ProjectedSample) else \
            project_sample(model, rendered, sampled, settings, scale, projector)
        if projected.key != SampledGradients.key_of(model, rendered, projected.rows, scale):
            raise ValueError("the sampled gradients are of another adapter, scaling or rows than these features")
        mine = [j for j, i in enumerate(projected.rows) if i in lengths]  # this process's, as positions
        if mine and not writer.is_done([projected.rows[j] for j in mine]):
            writer.write([projected.rows[j] for j in mine], projected.features[mine])
        for j in mine:
            del lengths[projected.rows[j]]
        if projected.sides_along == sides.taker.along:  # the energy pass's backward took the sides too
            sides.write_values([projected.rows[j] for j in mine],
                               {name: values[mine] for name, values in projected.sides.items()})
        elif sides:  # taken along something else, or not at all: a forward and backward of their own
            redo = {projected.rows[j]: len(rendered[projected.rows[j]].input_ids) for j in mine}
    pad_id = pad_id_of(model)
    store_dtype = getattr(torch, settings.store_dtype)  # converted by torch: numpy's float16 cast is 25× slower
    planned = [lengths] + ([redo] if redo else [])
    batches = [batch for part in planned for file in writer.files for batch in plan_batches(
        {i: n for i, n in part.items() if file.start <= i < file.stop}, settings)]  # inside a file: see store
    with example_gradients(model, projector, scale, matrices, sides.taker.every_logit) as compute, sides.hooks():
        for rows in progress(batches) if progress is not None else batches:
            has_features = writer.is_done(rows)
            if has_features and sides.is_done(rows):
                continue
            batch = collate([(rendered[i].input_ids, rendered[i].labels) for i in rows], pad_id, settings.padding_side)
            features = compute(batch)  # (B, k); the same forward and backward feed the sides' hooks
            if not has_features:
                writer.write(rows, features.detach().to(store_dtype).cpu().numpy())
            sides.write(rows, batch["attention_mask"])
    return FeatureStore(store_dir, meta=json.loads(json.dumps(meta)), ids=ids)  # as settings.json reads back


def store_meta(model: nn.Module, rendered: Sequence[Rendered], settings: GradientSettings,
               projector: KroneckerProjector, scale: ParameterScale | None,
               matrices: list[LoraMatrix]) -> dict[str, object]:
    """What a store's features mean; its hash names the files, so a change in any of it recomputes them."""
    ids = [row.example_id for row in rendered]
    return {
        **feature_meta(ids, settings, projector, scale.name if scale is not None else "identity", matrices),
        "rows_sha": rows_sha(rendered),
        "adapter_sha256": lora_fingerprint(model),  # a retrained adapter or edited rows recompute, never reuse
        "base": loaded_identity(model),  # so does a base replaced in place
    }


def feature_meta(ids: list[str], settings: GradientSettings, projector: KroneckerProjector, scale: str,
                 matrices: list[LoraMatrix]) -> dict[str, object]:
    """The meta every feature store holds, extracted or captured: its settings, projection, scale (a
    `ParameterScale` name, "adam" or "identity"), LoRA matrices and rows (`ids`, by count and hash)."""
    return {
        "version": 1,
        "layout": LAYOUT_VERSION,
        "gradient": settings.to_dict(),
        "projection": projector.to_dict(),
        "scale": scale,
        "n_rows": len(ids),
        "matrices": [m.name for m in matrices],
        "ids_sha": ids_sha(ids),
    }


def ids_sha(ids: Sequence[str]) -> str:
    """The digest of a store's row ids, in order: a store is of these rows and no others."""
    return hashlib.sha256(json.dumps(list(ids)).encode()).hexdigest()


@dataclass
class ProjectedSample:
    """The energy pass's rows already projected into the store's space: small, so it is broadcast to every rank."""

    rows: list[int]  # indices into the rendered rows
    features: np.ndarray  # (n, k) in the store dtype
    key: dict[str, Any]  # as `SampledGradients.key`
    sides: dict[str, np.ndarray] = field(default_factory=dict)  # as `SampledGradients.sides`
    sides_along: dict[str, str] = field(default_factory=dict)


def project_sample(
    model: nn.Module, rendered: Sequence[Rendered], sampled: SampledGradients, settings: GradientSettings,
    scale: ParameterScale | None = None, projector: KroneckerProjector | None = None,
) -> ProjectedSample:
    """Project the sampled exact gradients under `settings`, a batch at a time (no second copy of all of them)."""
    if sampled.key != SampledGradients.key_of(model, rendered, sampled.rows, scale):
        raise ValueError("the sampled gradients are of another adapter, scaling or rows than these features")
    projector = projector or make_projector(model, settings)
    device = next(model.parameters()).device
    store_dtype = getattr(torch, settings.store_dtype)
    parts = [projector.project_exact(flat.to(device)).to(store_dtype).cpu().numpy()  # (B, Σ LoRA sizes) → (B, k)
             for flat in sampled.batches]
    features = np.concatenate(parts) if parts else np.zeros((0, projector.dim), settings.store_dtype)
    return ProjectedSample(list(sampled.rows), features, dict(sampled.key), dict(sampled.sides),
                           dict(sampled.sides_along))
