"""Severities follow the evidence: a risky setting is a warning; critical when the log shows the damage."""

from __future__ import annotations

import pytest
from test_audit import context, fired, healthy_log, run_info

from audit_rows import base_config
from gradian.audit import run_checks
from gradian.data.setup import TrainingSetup


def overfit_log() -> list[dict]:
    """Train loss falls throughout; eval loss bottoms out at step 10 (1.20) and climbs to 1.55 by step 50."""
    log = [{"loss": 2.0 - 0.03 * s, "grad_norm": 1.0, "learning_rate": 2e-4, "step": s} for s in range(1, 51)]
    log += [{"eval_loss": loss, "step": step} for step, loss in [(5, 1.4), (10, 1.2), (20, 1.3), (30, 1.4), (50, 1.55)]]
    return sorted(log, key=lambda row: row["step"])


def test_many_epochs_over_few_rows_is_a_warning_without_overfitting(tiny_tokenizer):
    for log in ([], healthy_log()):  # no log at all, or a log whose eval loss keeps falling
        finding = fired(run_checks(context(tiny_tokenizer, run=run_info(log, epochs=10)), only=["many_epochs"]),
                        "many_epochs")
        assert finding.severity == "warning" and finding.values["overfitting"] is None


def test_many_epochs_is_critical_when_the_log_shows_overfitting_and_cites_it(tiny_tokenizer):
    findings = run_checks(context(tiny_tokenizer, run=run_info(overfit_log(), epochs=10)))
    finding = fired(findings, "many_epochs")
    assert finding.severity == "critical"
    assert finding.values["overfitting"]["best_step"] == 10 and finding.values["overfitting"]["last_step"] == 50
    assert "eval loss rose from 1.200 (step 10) to 1.550 (step 50)" in finding.title
    assert "train loss fell from 1.700 to 0.500" in finding.title
    assert fired(findings, "eval_loss_rising").severity == "warning"  # the same evidence, reported once as critical


def test_few_epochs_with_overfitting_leave_many_epochs_silent(tiny_tokenizer):
    findings = run_checks(context(tiny_tokenizer, run=run_info(overfit_log(), epochs=3)))
    assert not [f for f in findings if f.check == "many_epochs"]
    assert fired(findings, "eval_loss_rising").values["best_eval_loss"] == 1.2


def diverged_log() -> list[dict]:
    log = healthy_log()
    log[12]["loss"] = 30.0
    return log


@pytest.mark.parametrize(("log", "severity"), [(None, "critical"), (healthy_log(), "warning"),
                                               (diverged_log(), "critical")])
def test_very_high_learning_rate_is_critical_unless_the_log_shows_smooth_training(tiny_tokenizer, log, severity):
    wide = base_config(tiny_tokenizer, hidden_size=2048)
    run = run_info(log) if log is not None else None
    ctx = context(tiny_tokenizer, setup=TrainingSetup(learning_rate=2e-2), run=run, config=wide)
    finding = fired(run_checks(ctx, only=["learning_rate"]), "learning_rate")
    assert finding.severity == severity
    if log is not None:
        assert ("spike" in finding.title) == (severity == "critical")


def test_train_loss_that_never_fell_counts_as_damage(tiny_tokenizer):
    flat = [{"loss": 2.0 + 0.01 * (s % 3), "grad_norm": 1.0, "step": s} for s in range(1, 21)]
    wide = base_config(tiny_tokenizer, hidden_size=2048)
    ctx = context(tiny_tokenizer, setup=TrainingSetup(learning_rate=2e-2), run=run_info(flat), config=wide)
    finding = fired(run_checks(ctx, only=["learning_rate"]), "learning_rate")
    assert finding.severity == "critical" and "not below where it started" in finding.values["log_shows"]
