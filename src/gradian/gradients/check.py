"""Gradients that agree with themselves: before any row is ranked, a few rows' features taken as the run takes them
(batched, padded on the run's side, in the model's dtype and attention) are compared with the same rows' features
taken alone, unpadded, in float32.

bf16 rounding, a padding side an attention kernel mishandles, or position ids / a mask that never reach the model
change per-example gradients without any error: a ranking built on them ranks noise. The check costs one batched and
a handful of single-row backwards, on the model already loaded (its floating tensors are cast to float32 in place
for the reference and cast back exactly: bf16 and fp16 values are float32 values).

Both sides are compared in the store's feature space: the run's projector (and parameter scale) applied to both, a
fixed linear map, so what is compared is what the ranking reads; a disagreement the projection hid would not reach
the ranking either.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np
import torch
from torch import nn

from gradian.data.render import Rendered
from gradian.gradients.batches import collate, pad_id_of, row_batches
from gradian.gradients.extract import ParameterScale, example_gradients, make_projector
from gradian.gradients.hooks import lora_matrices
from gradian.gradients.projection import KroneckerProjector
from gradian.gradients.settings import GradientSettings

CHECK_ROWS = 6  # rows checked: the longest, the shortest (the most padded) and a seeded sample of the others
# In float32, batched and alone differ only by summation order: cosine 1 − 1e-12, norms within 4e-7 on the tests'
# tiny Llama. bf16 keeps 8 bits of mantissa: honest bf16 gradients came within cosine 0.9999 and 0.7% in norm of
# float32 at width 256, but down to cosine 0.982 and 4.3% at width 32 (unpadded alike: rounding, a tiny width being
# the worst case), 0.995 and 2.4% with the LoRA weights in float32 as PEFT loads them onto a bf16 model. A padding
# fault turns whole rows: left padding with its mask and position ids dropped measured cosine 0.24 and a norm off by
# 198% (the peer report's bf16 padding: −0.42). The floor refuses the first tiny-width case and every fault.
MIN_COSINE = 0.99
MAX_NORM_ERROR = 0.10  # |‖run‖ − ‖reference‖| / ‖reference‖: above bf16's measured 4.8%, far below a fault's
REFERENCE_ATTENTION = "sdpa"  # unpadded, no mask: PyTorch's causal kernel; eager would hold T² floats per layer

Batches = Callable[[nn.Module, Sequence[Rendered], list[int], GradientSettings],
                   Iterator[tuple[list[int], dict[str, torch.Tensor]]]]


@dataclass(frozen=True)
class GradientCheck:
    """The check's numbers: per checked row, the cosine and relative norm error of the run's features against the
    float32 unpadded reference; and what the run did (dtype, attention, padding side, batch size)."""

    rows: list[int]  # indices into the rendered rows
    cosines: list[float]
    norm_errors: list[float]
    dtype: str
    attention: str
    padding_side: str
    batch_size: int

    @property
    def min_cosine(self) -> float:
        return min(self.cosines)

    @property
    def max_norm_error(self) -> float:
        return max(self.norm_errors)

    @property
    def agrees(self) -> bool:
        return self.min_cosine >= MIN_COSINE and self.max_norm_error <= MAX_NORM_ERROR

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows_checked": len(self.rows), "min_cosine": self.min_cosine, "max_norm_error": self.max_norm_error,
            "min_cosine_allowed": MIN_COSINE, "max_norm_error_allowed": MAX_NORM_ERROR, "agrees": self.agrees,
            "compared": {"run": f"{self.dtype}, {self.attention} attention, batches of up to {self.batch_size} "
                                f"padded on the {self.padding_side}",
                         "reference": f"float32, {REFERENCE_ATTENTION} attention, each row alone and unpadded",
                         "features": "the store's features (its projection and scale on both sides)"},
        }


def check_rows(rendered: Sequence[Rendered], seed: int, n: int = CHECK_ROWS) -> list[int]:
    """The trained rows checked, in order: the longest and the shortest (padding shows most on them), and a sample of
    the others seeded by `seed`."""
    trained = [i for i, row in enumerate(rendered) if not row.dropped]
    if not trained:
        return []
    by_length = sorted(trained, key=lambda i: (len(rendered[i].input_ids), i))
    ends = {by_length[0], by_length[-1]}
    rest = [i for i in trained if i not in ends]
    picked = np.random.default_rng(seed).choice(len(rest), size=min(n - len(ends), len(rest)), replace=False)
    return sorted(ends | {rest[int(j)] for j in picked})


def check_gradients(
    model: nn.Module, rendered: Sequence[Rendered], settings: GradientSettings, *,
    projector: KroneckerProjector | None = None, scale: ParameterScale | None = None, rows: list[int] | None = None,
    batches: Batches = row_batches,
) -> GradientCheck | None:
    """The run's features of `rows` (default `check_rows`) against their float32 unpadded ones; None with no row.

    `batches` batches the rows as the run does (`batches.row_batches`); tests pass a faulty one.
    """
    rows = check_rows(rendered, settings.seed) if rows is None else rows
    if not rows:
        return None
    matrices = lora_matrices(model)
    projector = projector or make_projector(model, settings, matrices)
    dtype, attention = dtype_of(model), attention_of(model)
    run: dict[int, torch.Tensor] = {}
    with example_gradients(model, projector, scale, matrices) as compute:  # as extraction computes them
        for batch_rows, batch in batches(model, rendered, rows, settings):
            run.update(zip(batch_rows, compute(batch).double().cpu(), strict=True))  # (k,) each
    with float32_reference(model), example_gradients(model, projector, scale, matrices) as compute:
        pad_id = pad_id_of(model)
        alone = {i: compute(collate([(rendered[i].input_ids, rendered[i].labels)], pad_id))[0].double().cpu()
                 for i in rows}  # one row: no padding, an all-ones mask
    cosines, errors = zip(*(cosine_and_error(run[i], alone[i]) for i in rows), strict=True)
    return GradientCheck(list(rows), list(cosines), list(errors), dtype, attention, settings.padding_side,
                         settings.batch_size)


def disagreement(check: GradientCheck) -> str:
    """The refusal's sentence: what the run does differently from the reference, the numbers, and what to pass."""
    padded = check.batch_size > 1
    differs = [f"its dtype ({check.dtype})"] if check.dtype not in ("float32", "float64") else []
    differs += [f"its {check.attention} attention"] if check.attention != REFERENCE_ATTENTION else []
    differs += [f"its padding ({check.padding_side} side, batches of up to {check.batch_size})"] if padded else []
    fixes = ["--dtype float32"] if check.dtype not in ("float32", "float64") else []
    fixes += ["--batch-size 1 (no padding)"] if padded else []
    return (f"the per-example gradients as this run takes them disagree with the same {len(check.rows)} rows' "
            f"gradients taken alone, unpadded, in float32 with {REFERENCE_ATTENTION} attention (lowest cosine "
            f"{check.min_cosine:.4f}, at least {MIN_COSINE} needed; largest norm error {check.max_norm_error:.1%}, "
            f"at most {MAX_NORM_ERROR:.0%} allowed), so a ranking by them would rank noise; the run differs in "
            f"{' and '.join(differs) or 'nothing Gradian sets (look at the model code)'}: rerun with "
            f"{' or '.join(fixes) or 'the model in float32'}, or pass --no-gradient-check to rank by them anyway.")


