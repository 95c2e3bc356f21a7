"""Was the adapter trained on this base model? Names and tensor shapes, read from headers only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gradian.audit.context import AuditContext
from gradian.audit.finding import Finding
from gradian.audit.registry import check


def _name_parts(name: str) -> list[str]:
    return [part for part in str(name).replace("\\", "/").rstrip("/").split("/") if part]


def same_model(adapter_base: str, base_spec: str) -> bool:
    """Same folder, same hub id, or the same last path components (`org/name` or `name`)."""
    if not adapter_base or not base_spec:
        return True
    a, b = Path(adapter_base), Path(base_spec)
    if a.exists() and b.exists():
        return a.resolve() == b.resolve()
    left, right = _name_parts(adapter_base), _name_parts(base_spec)
    if not left or not right:
        return True
    tail = min(len(left), len(right), 2)
    if left[-tail:] == right[-tail:]:
        return True
    return left[-1].lower() == right[-1].lower() and "snapshots" not in (left + right)


def _input_widths(config: Any) -> set[int]:
    hidden = getattr(config, "hidden_size", None)
    heads = getattr(config, "num_attention_heads", None)
    head_dim = getattr(config, "head_dim", None) or (hidden // heads if hidden and heads else None)
    widths = {hidden, getattr(config, "intermediate_size", None), (heads or 0) * (head_dim or 0)}
    return {w for w in widths if isinstance(w, int) and w > 0}


def _lora_a_shapes(adapter_dir: Path) -> dict[str, list[int]]:
    """Shapes of every `lora_A` weight, from the safetensors header (no tensor is loaded)."""
    from safetensors import safe_open

    path = adapter_dir / "adapter_model.safetensors"
    if not path.is_file():
        return {}
    try:
        with safe_open(str(path), framework="pt") as handle:
            return {k: list(handle.get_slice(k).get_shape()) for k in handle.keys() if "lora_A" in k}
    except Exception:
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
    elif not same_model(recorded, ctx.base_ref.spec):
        title = f"the adapter was trained on {recorded!r}, but --base-model is {ctx.base_ref.spec!r}"
        fix = f"pass --base-model {recorded} (or confirm both name the same weights)"
        findings.append(Finding("adapter_base_mismatch", "warning", title, fix, [], values))
    return findings
