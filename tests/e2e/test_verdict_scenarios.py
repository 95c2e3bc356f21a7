"""The joined rules on scenario runs: real audit findings, real generations, symptoms and failure sites.

The gradients are replaced by noise (harm spread over every row, no cluster concentrated) so these tests check what
the issue asks of the audit-and-symptom rules alone: the planted cause must come out, or the test fails. The end to
end runs with real gradients are in test_attribute.py.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from gradian.audit import diagnose
from gradian.audit.finding import Finding
from gradian.capabilities import get_capability
from gradian.clusters.cluster import cluster_examples
from gradian.clusters.groups import candidate_groups
from gradian.clusters.naming import name_clusters
from gradian.clusters.summary import summarize_clusters
from gradian.regression.loading import load_models
from gradian.regression.measure import measure_regression
from gradian.regression.symptoms import classify_failures
from gradian.verdict import decide

pytestmark = pytest.mark.slow  # builds scenarios once per machine, then generates 2 x 200 answers each
CAPABILITY = get_capability("json_formatting")


def measured(folder: Path, out: Path):
    audit = diagnose(folder / "train.jsonl", base_model=str(folder / "base"), eval_dataset=folder / "eval.jsonl",
                     run=folder / "run")
    model, tokenizer = load_models(audit.base_ref, str(folder / "run"), device="cpu")
    regression = measure_regression(model, tokenizer, audit.eval_examples, CAPABILITY, audit.setup, out)
    return audit, regression, json.loads((folder / "truth.json").read_text())


def verdict_with_spread_gradients(audit, regression, findings=None, seed: int = 0):
    """The verdict when the gradients name nothing: (Q, N) noise effects over real text clusters."""
    findings = audit.findings if findings is None else findings
    ids = [e.id for e in audit.examples]
    effects = np.random.default_rng(seed).normal(-0.1, 1.0, size=(16, len(ids)))
    texts = [(e.prompt_text, e.completion_text) for e in audit.examples]
    labels = cluster_examples(texts, seed=seed)
    clusters = summarize_clusters(ids, labels, effects, name_clusters(texts, labels), findings, seed=seed)
    symptoms = classify_failures(regression.rows, CAPABILITY)
    groups = candidate_groups(audit.examples, findings, effects, clusters, [r.prompt for r in regression.failures()])
    verdict = decide(regression.summary.to_dict(), findings, groups.clusters, effects.mean(axis=0), ids,
                     symptoms=symptoms, groups=groups.groups)
    return verdict, symptoms, groups


def recovery(named: list[str], truth: dict) -> tuple[float, float]:
    planted = set(truth["culprit_ids"])
    hits = len(planted & set(named))
    return hits / max(len(named), 1), hits / len(planted)


def test_truncated_cluster_names_the_planted_rows_from_the_audit_and_the_symptoms(scenario, tmp_path):
    audit, regression, truth = measured(scenario("truncated-cluster", 0), tmp_path / "out")
    verdict, symptoms, groups = verdict_with_spread_gradients(audit, regression)
    assert symptoms.dominant == "stops-early" and symptoms.shares["stops-early"] >= 0.8, symptoms.counts
    cut = next(g for g in groups.groups if g.check == "cut_in_data")
    assert cut.failure_share >= 0.5 and cut.failure_lift >= 3, (cut.failure_share, cut.failure_lift)
    assert verdict.kind == "data-cluster", verdict.summary
    assert verdict.evidence["gradients"]["agreement"] == "spread"
    precision, recall = recovery(verdict.culprit_ids, truth)
    assert precision >= 0.9 and recall >= 0.9, (precision, recall)


def gate(verdict, truth: dict) -> list[str]:
    """The verdict-stability gate: how a verdict departs from the scenario's ground truth (its planted kind, and
    for a data cause the planted rows at precision and recall ≥ 0.9); empty when it holds."""
    wrong = [] if verdict.kind == truth["kind"] else [f"verdict {verdict.kind}, planted {truth['kind']}"]
    if truth["kind"] == "data-cluster" and verdict.kind == "data-cluster":
        precision, recall = recovery(verdict.culprit_ids, truth)
        wrong += [f"precision {precision:.2f}, recall {recall:.2f}"] if min(precision, recall) < 0.9 else []
    elif verdict.culprit_ids:
        wrong.append(f"{len(verdict.culprit_ids)} rows named where none are planted")
    return wrong


@pytest.fixture(scope="module")
def pad_eos(scenario, tmp_path_factory):
    return measured(scenario("pad-eos", 0), tmp_path_factory.mktemp("pad-eos"))


def test_pad_eos_is_setup_with_answers_that_never_stop_even_with_the_collator_unknown(pad_eos):
    audit, regression, truth = pad_eos
    verdict, symptoms, _ = verdict_with_spread_gradients(audit, regression)
    assert gate(verdict, truth) == [], verdict.summary
    assert symptoms.dominant == "never-stops" and symptoms.shares["never-stops"] >= 0.8, symptoms.counts
    assert verdict.kind == "setup" and verdict.evidence["finding"]["check"] == "pad_eos_masking"
    # the run: the collator is unknown, so the audit can only warn that pad == eos might mask EOS
    unknown = [dataclasses.replace(f, severity="warning", example_ids=[], values={**f.values,
                                                                                 "collator_masks_pad": None})
               if f.check == "pad_eos_masking" else f for f in audit.findings]
    verdict, _, _ = verdict_with_spread_gradients(audit, regression, unknown)
    assert verdict.kind == "setup" and verdict.evidence["finding"]["severity"] == "warning", verdict.summary
    assert verdict.evidence["symptom"]["dominant"] == "never-stops"


def test_the_gate_fails_when_one_verdict_rule_is_flipped(pad_eos, monkeypatch):
    """The gate can fail: with rules 2 and 3 (a setup fault from the audit or from the answers' symptom) switched
    off, the pad == eos run's verdict is no longer the planted `setup`, and the gate says so."""
    from gradian.verdict import rules

    audit, regression, truth = pad_eos
    monkeypatch.setattr(rules, "explaining_setup_finding", lambda *args: None)
    monkeypatch.setattr(rules, "stop_by_symptom", lambda *args: None)
    verdict, _, _ = verdict_with_spread_gradients(audit, regression)
    assert gate(verdict, truth) and gate(verdict, truth)[0].startswith(f"verdict {verdict.kind}, planted setup")


def test_null_run_is_no_regression(scenario, tmp_path):
    audit, regression, truth = measured(scenario("null", 0), tmp_path / "out")
    verdict, _, _ = verdict_with_spread_gradients(audit, regression)
    assert verdict.kind == "no-regression" and verdict.culprit_ids == []
    assert gate(verdict, truth) == []


def test_the_clean_chat_template_family_is_no_regression(scenario, tmp_path):
    """kitchen-null-bpe (dev): clean rows as ChatML turns on a byte-level BPE base, trained with assistant-only loss.
    The gate for the bpe path (its tokenizer, base, template and TRL preparation): a change there that breaks the
    base under its recipe shows as a clean run that regresses (a corpus drift once cost it 49.5 points)."""
    audit, regression, truth = measured(scenario("kitchen-null-bpe", 0), tmp_path / "out")
    verdict, _, _ = verdict_with_spread_gradients(audit, regression)
    assert gate(verdict, truth) == [], verdict.summary


def test_format_cluster_names_the_targets_that_fail_the_capability(scenario, tmp_path):
    """`fails_capability` is built here as the audit check builds it: the capability applied to each target."""
    audit, regression, truth = measured(scenario("format-cluster", 0), tmp_path / "out")
    failing = [e.id for e in audit.examples if not CAPABILITY.passes(e.completion_text, None)]
    fails = Finding("fails_capability", "warning", f"{len(failing)} training completions fail json_formatting.",
                    "fix or drop them", example_ids=failing)
    verdict, symptoms, groups = verdict_with_spread_gradients(audit, regression, audit.findings + [fails])
    assert symptoms.counts["wrapped"] == 0 and symptoms.counts["other"] > 0, symptoms.counts
    assert verdict.kind == "data-cluster" and verdict.evidence["group"] == "fails_capability", verdict.summary
    precision, recall = recovery(verdict.culprit_ids, truth)
    assert precision >= 0.9 and recall >= 0.9, (precision, recall)
    without, _, _ = verdict_with_spread_gradients(audit, regression)  # the audit without that check names nothing
    assert without.kind == "diffuse" and without.evidence["cause_found"] is False, without.summary
