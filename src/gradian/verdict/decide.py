"""The answer: one of five verdicts, with every cause it finds, its evidence, the next action and the rows to drop.

The verdict joins three kinds of evidence: the audit's findings, the symptoms of the failing answers
(`regression.symptoms`) with the finding groups and where the failures sit (`clusters.groups`), and the gradients
(clusters and their harm). Order of the rules, and why:

0. `serving`: the user gave the answers as served (`--served-outputs`), their drop is significant, and the training
   path's drop is not, or is at most `SERVING_ONLY_SHARE` of it. The drop happens after training (an export, a chat
   template, stop tokens, a token limit), so no training row is blamed: the causes are the ways the served path
   differs from training's (`regression.serving_diff`), each with its fix. When both paths regress alike, rules 1 to 8
   decide on the training path as without served answers, and the summary says how much of the drop is served-only.
   A data cause served correctly keeps its data verdict.
1. `no-regression`: the drop is not significant (its CI holds zero) or is not a drop. Attributing noise would send
   the user after rows that did nothing, so Gradian refuses and says so.
2. `setup`: a critical run-wide finding (pad == eos masked away, no EOS, loss on the prompt...) breaks every row at
   once; no subset of rows is to blame, and dropping rows would not fix it. Findings of the `hyperparameter` and
   `run-wide` categories never make it: they act through the data (rule 6 cites them).
   2b. `setup` from a setting that changed some rows as they were trained (a critical `setup` finding that names
   rows: a max-length cut with EOS appended after it, `eos_after_cut`) when most failing answers show the symptom
   its rows teach, or when the rows rules 4 and 5 would name lie (≥ 90%) inside its rows. However few rows it
   touched, the fix is the setting, and dropping the rows would throw their data away.
3. `setup` from the symptom: the failing answers never stop (they run to the token limit, or on past a complete
   answer: what a `stop` check's rows teach, unless it registered otherwise) more often than they fail in any other
   one way, and a `stop` finding takes stopping from the run: pad == eos, even with the collator unknown (masking
   EOS labels is exactly what produces this symptom), or EOS never supervised in at least half the rows. A
   plurality, not a majority: the fault is run-wide and the fine-tuned model runs on more than the base, so the
   answers only confirm it.
4. `data-cluster` from the audit: a finding group whose rows teach the dominant symptom (the check's registered
   `teaches`, or the symptom its own targets show; with no symptom dominant, only targets that fail the capability),
   and that sits where the failures are (the failing eval prompts resemble its rows: `failure_share` >= 0.25 and
   >= 2x its size share), else that holds the gradients' harm itself (the data-cluster test of rule 5, applied to
   the group: a defect taught in one topic can break answers in others). The symptom, the defect and the location
   (or the harm) agree, so the rows are named even when the gradient harm is spread; when the gradients point at
   another cluster, the summary says so, and when the top cluster lies inside the named rows, that is agreement.
5. `data-cluster` from the gradients: the harm is concentrated in one cluster, beyond what its size and query
   sampling explain (never when every row scored the same effect, `scores.scoring.distinct`: then the gradients
   take no part in the verdict), unless the run's step size is flagged (`rules.step_size_outranks`: with damage
   in its log or critical, or else while the cluster does not hold the harm beyond doubt) and nothing in the
   cluster's rows is wrong (no mechanism from the join; a repeated row, a check that `repeats`, is a clean row counted
   again, and rows that ask eval prompts, a check that `measures`, say how the eval was built: neither is ever a
   mechanism): a learning rate far too high makes the model collapse toward whatever pattern some clean rows carry,
   duplicated ones too, and dropping those rows would only move the collapse elsewhere.
   Then the verdict is `diffuse`. So it is too when the cluster has no mechanism and the rows standing out in it
   hold under half of all harm (`MIN_OUTLIER_HARM`), or do not write what the failing answers write where they leave
   the answer they should give (`regression.symptoms.Departure`) more often than the other rows, by the gap an audit
   flag needs to be a mechanism: the gradients are then the only evidence, and a fine-tune on clean data that
   drifts in one topic concentrates harm on that topic's rows without any of them being the cause (`verify`
   confirmed none of 12 such runs), where rows that taught the failure write it.
6. `diffuse` with a run-wide cause: no group of rows explains it and the run shows positive evidence of a run-wide
   cause (a flagged step size, eval loss rising, loss spikes or NaN, many epochs where the check found overfitting).
7. `diffuse`, no cause found: nothing above holds and nothing run-wide is flagged (`evidence.cause_found` false).
8. Every cause named: a data-cluster verdict's first cause is split by the symptom its rows teach, and the causes
   beside it are named too (`gradian.verdict.causes`): each a group whose symptom a share of the failing answers
   show and that holds harm beyond its size, or a `stop` fault that a share of the answers show.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gradian.audit.finding import Finding, by_severity
from gradian.audit.registry import category_of, teaches
from gradian.clusters.groups import FindingGroup
from gradian.clusters.summary import ClusterSummary
from gradian.regression.symptoms import Symptoms
from gradian.scores.scoring import distinct
from gradian.verdict import rules, wording
from gradian.verdict.causes import cluster_cause, further_causes, group_cause, setup_beside, split_by_symptom
from gradian.verdict.thresholds import SERVING_ONLY_SHARE
from gradian.verdict.types import Cause, Verdict


def decide(
    regression: dict[str, Any],
    findings: list[Finding],
    clusters: list[ClusterSummary] | None,
    effects_mean: np.ndarray | None,
    ids: list[str],
    *,
    symptoms: Symptoms | None = None,
    groups: list[FindingGroup] | None = None,
    served: dict[str, Any] | None = None,
    rank: str = "gradient",
    texts: Sequence[tuple[str, str]] | None = None,
) -> Verdict:
    """Apply the rules in order (see the module docstring) and return the first verdict that holds; `served` is
    report.json's `served` block when the user gave the served answers (rule 0); `rank` the `--rank` method whose
    effects the clusters and `effects_mean` hold (the summary says which method agrees with the audit); `texts` each
    row's (prompt, answer) in `ids`' order, where rule 5 looks for the failing answers' departures."""
    if rules.serving_only(regression, served):
        assert served is not None
        return _serving(regression, served)
    verdict = _training(regression, findings, clusters, effects_mean, ids, symptoms, groups, rank, texts)
    if served is not None and rules.is_regression(served["regression"]) and verdict.kind != "no-regression":
        verdict.summary += wording.served_only(served)
        verdict.evidence["served_only_delta"] = served["served_only_delta"]
    return verdict


