"""Was the adapter trained on this base model? Names and tensor shapes, by the rules of `data/adapter_base.py`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gradian.audit.context import AuditContext
from gradian.audit.finding import Finding
from gradian.audit.registry import check
from gradian.data.adapter_base import adapter_shapes, names_same_model
from gradian.errors import InputError


def _input_widths(config: Any) -> set[int]:
    hidden = getattr(config, "hidden_size", None)
    heads = getattr(config, "num_attention_heads", None)
    head_dim = getattr(config, "head_dim", None) or (hidden // heads if hidden and heads else None)
    widths = {hidden, getattr(config, "intermediate_size", None), (heads or 0) * (head_dim or 0)}
    return {w for w in widths if isinstance(w, int) and w > 0}


def _lora_a_shapes(adapter_dir: Path) -> dict[str, list[int]]:
    """Shapes of every `lora_A` weight, from the file header (no tensor is loaded); {} when unreadable."""
    try:
        return {k: list(shape) for k, shape in adapter_shapes(adapter_dir).items() if "lora_A" in k}
    except InputError:
        return {}


@check("adapter_base_mismatch")
def adapter_base_mismatch(ctx: AuditContext) -> list[Finding]:
    """The adapter's `base_model_name_or_path` or its tensor shapes do not fit `--base-model`."""
    if ctx.run is None or not ctx.adapter_config or ctx.base_ref is None:
        return []
    recorded = ctx.adapter_config.get("base_model_name_or_path") or ""
    findings = []
    widths = _input_widths(ctx.base_config)
    shapes = _lora_a_shapes(ctx.run.adapter_dir) if ctx.run.adapter_dir and widths else {}
    wrong = {name: shape for name, shape in shapes.items() if len(shape) == 2 and shape[1] not in widths}
    values = {"adapter_base": recorded, "base_model": ctx.base_ref.spec}
    if wrong:
        name, shape = next(iter(wrong.items()))
        title = (f"the adapter does not fit this base model: {len(wrong)} LoRA matrices expect inputs of width "
                 f"{shape[1]} (e.g. {name}), the base model has {sorted(widths)}")
        fix = f"pass the base model the adapter was trained on (--base-model {recorded or '<its base>'})"
        findings.append(Finding("adapter_base_mismatch", "critical", title, fix, [], {**values, "mismatched": wrong}))
    elif not names_same_model(recorded, ctx.base_ref):
        title = f"the adapter was trained on {recorded!r}, but --base-model is {ctx.base_ref.spec!r}"
        fix = f"pass --base-model {recorded} (or confirm both name the same weights)"
        findings.append(Finding("adapter_base_mismatch", "warning", title, fix, [], values))
    return findings
