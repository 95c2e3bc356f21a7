"""Learning rate, LoRA rank and alpha outside the ranges where LoRA fine-tunes behave."""

from __future__ import annotations

import math

from gradian.audit.context import AuditContext
from gradian.audit.finding import Finding
from gradian.audit.registry import check
from gradian.audit.schedule import training_went_wrong

LR_HIGH = 1e-3  # LoRA on models ≥ 1024 wide: collapse / NaN reported at 3e-3 (tloen/alpaca-lora#391); 1e-4..3e-4 usual
LR_CRITICAL = 1e-2
LR_LOW = 1e-6
REFERENCE_WIDTH = 1024  # safe rates scale roughly as 1/width (muP): narrower models tolerate proportionally more
SCALE_RANGE = (0.1, 8.0)  # alpha / r (alpha / sqrt(r) with rsLoRA)
RANK_HIGH = 512


def _learning_rate(ctx: AuditContext) -> float | None:
    if ctx.setup.learning_rate is not None:
        return float(ctx.setup.learning_rate)
    logged = [row["learning_rate"] for row in ctx.log_history if isinstance(row.get("learning_rate"), (int, float))]
    return max(logged) if logged else None


def _width_factor(ctx: AuditContext) -> float:
    width = getattr(ctx.base_config, "hidden_size", None)
    return max(1.0, REFERENCE_WIDTH / width) if isinstance(width, int) and width > 0 else 1.0


@check("learning_rate")
def learning_rate(ctx: AuditContext) -> list[Finding]:
    """Peak learning rate too high for LoRA (collapse, NaN) or too low to learn anything. The ranges are for
    models ≥ 1024 wide and scale up for narrower ones.

    A rate is a risk, not a fault: far above the range (≥ LR_CRITICAL) it is critical when the log shows the
    damage (NaN, spikes, a loss that never fell) or when there is no log to look at; a log of smooth training
    makes it a warning."""
    lr, factor = _learning_rate(ctx), _width_factor(ctx)
    high = LR_HIGH * factor
    if lr is None or LR_LOW <= lr <= high:
        return []
    values = {"learning_rate": lr, "high": high}
    if lr > high:
        damage = training_went_wrong(ctx.log_history)
        logged = sum(isinstance(row.get("loss"), (int, float)) for row in ctx.log_history) >= 2
        values["log_shows"] = damage
        severity = "critical" if lr >= LR_CRITICAL * factor and (damage or not logged) else "warning"
        title = f"learning rate {lr:g} is high for LoRA on this model (above {high:.2g}: loss collapse, NaN)"
        title += f"; the log shows it: {damage}" if damage else ("; the log shows smooth training" if logged else "")
        fix = f"use learning_rate={2e-4 * factor:.2g} (LoRA's usual 1e-4 to 3e-4 at width 1024+) with warmup_ratio=0.03"
    else:
        severity = "warning"
        title = f"learning rate {lr:g} is too low for LoRA to move the model"
        fix = "use learning_rate=1e-4 to 3e-4 for LoRA"
    return [Finding("learning_rate", severity, title, fix, [], values)]


@check("lora_alpha_rank")
def lora_alpha_rank(ctx: AuditContext) -> list[Finding]:
    """The LoRA update is scaled by alpha/r (alpha/sqrt(r) with rsLoRA): far from 1-2 it over- or under-steps."""
    config = ctx.adapter_config
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, (int, float)) or not isinstance(alpha, (int, float)) or rank <= 0:
        return []
    rslora = bool(config.get("use_rslora"))
    scale = alpha / (math.sqrt(rank) if rslora else rank)
    values = {"r": rank, "lora_alpha": alpha, "use_rslora": rslora, "scale": round(scale, 4)}
    findings = []
    if not SCALE_RANGE[0] <= scale <= SCALE_RANGE[1]:
        formula = "alpha/sqrt(r)" if rslora else "alpha/r"
        target = round(2 * (math.sqrt(rank) if rslora else rank))
        title = f"LoRA scale {formula} = {scale:g} (r={rank}, lora_alpha={alpha}) is outside {SCALE_RANGE[0]}–{SCALE_RANGE[1]}"
        fix = f"set lora_alpha={target} (scale 2) for r={rank}, or lower the learning rate in proportion"
        findings.append(Finding("lora_alpha_rank", "warning", title, fix, [], values))
    if rank >= RANK_HIGH:
        title = f"LoRA rank r={rank} is very high (more parameters than the data can steer; slow)"
        findings.append(Finding("lora_alpha_rank", "info", title, "try r=16 to 64 first", [], values))
    return findings