def _training(regression: dict[str, Any], findings: list[Finding], clusters: list[ClusterSummary] | None,
              effects_mean: np.ndarray | None, ids: list[str], symptoms: Symptoms | None,
              groups: list[FindingGroup] | None, rank: str, texts: Sequence[tuple[str, str]] | None) -> Verdict:
    """Rules 1 to 8: the verdict on the training path's regression."""
    if not rules.is_regression(regression):
        summary, action = wording.no_regression(regression)
        return Verdict("no-regression", summary, action, {"regression": {
            k: regression.get(k) for k in ("delta", "ci_low", "ci_high", "p_value", "n")}})
    n_rows = len(ids)
    setup = rules.explaining_setup_finding(regression, findings, n_rows) \
        or rules.setting_by_symptom(findings, symptoms) \
        or rules.stop_by_symptom(regression, findings, symptoms, n_rows)
    if setup is not None:
        return _setup(regression, setup, symptoms)
    ranked = sorted(clusters or [], key=lambda c: (-c.harm_share, -c.lift, c.id))
    if effects_mean is not None and not distinct(effects_mean):  # every row scored the same: noise names no row
        ranked, effects_mean = [], None
    top = ranked[0] if ranked and effects_mean is not None else None
    verdict, spread = _from_rows(regression, findings, top, ids, symptoms, groups, effects_mean, rank, texts)
    if verdict is None:
        return _diffuse(regression, findings, ranked[0] if ranked else None, symptoms, spread)
    setting = rules.setting_behind_rows(verdict.culprit_ids, findings)
    return _setup(regression, setting, symptoms) if setting is not None else verdict


def _serving(regression: dict[str, Any], served: dict[str, Any]) -> Verdict:
    """Rule 0's verdict: each way the served path differs from training's is a `serving` cause with its fix."""
    differences = rules.named_differences(served)
    summary, action = wording.serving(regression, served, differences)
    numbers = ("delta", "ci_low", "ci_high", "p_value", "n", "significant")
    evidence = {"served": {k: served["regression"].get(k) for k in numbers},
                "training": {k: regression.get(k) for k in numbers},
                "served_only_delta": served.get("served_only_delta"), "serving_only_share": SERVING_ONLY_SHARE,
                "differences": [d["rule"] for d in differences]}
    causes = [Cause("serving", d["rule"], "serving", fix=wording.difference_fix(d)) for d in differences]
    return Verdict("serving", summary, action, evidence, causes=causes)