def cosine_and_error(run: torch.Tensor, reference: torch.Tensor) -> tuple[float, float]:
    """(cosine, relative norm error) of `run` against `reference`, float64; two zero vectors agree (1, 0)."""
    norm_run, norm_ref = float(run.norm()), float(reference.norm())
    if norm_ref == 0.0:
        return (1.0, 0.0) if norm_run == 0.0 else (0.0, float("inf"))
    cosine = float(run @ reference) / (norm_run * norm_ref) if norm_run > 0 else 0.0
    return cosine, abs(norm_run - norm_ref) / norm_ref


def dtype_of(model: nn.Module) -> str:
    """The dtype the model computes in: its embeddings' (PEFT keeps a bf16 model's LoRA weights in float32)."""
    embeddings = getattr(model, "get_input_embeddings", lambda: None)()
    weight = getattr(embeddings, "weight", None)
    dtype = weight.dtype if isinstance(weight, torch.Tensor) else next(model.parameters()).dtype
    return str(dtype).removeprefix("torch.")


def attention_of(model: nn.Module) -> str:
    """The attention implementation the model runs (transformers' `config._attn_implementation`)."""
    config = getattr(model, "config", None)
    return str(getattr(config, "_attn_implementation", None) or "unknown")


@contextmanager
def float32_reference(model: nn.Module) -> Iterator[None]:
    """The model's bf16 and fp16 tensors in float32 with `REFERENCE_ATTENTION` inside; each tensor's own dtype and the
    model's attention after (a float64 model stays float64).

    Cast in place, not loaded again: bf16 and fp16 values are exact in float32, so casting back restores every bit.
    """
    tensors = [t for t in chain(model.parameters(), model.buffers()) if t.dtype in (torch.bfloat16, torch.float16)]
    dtypes = [t.dtype for t in tensors]
    attention = attention_of(model)
    switch = getattr(model, "set_attn_implementation", None)
    try:
        for tensor in tensors:
            tensor.data = tensor.data.float()
        if switch is not None and attention != REFERENCE_ATTENTION:
            switch(REFERENCE_ATTENTION)
        yield
    finally:
        for tensor, dtype in zip(tensors, dtypes, strict=True):
            tensor.data = tensor.data.to(dtype)
        if switch is not None and attention != REFERENCE_ATTENTION and attention != "unknown":
            switch(attention)
