"""Each verdict fires on the input built for it and on no other; culprits are the planted rows."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gradian.audit.finding import Finding
from gradian.clusters.summary import summarize_clusters
from gradian.report.verdict import MIN_LIFT, Verdict, decide

N, CATEGORY, CULPRITS = 100, range(0, 30), range(0, 20)  # rows 0-29: the category; 0-19: its planted culprits
IDS = [f"row{i}" for i in range(N)]
LABELS = np.array([0 if i in CATEGORY else 1 + i % 3 for i in range(N)])

SIGNIFICANT = dict(capability="json_formatting", base_rate=0.95, finetuned_rate=0.55, delta=-0.40, ci_low=-0.5,
                   ci_high=-0.3, p_value=1e-6, n=80, significant=True)
NOISE = dict(SIGNIFICANT, finetuned_rate=0.93, delta=-0.02, ci_low=-0.08, ci_high=0.04, p_value=0.6,
             significant=False)
TRUNCATED = Finding("truncated_completion", "critical", "20 completions are truncated by max_length=64.",
                    "raise max_length to \u2265 412 tokens, the p99 of rendered rows",
                    example_ids=[IDS[i] for i in CULPRITS] + ["row50"], values={"p99": 412})
PAD_EOS = Finding("pad_eos_masking", "critical", "pad_token == eos_token and the collator masks pad ids.",
                  "set a pad token distinct from eos")
LEARNING_RATE = Finding("learning_rate", "warning", "learning_rate 3e-3 is high for LoRA.",
                        "lower learning_rate to 2e-4")


def planted_effects(seed: int = 0, culprit_effect: float = -5.0, n_queries: int = 16) -> np.ndarray:
    """(Q, N) effects: culprits strongly negative, everyone else noise around zero."""
    rng = np.random.default_rng(seed)
    effects = rng.normal(0.0, 0.3, size=(n_queries, N))
    effects[:, list(CULPRITS)] += culprit_effect + rng.normal(0.0, 0.5, size=(n_queries, len(CULPRITS)))
    return effects


def verdict_for(regression, findings, effects) -> Verdict:
    clusters = summarize_clusters(IDS, LABELS, effects, {0: "invoice, currency, amount"}, findings, seed=0)
    return decide(regression, findings, clusters, effects.mean(axis=0), IDS)


def test_not_significant_refuses_even_with_planted_cluster_and_critical_finding():
    verdict = verdict_for(NOISE, [TRUNCATED, PAD_EOS], planted_effects())
    assert verdict.kind == "no-regression"
    assert verdict.culprit_ids == []
    assert "noise band" in verdict.summary and "-2.0%" in verdict.summary and "p = 0.6" in verdict.summary


def test_significant_improvement_is_not_a_regression():
    better = dict(SIGNIFICANT, finetuned_rate=0.99, delta=0.04, ci_low=0.01, ci_high=0.07)
    assert verdict_for(better, [], planted_effects()).kind == "no-regression"


def test_critical_run_wide_finding_gives_setup():
    verdict = verdict_for(SIGNIFICANT, [TRUNCATED, LEARNING_RATE, PAD_EOS], planted_effects())
    assert verdict.kind == "setup"
    assert verdict.next_action == PAD_EOS.fix
    assert verdict.evidence["finding"]["check"] == "pad_eos_masking"
    assert verdict.culprit_ids == []


def test_stop_finding_does_not_explain_a_model_that_stops():
    stops = dict(SIGNIFICANT, finetuned_no_stop_rate=0.0, base_no_stop_rate=0.02)
    assert verdict_for(stops, [TRUNCATED, PAD_EOS], planted_effects()).kind == "data-cluster"
    runs_on = dict(SIGNIFICANT, finetuned_no_stop_rate=0.6, base_no_stop_rate=0.02)
    assert verdict_for(runs_on, [TRUNCATED, PAD_EOS], planted_effects()).kind == "setup"


def test_critical_finding_on_most_rows_counts_as_setup_but_not_on_a_cluster():
    everywhere = Finding("missing_eos", "critical", "No EOS.", "append eos", example_ids=IDS[:90])
    assert verdict_for(SIGNIFICANT, [everywhere], planted_effects()).kind == "setup"
    assert verdict_for(SIGNIFICANT, [TRUNCATED], planted_effects()).kind == "data-cluster"  # 21 rows of 100


def test_data_cluster_with_mechanism_names_flagged_rows_of_the_cluster():
    verdict = verdict_for(SIGNIFICANT, [TRUNCATED, LEARNING_RATE], planted_effects())
    assert verdict.kind == "data-cluster"
    assert verdict.culprit_ids == [IDS[i] for i in CULPRITS]  # row50 is flagged but outside the cluster
    assert verdict.evidence["mechanism"] == {"check": "truncated_completion", "inside": 20 / 30, "outside": 1 / 70}
    assert verdict.next_action.startswith("drop these 20 rows: culprits.jsonl")
    assert TRUNCATED.fix in verdict.next_action
    assert "invoice, currency, amount" in verdict.summary and "66.7% of this cluster" in verdict.summary


def test_data_cluster_without_flags_narrows_by_effect_outliers():
    epochs = Finding("many_epochs", "warning", "8 epochs over 100 rows.", "train 2-3 epochs")
    verdict = verdict_for(SIGNIFICANT, [epochs], planted_effects(seed=1))
    assert verdict.kind == "data-cluster"
    assert verdict.evidence["culprit_rule"] == "effect"
    assert set(verdict.culprit_ids) == {IDS[i] for i in CULPRITS}  # the 10 clean neighbours stay
    assert verdict.evidence["effect_threshold"] < 0


def test_spread_harm_gives_diffuse_citing_hyperparameter_findings():
    rng = np.random.default_rng(4)
    effects = rng.normal(-0.2, 0.5, size=(16, N))
    verdict = verdict_for(SIGNIFICANT, [TRUNCATED, LEARNING_RATE], effects)
    assert verdict.kind == "diffuse"
    assert verdict.next_action == f"look at hyperparameters: {LEARNING_RATE.fix} (evidence: learning_rate)"
    assert verdict.culprit_ids == []
    assert verdict.evidence["top_cluster"]["lift"] < MIN_LIFT


def test_critical_hyperparameter_finding_is_diffuse_not_setup():
    epochs = Finding("many_epochs", "critical", "12 epochs over 100 rows.", "train 2-3 epochs")
    rng = np.random.default_rng(5)
    spread = rng.normal(-0.2, 0.5, size=(16, N))
    note = Finding("double_bos", "info", "a run-wide note without a fix", "")
    verdict = verdict_for(SIGNIFICANT, [note, epochs, LEARNING_RATE], spread)
    assert verdict.kind == "diffuse"
    assert verdict.next_action == f"look at hyperparameters: {epochs.fix}; {LEARNING_RATE.fix} " \
        "(evidence: many_epochs, learning_rate)"
    assert verdict_for(SIGNIFICANT, [epochs], planted_effects()).kind == "data-cluster"


def test_lift_below_threshold_is_diffuse_even_with_most_harm():
    clusters = summarize_clusters(IDS, LABELS, planted_effects(), {}, [], seed=0)
    top = dataclasses.replace(clusters[0], lift=MIN_LIFT - 0.01)
    assert decide(SIGNIFICANT, [], [top] + clusters[1:], planted_effects().mean(0), IDS).kind == "diffuse"
    assert decide(SIGNIFICANT, [], clusters, planted_effects().mean(0), IDS).kind == "data-cluster"
    assert decide(SIGNIFICANT, [], [], None, IDS).kind == "diffuse"


def test_unknown_kind_is_rejected():
    with pytest.raises(ValueError):
        Verdict(kind="maybe", summary="", next_action="")


def test_flagged_learning_rate_outranks_a_cluster_with_no_data_defect():
    verdict = verdict_for(SIGNIFICANT, [LEARNING_RATE], planted_effects(seed=1))
    assert verdict.kind == "diffuse"
    assert verdict.culprit_ids == []
    assert verdict.evidence["outranked_by_step_size"] is True
    assert verdict.evidence["top_cluster"]["lift"] >= MIN_LIFT
    assert "The harm shows most in \u201cinvoice, currency, amount\u201d" in verdict.summary
    assert verdict.next_action == f"look at hyperparameters: {LEARNING_RATE.fix} (evidence: learning_rate)"
    info = dataclasses.replace(LEARNING_RATE, severity="info")  # a note, not a flag
    assert verdict_for(SIGNIFICANT, [info], planted_effects(seed=1)).kind == "data-cluster"
    flagged = verdict_for(SIGNIFICANT, [TRUNCATED, LEARNING_RATE], planted_effects())  # a mechanism: the rows
    assert flagged.kind == "data-cluster" and flagged.evidence["mechanism"]["check"] == "truncated_completion"