def _from_rows(regression: dict[str, Any], findings: list[Finding], top: ClusterSummary | None, ids: list[str],
               symptoms: Symptoms | None, groups: list[FindingGroup] | None,
               effects_mean: np.ndarray | None, rank: str, texts: Sequence[tuple[str, str]] | None) \
        -> tuple[Verdict | None, rules.Outliers | None]:
    """Rules 4 and 5: the rows the audit and the ranking's effects (`rank`) name, if any; beside it, when rule 5
    declined only because of the rows standing out in a cluster without a mechanism (`rules.outlier_test`), why."""
    found = rules.symptom_group(symptoms, groups, len(ids))
    if found is not None and symptoms is not None:
        return _finding_cluster(regression, findings, found[0], found[1], symptoms, top, groups, effects_mean, ids,
                                rank), None
    if top is not None and rules.concentrated(top):
        if rules.mechanism(top) is not None or not rules.step_size_outranks(findings, top):
            effects = np.asarray(effects_mean, dtype=np.float64)
            spread = rules.outlier_test(top, effects, ids, symptoms, texts)
            if spread is not None and not spread.named:
                return None, spread
            return _data_cluster(regression, findings, top, effects, ids, symptoms, groups, rank, spread), None
    return None, None


def _setup(regression: dict[str, Any], finding: Finding, symptoms: Symptoms | None) -> Verdict:
    evidence: dict[str, Any] = {"finding": finding.to_dict()}
    if symptoms is not None and symptoms.dominant is not None:
        evidence["symptom"] = rules.symptom_numbers(symptoms)
    taught = rules.taught_by(finding.check)
    share = rules.explains(taught, symptoms) if taught else None
    cause = Cause("setup", finding.check, "symptom" if share else "audit", [], rules.shown_most(taught, symptoms),
                  share, fix=finding.fix)
    return Verdict("setup", wording.setup(regression, finding, symptoms), finding.fix, evidence, causes=[cause])


def _named(regression: dict[str, Any], first: list[Cause], findings: list[Finding], symptoms: Symptoms | None,
           groups: list[FindingGroup] | None, effects_mean: np.ndarray | None, ids: list[str]) -> list[Cause]:
    """Rule 8: the first cause's parts, the further data causes, then a setup cause beside them."""
    named = {i for cause in first for i in cause.example_ids}
    return first + further_causes(named, groups, symptoms, findings, effects_mean, ids) \
        + setup_beside(regression, findings, symptoms, len(ids))


def _finding_cluster(regression: dict[str, Any], findings: list[Finding], group: FindingGroup, located_by: str,
                     symptoms: Symptoms, top: ClusterSummary | None, groups: list[FindingGroup] | None,
                     effects_mean: np.ndarray | None, ids: list[str], rank: str) -> Verdict:
    """Rule 4's verdict, with every cause beside it (rule 8) and whether the ranking's clusters agree."""
    first = split_by_symptom(group_cause(group, symptoms, findings, located_by), group, groups, symptoms, findings)
    causes = _named(regression, first, findings, symptoms, groups, effects_mean, ids)
    culprits = [i for cause in causes for i in cause.example_ids]
    gradients = rules.agreement(list(group.example_ids), set(culprits), top)
    evidence: dict[str, Any] = {
        "group": group.name, "size": group.size, "size_share": group.size_share,
        "failure_share": group.failure_share, "failure_lift": group.failure_lift, "harm_share": group.harm_share,
        "harm_share_ci": None if group.harm_share_ci is None else list(group.harm_share_ci), "lift": group.lift,
        "symptom": rules.symptom_numbers(symptoms), "culprit_rule": "finding", "located_by": located_by,
        "gradients": gradients.to_dict(), "n_culprits": len(culprits),
    }
    summary = wording.finding_summary(regression, group, symptoms, located_by, gradients, rank) \
        + wording.split_sentence(first)
    beside = causes[len(first):]
    if beside:
        summary += " " + wording.causes_sentence(beside)
    return _cluster_verdict(summary, evidence, culprits, causes, findings)


