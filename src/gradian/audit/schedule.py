"""What the trainer's log says: too many epochs, eval loss rising, spikes and NaN in `log_history`."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gradian.audit.context import AuditContext
from gradian.audit.finding import Finding
from gradian.audit.registry import check

SPIKE = 3.0  # loss above 3x (grad norm above 10x) the median of the previous WINDOW logged steps
GRAD_SPIKE = 10.0
WINDOW = 10
RISE = 1.1  # last eval loss ≥ 110% of the best one


def _epochs(ctx: AuditContext) -> float | None:
    state = ctx.run.trainer_state if ctx.run is not None and ctx.run.trainer_state else {}
    for value in (state.get("num_train_epochs"), ctx.setup.num_train_epochs):
        if isinstance(value, (int, float)) and value > 0:
            return float(value)
    return None


@check("many_epochs")
def many_epochs(ctx: AuditContext) -> list[Finding]:
    """Many passes over few rows: a risk of memorising them, not a fault in itself. A warning, critical only when
    the log shows the overfitting happened (eval loss rising while train loss falls), with its numbers."""
    epochs, rows = _epochs(ctx), len(ctx.examples)
    if epochs is None or epochs < 5 or (epochs < 10 and rows >= 5000):
        return []
    losses = [row["loss"] for row in ctx.log_history if _finite(row.get("loss"))]
    overfit = overfitting(ctx.log_history)
    values: dict[str, Any] = {"epochs": epochs, "rows": rows, "final_train_loss": losses[-1] if losses else None,
                              "overfitting": overfit}
    best = _best_eval(ctx.log_history)
    hint = f"; eval loss was lowest at step {best[0]} (use checkpoint-{best[0]})" if best else ""
    title = f"{epochs:g} epochs over {rows} rows: each row is seen {epochs:g} times"
    if overfit:
        title += (f", and the log shows overfitting: eval loss rose from {overfit['best_eval_loss']:.3f} (step "
                  f"{overfit['best_step']}) to {overfit['last_eval_loss']:.3f} (step {overfit['last_step']}) while "
                  f"train loss fell from {overfit['train_loss_at_best']:.3f} to {overfit['last_train_loss']:.3f}")
    else:
        title += " (a risk of memorisation; " + ("the eval loss shows none)" if best else "no eval loss logged)")
    fix = f"train 1–3 epochs (num_train_epochs=3) or add rows{hint}"
    return [Finding("many_epochs", "critical" if overfit else "warning", title, fix, [], values)]


def overfitting(log: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Eval loss at least RISE x its minimum by the last evaluation while train loss kept falling past that
    minimum, with the numbers; None when the log has fewer than three evaluations or shows no such thing."""
    evals = [(row["step"], row["eval_loss"]) for row in log if _finite(row.get("eval_loss")) and _finite(row.get("step"))]
    if len(evals) < 3:
        return None
    best_step, best_loss = min(evals, key=lambda item: item[1])
    last_step, last_loss = evals[-1]
    train = [(row["step"], row["loss"]) for row in log if _finite(row.get("loss")) and _finite(row.get("step"))]
    before = [loss for step, loss in train if step <= best_step]
    after = [loss for step, loss in train if step > best_step]
    if last_step == best_step or last_loss < RISE * best_loss or not before or not after or after[-1] >= before[-1]:
        return None
    return {"best_step": best_step, "best_eval_loss": best_loss, "last_step": last_step, "last_eval_loss": last_loss,
            "train_loss_at_best": before[-1], "last_train_loss": after[-1]}