def _cluster_verdict(summary: str, evidence: dict[str, Any], culprits: list[str], causes: list[Cause],
                     findings: list[Finding]) -> Verdict:
    """A data-cluster verdict; its next action also points at the rows no cause names that a per-row finding says
    teach a failure (its check registered what they teach: `teaches`), `evidence.latent_rows` of them: no failing
    answer shows them, but with the named rows gone they can (on two SmolLM2 runs they did, BENCHMARKS.md)."""
    named, latent, checks = set(culprits), set(), []
    for finding in findings:
        unnamed = set(finding.example_ids) - named
        if unnamed and category_of(finding) == "per-row" and teaches(finding.check):
            latent |= unnamed
            checks.append(finding.check)
    evidence["latent_rows"] = len(latent)
    return Verdict("data-cluster", summary, wording.drop_action(len(culprits), causes, len(latent), checks),
                   evidence, culprits, causes)


def _data_cluster(regression: dict[str, Any], findings: list[Finding], cluster: ClusterSummary,
                  effects_mean: np.ndarray, ids: list[str], symptoms: Symptoms | None,
                  groups: list[FindingGroup] | None, rank: str, spread: rules.Outliers | None = None) -> Verdict:
    """Rule 5's verdict: the cluster's flagged rows (its mechanism) or its outlying rows (`spread`, what they hold
    and write), and the causes beside."""
    found = rules.mechanism(cluster)
    evidence: dict[str, Any] = {
        "cluster": cluster.id, "cluster_name": cluster.name, "size": cluster.size, "size_share": cluster.size_share,
        "harm_share": cluster.harm_share, "harm_share_ci": list(cluster.harm_share_ci), "lift": cluster.lift,
        "mechanism": None, "culprit_rule": "effect", "effect_threshold": None,
    }
    threshold = None
    if found is not None:
        check, inside, outside = found
        flagged = set().union(*(f.example_ids for f in findings if f.check == check))
        rows = [i for i in cluster.example_ids if i in flagged]
        evidence.update(mechanism={"check": check, "inside": inside, "outside": outside}, culprit_rule="flag")
    else:
        rows, threshold = rules.culprits_by_effect(cluster, effects_mean, ids)
        evidence["effect_threshold"] = threshold
        if spread is not None:
            evidence["outliers"] = spread.to_dict()
    first = [cluster_cause(cluster, rows, found[0] if found else None, symptoms, findings)]
    causes = _named(regression, first, findings, symptoms, groups, effects_mean, ids)
    culprits = [i for cause in causes for i in cause.example_ids]
    evidence["n_culprits"] = len(culprits)
    summary = wording.cluster_summary(regression, cluster, found, len(rows), threshold,
                                      spread.written if spread is not None else None)
    elsewhere = rules.defects_elsewhere(cluster, groups, set(culprits), len(ids))
    if elsewhere:
        evidence["audit_elsewhere"] = [{"group": g.name, "size": g.size, "failure_share": g.failure_share}
                                       for g in elsewhere]
        summary += wording.audit_elsewhere(elsewhere, rank)
    if len(causes) > 1:
        summary += " " + wording.causes_sentence(causes[1:])
    return _cluster_verdict(summary, evidence, culprits, causes, findings)


def _diffuse(regression: dict[str, Any], findings: list[Finding], top: ClusterSummary | None,
             symptoms: Symptoms | None, spread: rules.Outliers | None = None) -> Verdict:
    """Rules 6 and 7, and rule 5's exceptions: a step size that outranks the cluster, or `spread` (`_from_rows`)."""
    run_wide = sorted((f for f in by_severity(findings) if not f.per_example),
                      key=lambda f: category_of(f) not in rules.NEVER_SETUP)  # stable: step size, schedule first
    causes = rules.run_wide_causes(findings)
    evidence: dict[str, Any] = {"findings": [f.check for f in run_wide], "run_wide_causes": [f.check for f in causes],
                                "cause_found": bool(causes)}
    if top is not None:
        evidence["top_cluster"] = rules.top_numbers(top)
    if symptoms is not None and symptoms.dominant is not None:
        evidence["symptom"] = rules.symptom_numbers(symptoms)
    outranked = bool(causes) and top is not None and rules.concentrated(top) \
        and rules.step_size_outranks(findings, top)  # rule 5's exception
    if outranked:
        evidence["outranked_by_step_size"] = True
    if spread is not None:
        evidence["outliers"] = spread.to_dict()
    summary, action = wording.diffuse(regression, top, causes, symptoms, outranked, spread)
    return Verdict("diffuse", summary, action, evidence,
                   causes=[Cause("setup", f.check, "audit", fix=f.fix) for f in causes])