@check("eval_loss_rising")
def eval_loss_rising(ctx: AuditContext) -> list[Finding]:
    """Eval loss climbing after its minimum while train loss keeps falling: overfitting."""
    overfit = overfitting(ctx.log_history)
    if overfit is None:
        return []
    best_step = overfit["best_step"]
    title = (f"eval loss rose from {overfit['best_eval_loss']:.3f} (step {best_step}) to {overfit['last_eval_loss']:.3f} "
             f"(step {overfit['last_step']}) while train loss fell: overfitting")
    fix = (f"use checkpoint-{best_step} (lowest eval loss), or set load_best_model_at_end=True with "
           f"metric_for_best_model='eval_loss', or train fewer epochs")
    return [Finding("eval_loss_rising", "warning", title, fix, [], overfit)]


def training_went_wrong(log: list[dict[str, Any]]) -> str | None:
    """What in the log shows training broke (NaN/inf, a loss or grad-norm spike, loss never below its start),
    or None when it trained smoothly; None too when fewer than two train losses were logged."""
    values = [row.get(key) for row in log for key in ("loss", "grad_norm")]
    if any(isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isfinite(v) for v in values):
        return "NaN/inf in the log"
    spikes = _spikes(log, "loss", SPIKE) + _spikes(log, "grad_norm", GRAD_SPIKE)
    if spikes:
        return f"{len(spikes)} spike(s) in the log"
    losses = [row["loss"] for row in log if _finite(row.get("loss"))]
    if len(losses) >= 2 and losses[-1] >= losses[0]:
        return f"train loss ended at {losses[-1]:.3f}, not below where it started ({losses[0]:.3f})"
    return None


@check("loss_spike")
def loss_spike(ctx: AuditContext) -> list[Finding]:
    """Steps whose loss (or grad norm) jumps far above the recent median."""
    spikes = _spikes(ctx.log_history, "loss", SPIKE) + _spikes(ctx.log_history, "grad_norm", GRAD_SPIKE)
    if not spikes:
        return []
    steps = sorted({step for step, _, _ in spikes})
    worst = max(spikes, key=lambda item: item[2])
    title = f"{len(spikes)} spike(s) in the training log (worst: {worst[1]} at step {worst[0]}, {worst[2]:.1f}x the median)"
    fix = "lower the learning rate (or raise warmup_ratio), keep max_grad_norm=1.0, and inspect the batches at steps " \
          + ", ".join(str(s) for s in steps[:8])
    values = {"spikes": [{"step": s, "key": k, "ratio": round(r, 2)} for s, k, r in spikes]}
    return [Finding("loss_spike", "warning", title, fix, [], values)]


@check("nan_in_logs")
def nan_in_logs(ctx: AuditContext) -> list[Finding]:
    """NaN or infinite loss / grad norm: the weights after that step are garbage."""
    bad = [(row.get("step"), key) for row in ctx.log_history for key in ("loss", "grad_norm", "eval_loss")
           if isinstance(row.get(key), (int, float)) and not math.isfinite(row[key])]
    if not bad:
        return []
    first_step, key = bad[0]
    title = f"{key} is NaN/inf at step {first_step} ({len(bad)} logged value(s)): training diverged"
    fix = ("lower the learning rate, keep max_grad_norm=1.0, train in bf16 rather than fp16, and check for rows "
           "with no supervised token; resume from a checkpoint before step " + str(first_step))
    return [Finding("nan_in_logs", "critical", title, fix, [], {"bad": [{"step": s, "key": k} for s, k in bad]})]


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _best_eval(log: list[dict[str, Any]]) -> tuple[int, float] | None:
    evals = [(row["step"], row["eval_loss"]) for row in log if _finite(row.get("eval_loss")) and _finite(row.get("step"))]
    return min(evals, key=lambda item: item[1]) if evals else None


def _spikes(log: list[dict[str, Any]], key: str, ratio: float) -> list[tuple[int, str, float]]:
    series = [(row.get("step", i), row[key]) for i, row in enumerate(log) if _finite(row.get(key))]
    found = []
    for i in range(5, len(series)):
        median = float(np.median([value for _, value in series[max(0, i - WINDOW):i]]))
        if median > 0 and series[i][1] > ratio * median:
            found.append((series[i][0], key, series[i][1] / median))
    return found
