"""The answer: one of four verdicts, with its evidence, the exact next action and the rows to drop.

The verdict joins three kinds of evidence: the audit's findings, the symptoms of the failing answers
(`regression.symptoms`) with the finding groups and where the failures sit (`clusters.groups`), and the gradients
(clusters and their harm). Order of the rules, and why:

1. `no-regression`: the drop is not significant (its CI holds zero) or is not a drop. Attributing noise would send
   the user after rows that did nothing, so Gradian refuses and says so.
2. `setup`: a critical run-wide finding (pad == eos masked away, no EOS, loss on the prompt...) breaks every row at
   once; no subset of rows is to blame, and dropping rows would not fix it.
3. `setup` from the symptom: most failing answers never stop (they run to the token limit) and the run gives the
   model no way to learn stopping: pad == eos, even with the collator unknown (masking EOS labels is exactly what
   produces this symptom), or EOS never supervised in at least half the rows. The symptom settles what the audit
   alone cannot.
4. `data-cluster` from the audit: the dominant symptom is one a per-row finding teaches (stops early: rows cut in
   the data or by max_length; wrapped, wrong fields or other: training targets that fail the capability
   themselves; never stops: rows without EOS; no symptom dominant, as garbled answers fail in mixed ways: only
   targets that fail the capability), and that finding's rows sit where the failures are (the failing eval
   prompts resemble them: `failure_share` >= 0.25 and >= 2x their size share). Those rows are named even when the
   gradient harm is spread: the symptom, the defect and the location agree, and the gradient of a cut row can be
   outshone by large unrelated gradients. When the gradients point at another cluster, the summary says so.
   The same finding's rows are named, too, when they do not sit where the failures are but hold the gradients'
   harm themselves (the data-cluster test of rule 5, applied to the group): a defect taught in one topic can break
   answers in others (cut `heat` rows make `music` answers stop early), so the failing prompts resemble other rows,
   while the gradient and the audit agree on these. Named as a group, every flagged row is named, where rule 5
   would name only the flagged rows inside one cluster.
5. `data-cluster` from the gradients: the harm is concentrated in one cluster, beyond what its size and query
   sampling explain, unless the run's step size is flagged and nothing in the cluster's rows is wrong (no mechanism
   from the join): a learning rate far too high makes the model collapse toward whatever pattern some clean rows
   carry (a run that writes "city" fields into every answer blames the shipping rows), and dropping those rows
   would only move the collapse elsewhere. Then the verdict is `diffuse`, naming the cluster where the harm shows.
6. `diffuse` with a run-wide cause: no group of rows explains it and the run shows positive evidence of a run-wide
   cause (a flagged step size, eval loss rising, loss spikes or NaN, many epochs where the check found overfitting);
   the next action cites that evidence.
7. `diffuse`, no cause found: nothing above holds and nothing run-wide is flagged. The summary says plainly that
   no cause was found (`evidence.cause_found` is false) instead of guessing at hyperparameters: a user who
   retrains on a guess retrains for nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from gradian.audit.finding import Finding, by_severity
from gradian.clusters.groups import FindingGroup
from gradian.clusters.summary import ClusterSummary
from gradian.regression.symptoms import Symptoms
from gradian.report.wording import CHECK_PHRASES, measured, number, pct, symptom_sentence

__all__ = ["KINDS", "Verdict", "decide", "number", "pct"]  # number, pct: the report formats, re-exported

KINDS = ("no-regression", "setup", "data-cluster", "diffuse")

# data-cluster thresholds. A cluster must hold at least twice the harm its size would predict: a group merely
# a little above average is what any split of noisy effects produces.
MIN_LIFT = 2.0
# ... the lower end of its bootstrap CI over eval queries must stay 1.5x above its size share, so the concentration
# does not hinge on a few queries ...
MIN_CI_LOW_OVER_SIZE = 1.5
# ... and it must hold a quarter of all harm, else dropping it would leave most of the regression in place.
MIN_HARM_SHARE = 0.25
# A per-example finding is the cluster's mechanism when its rate inside exceeds the rate outside by 30 points:
# "81% of this cluster vs 2% elsewhere" explains it, "12% vs 9%" does not.
MIN_FLAG_GAP = 0.30
# Without a mechanism flag, a row of the cluster is a culprit when its effect lies 3 robust standard deviations
# (1.4826 x MAD) below the median effect of the rows outside the cluster: those rows show what an innocent row's
# effect looks like, and 3 sigma keeps a Gaussian background's false-positive rate near 0.1%.
CULPRIT_ROBUST_Z = 3.0
MAD_TO_SIGMA = 1.4826
# A critical per-example finding covering at least this share of rows is a setup fault, not a cluster.
SETUP_ROW_SHARE = 0.5
# Hyperparameter findings never make a `setup` verdict, even when critical: a learning rate or epoch count that is
# too high acts through the data, so it is what `diffuse` points at, and a planted cluster still shows as one.
HYPERPARAMETER_CHECKS = frozenset({"learning_rate", "many_epochs", "lora_alpha_rank", "eval_loss_rising",
                                   "loss_spike"})
# A flagged step size (warning or worse) outranks a cluster that carries no data defect (see rule 3).
STEP_SIZE_CHECKS = frozenset({"learning_rate", "lora_alpha_rank"})
# Findings about the model never learning to stop explain a failure only when the fine-tuned model stops less.
STOP_CHECKS = frozenset({"pad_eos_masking", "missing_eos"})
# Rule 6: run-wide findings that are positive evidence of a run-wide cause. `many_epochs` counts only when critical,
# the severity its check keeps for logs that show overfitting; many epochs alone explain nothing.
RUN_WIDE_CAUSES = frozenset({"learning_rate", "lora_alpha_rank", "eval_loss_rising", "loss_spike", "nan_in_logs"})
# Rule 4: the per-row findings that teach each symptom, in the order they are preferred. A row cut in the data
# teaches stopping early; a target that fails the capability teaches whatever its failure is; a row whose EOS is
# missing or cut by max_length teaches running on.
# With no dominant symptom (the failing answers fail in mixed ways, as garbled quoting does), only targets that fail
# the capability themselves can teach it.
SYMPTOM_CHECKS: dict[str | None, tuple[str, ...]] = {
    "stops-early": ("cut_in_data", "truncated_completion", "fails_capability"),
    "never-stops": ("missing_eos", "truncated_completion"),
    "wrapped": ("fails_capability",),
    "wrong-fields": ("fails_capability",),
    "other": ("fails_capability",),
    None: ("fails_capability",),
}
# A group sits where the failures are when at least a quarter of the failing prompts' nearest training rows are its
# rows, and twice as many as its size predicts: a group the failing prompts resemble no more than any rows is
# not where they fail.
MIN_FAILURE_SHARE = 0.25
MIN_FAILURE_LIFT = 2.0
# The gradients agree with a finding group when the most harmful cluster is concentrated and holds at least half
# of the group's rows.
MIN_AGREEMENT = 0.5


@dataclass
class Verdict:
    """What went wrong (`kind`), in one paragraph with the numbers, and what to do next."""

    kind: str
    summary: str
    next_action: str
    evidence: dict[str, Any] = field(default_factory=dict)
    culprit_ids: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"verdict kind must be one of {KINDS}, not {self.kind!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def decide(
    regression: dict[str, Any],
    findings: list[Finding],
    clusters: list[ClusterSummary] | None,
    effects_mean: np.ndarray | None,
    ids: list[str],
    *,
    symptoms: Symptoms | None = None,
    groups: list[FindingGroup] | None = None,
) -> Verdict:
    """Apply the rules in order (see the module docstring) and return the first verdict that holds."""
    if not is_regression(regression):
        return _no_regression(regression)
    setup = explaining_setup_finding(regression, findings, len(ids))
    if setup is not None:
        return _setup(regression, setup, symptoms)
    setup = never_stops_finding(regression, findings, symptoms, len(ids))
    if setup is not None:
        return _setup(regression, setup, symptoms)
    clusters = sorted(clusters or [], key=lambda c: (-c.harm_share, -c.lift, c.id))
    top = clusters[0] if clusters and effects_mean is not None else None
    group = symptom_group(symptoms, groups, len(ids))
    located_by = "failures"
    if group is None:
        group, located_by = symptom_group(symptoms, groups, len(ids), by=group_concentrated), "harm"
    if group is not None and symptoms is not None:  # symptom_group finds none without symptoms
        return _finding_cluster(regression, findings, group, symptoms, top, located_by)
    if top is not None and concentrated(top):
        if mechanism(top) is not None or not step_size_flagged(findings):
            verdict = _data_cluster(regression, findings, top, np.asarray(effects_mean, dtype=np.float64), ids)
            return _note_audit_elsewhere(verdict, top, groups, len(ids))
    return _diffuse(regression, findings, clusters[0] if clusters else None, symptoms)


def never_stops_finding(
    regression: dict[str, Any], findings: list[Finding], symptoms: Symptoms | None, n_rows: int
) -> Finding | None:
    """Rule 3: most failing answers never stop, and pad == eos (collator known or not) or EOS is unsupervised in
    at least half the rows."""
    if symptoms is None or symptoms.dominant != "never-stops":
        return None
    for finding in by_severity(findings):
        wide = finding.check == "missing_eos" and len(set(finding.example_ids)) >= SETUP_ROW_SHARE * max(n_rows, 1)
        pad = finding.check == "pad_eos_masking" and finding.values.get("collator_masks_pad") is not False
        if (wide or pad) and _explains(finding, regression):
            return finding
    return None


def sits_where_failures_are(group: FindingGroup) -> bool:
    lift = group.failure_lift
    return group.failure_share is not None and lift is not None and group.failure_share >= MIN_FAILURE_SHARE \
        and lift >= MIN_FAILURE_LIFT


def group_concentrated(group: FindingGroup) -> bool:
    """Rule 5's data-cluster test applied to a finding group's rows (False when attribution did not run)."""
    if group.lift is None or group.harm_share is None or group.harm_share_ci is None:
        return False
    return (group.lift >= MIN_LIFT and group.harm_share_ci[0] >= MIN_CI_LOW_OVER_SIZE * group.size_share
            and group.harm_share >= MIN_HARM_SHARE)


def symptom_group(symptoms: Symptoms | None, groups: list[FindingGroup] | None, n_rows: int, *,
                  by: Callable[[FindingGroup], bool] = sits_where_failures_are) -> FindingGroup | None:
    """Rule 4: the finding group that teaches the dominant symptom and sits where the failures are (`by`; or holds
    the harm, `group_concentrated`), if any: the checks in SYMPTOM_CHECKS order, then the larger failure lift, then
    the larger harm lift."""
    if symptoms is None or not symptoms.n_failing or not groups:
        return None
    checks = SYMPTOM_CHECKS.get(symptoms.dominant, ())
    fitting = [g for g in groups if g.check in checks and by(g) and g.size < SETUP_ROW_SHARE * max(n_rows, 1)]
    if not fitting:
        return None
    return min(fitting, key=lambda g: (checks.index(g.check), -(g.failure_lift or 0.0), -(g.lift or 0.0), g.check))


def step_size_flagged(findings: list[Finding]) -> bool:
    return any(f.check in STEP_SIZE_CHECKS and f.severity in ("warning", "critical") for f in findings)


def is_regression(regression: dict[str, Any]) -> bool:
    """Significant and a drop (the fine-tuned model does worse than the base)."""
    return bool(regression.get("significant")) and float(regression.get("delta", 0.0)) < 0


def concentrated(cluster: ClusterSummary) -> bool:
    """The data-cluster test: lift, CI lower bound above size, and a meaningful share of all harm."""
    return (
        cluster.lift >= MIN_LIFT
        and cluster.harm_share_ci[0] >= MIN_CI_LOW_OVER_SIZE * cluster.size_share
        and cluster.harm_share >= MIN_HARM_SHARE
    )


def explaining_setup_finding(regression: dict[str, Any], findings: list[Finding], n_rows: int) -> Finding | None:
    """The most severe critical finding that breaks the whole run and explains the failure, if any."""
    for finding in by_severity(findings):
        if finding.severity != "critical" or finding.check in HYPERPARAMETER_CHECKS:
            continue
        run_wide = not finding.per_example or len(set(finding.example_ids)) >= SETUP_ROW_SHARE * max(n_rows, 1)
        if run_wide and _explains(finding, regression):
            return finding
    return None


def _explains(finding: Finding, regression: dict[str, Any]) -> bool:
    if finding.check not in STOP_CHECKS:
        return True
    finetuned, base = regression.get("finetuned_no_stop_rate"), regression.get("base_no_stop_rate")
    return finetuned is None or base is None or finetuned > base


def _no_regression(regression: dict[str, Any]) -> Verdict:
    if regression.get("significant"):
        reason = "The fine-tuned model is not worse, so there is no regression to attribute."
    else:
        reason = "This is inside the noise band, so Gradian does not attribute it to any training rows."
    return Verdict(
        kind="no-regression",
        summary=f"{measured(regression)} {reason}",
        next_action="Nothing to fix. To detect a smaller drop, measure on more eval prompts, "
        "or rerun with --force to attribute anyway.",
        evidence={"regression": {k: regression.get(k) for k in ("delta", "ci_low", "ci_high", "p_value", "n")}},
    )


def _setup(regression: dict[str, Any], finding: Finding, symptoms: Symptoms | None) -> Verdict:
    evidence: dict[str, Any] = {"finding": finding.to_dict()}
    text = (f"{measured(regression)} The cause is in the training setup, not in a group of rows: "
            f"{finding.title.rstrip('.')}. This affects every row, so dropping rows would not fix it.")
    if symptoms is not None and symptoms.dominant is not None:
        evidence["symptom"] = _symptom(symptoms)
        text += f" {symptom_sentence(symptoms)}"
    return Verdict(kind="setup", summary=text, next_action=finding.fix, evidence=evidence)


def mechanism(cluster: ClusterSummary) -> tuple[str, float, float] | None:
    """The per-example finding with the largest inside-vs-outside gap, when the gap is at least MIN_FLAG_GAP."""
    gaps = [(rates["inside"] - rates["outside"], check) for check, rates in cluster.flag_rates.items()]
    if not gaps:
        return None
    gap, check = max(gaps, key=lambda g: (g[0], g[1]))
    if gap < MIN_FLAG_GAP:
        return None
    return check, cluster.flag_rates[check]["inside"], cluster.flag_rates[check]["outside"]


def culprits_by_effect(cluster: ClusterSummary, effects_mean: np.ndarray, ids: list[str]) -> tuple[list[str], float]:
    """Rows of the cluster whose effect is a robust outlier below the outside rows' effects, and the threshold."""
    position = {example_id: i for i, example_id in enumerate(ids)}
    inside = np.zeros(len(ids), dtype=bool)
    inside[[position[i] for i in cluster.example_ids]] = True
    background = effects_mean[~inside] if (~inside).sum() >= 5 else effects_mean
    median = float(np.median(background))
    scale = MAD_TO_SIGMA * float(np.median(np.abs(background - median)))
    threshold = min(median - CULPRIT_ROBUST_Z * scale, 0.0)
    chosen = [i for i in cluster.example_ids if effects_mean[position[i]] < threshold]
    if not chosen:  # no outlier at all: every harmful row of the cluster
        chosen = [i for i in cluster.example_ids if effects_mean[position[i]] < 0]
    return chosen, threshold


def _data_cluster(
    regression: dict[str, Any], findings: list[Finding], cluster: ClusterSummary, effects_mean: np.ndarray,
    ids: list[str],
) -> Verdict:
    found = mechanism(cluster)
    evidence: dict[str, Any] = {
        "cluster": cluster.id, "cluster_name": cluster.name, "size": cluster.size, "size_share": cluster.size_share,
        "harm_share": cluster.harm_share, "harm_share_ci": list(cluster.harm_share_ci), "lift": cluster.lift,
        "mechanism": None, "culprit_rule": "effect", "effect_threshold": None,
    }
    text = (
        f"{measured(regression)} One cluster of {cluster.size} training rows ({pct(cluster.size_share)} of the data), "
        f"grouped around \u201c{cluster.name}\u201d, holds {pct(cluster.harm_share)} of the negative influence "
        f"(95% CI {pct(cluster.harm_share_ci[0])} to {pct(cluster.harm_share_ci[1])}, {cluster.lift:.1f}x its size)."
    )
    fix = ""
    if found is not None:
        check, inside, outside = found
        flagged = set().union(*(f.example_ids for f in findings if f.check == check))
        culprits = [i for i in cluster.example_ids if i in flagged]
        evidence.update(mechanism={"check": check, "inside": inside, "outside": outside}, culprit_rule="flag")
        text += f" {pct(inside)} of this cluster has {CHECK_PHRASES.get(check, check.replace('_', ' '))}, " \
                f"vs {pct(outside)} elsewhere."
        fixes = [f.fix for f in findings if f.check == check and f.fix]
        fix = f"; or fix them: {fixes[0]}" if fixes else ""
    else:
        culprits, threshold = culprits_by_effect(cluster, effects_mean, ids)
        evidence["effect_threshold"] = threshold
        text += f" Its culprits are the {len(culprits)} rows whose effect is below {number(threshold)}."
    evidence["n_culprits"] = len(culprits)
    return Verdict(
        kind="data-cluster", summary=text, evidence=evidence, culprit_ids=culprits,
        next_action=f"drop these {len(culprits)} rows: culprits.jsonl (train.cleaned.jsonl is the dataset "
        f"without them){fix}",
    )


def _finding_cluster(
    regression: dict[str, Any], findings: list[Finding], group: FindingGroup, symptoms: Symptoms,
    top: ClusterSummary | None, located_by: str = "failures",
) -> Verdict:
    """Rule 4's verdict: the finding's rows, found where the failures are or where the harm is (`located_by`), with
    whether the gradients agree."""
    gradients = _agreement(group, top)
    evidence: dict[str, Any] = {
        "group": group.check, "size": group.size, "size_share": group.size_share,
        "failure_share": group.failure_share, "failure_lift": group.failure_lift, "harm_share": group.harm_share,
        "harm_share_ci": None if group.harm_share_ci is None else list(group.harm_share_ci), "lift": group.lift,
        "symptom": _symptom(symptoms), "culprit_rule": "finding", "located_by": located_by, "gradients": gradients,
        "n_culprits": group.size,
    }
    phrase = CHECK_PHRASES.get(group.check, group.check.replace("_", " "))
    text = (f"{measured(regression)} {symptom_sentence(symptoms)} {group.size} training rows "
            f"({pct(group.size_share)} of the data) have {phrase}")
    nearest = f"{pct(group.failure_share or 0.0)} of their nearest training rows are these rows"
    if located_by == "failures":
        text += (f", and the failing prompts resemble them: {nearest}, {group.failure_lift:.1f}x their share. The "
                 f"model learned its failure from them. " + _gradient_sentence(group, top, gradients))
    else:  # group_concentrated held, so the harm numbers are there
        low, high = group.harm_share_ci or (0.0, 0.0)
        text += (f", and they hold {pct(group.harm_share or 0.0)} of the negative influence (95% CI {pct(low)} to "
                 f"{pct(high)}, {group.lift or 0.0:.1f}x their size). The failing prompts are about other rows "
                 f"({nearest}): a defect taught in one topic can break answers in others. The model learned its "
                 "failure from these rows.")
    fixes = [f.fix for f in findings if f.check == group.check and f.fix]
    fix = f"; or fix them: {fixes[0]}" if fixes else ""
    return Verdict(
        kind="data-cluster", summary=text, evidence=evidence, culprit_ids=list(group.example_ids),
        next_action=f"drop these {group.size} rows: culprits.jsonl (train.cleaned.jsonl is the dataset "
        f"without them){fix}",
    )


def _agreement(group: FindingGroup, top: ClusterSummary | None) -> dict[str, Any]:
    """`agree`, `disagree` (the gradients concentrate on a cluster that holds few of the group's rows), `spread`
    (no cluster concentrated) or `not-run`, with the top cluster's numbers."""
    if top is None:
        return {"agreement": "not-run"}
    held = len(set(group.example_ids) & set(top.example_ids)) / max(group.size, 1)
    agreement = ("agree" if held >= MIN_AGREEMENT else "disagree") if concentrated(top) else "spread"
    return {"agreement": agreement, "top_cluster": {**_top(top), "holds_group_rows": held}}


def _gradient_sentence(group: FindingGroup, top: ClusterSummary | None, gradients: dict[str, Any]) -> str:
    agreement = gradients["agreement"]
    if top is None:
        return "Attribution did not run, so this rests on the audit and the symptoms."
    held = gradients["top_cluster"]["holds_group_rows"]
    numbers = f"\u201c{top.name}\u201d holds {pct(top.harm_share)} of the harm ({top.lift:.1f}x its size)"
    if agreement == "agree":
        return f"The gradients agree: cluster {numbers} and {pct(held)} of these rows."
    own = f" These rows hold {pct(group.harm_share)} of it." if group.harm_share is not None else ""
    if agreement == "spread":
        return f"The gradients alone name no cluster: the most harmful, {numbers}, is not concentrated.{own}"
    return (f"The gradients and the audit disagree: the gradients point at cluster {numbers}, which holds only "
            f"{pct(held)} of these rows.{own} Gradian names the rows whose defect matches the failing answers; "
            "check that cluster's rows too.")


def _note_audit_elsewhere(
    verdict: Verdict, cluster: ClusterSummary, groups: list[FindingGroup] | None, n_rows: int
) -> Verdict:
    """Rule 5, when a per-row defect sits where the failures are but outside the gradients' cluster: say so."""
    defects = set().union(*SYMPTOM_CHECKS.values())
    inside = set(cluster.example_ids)
    elsewhere = [g for g in groups or [] if g.check in defects and sits_where_failures_are(g)
                 and g.size < SETUP_ROW_SHARE * max(n_rows, 1)
                 and len(set(g.example_ids) & inside) < MIN_AGREEMENT * g.size]
    if not elsewhere:
        return verdict
    verdict.evidence["audit_elsewhere"] = [{"group": g.check, "size": g.size, "failure_share": g.failure_share}
                                           for g in elsewhere]
    named = "; ".join(f"{g.size} rows with {CHECK_PHRASES.get(g.check, g.check.replace('_', ' '))} "
                      f"({pct(g.failure_share)} of the failing prompts' nearest rows)" for g in elsewhere)
    verdict.summary += (f" The gradients and the audit disagree: the audit flags other rows where the failures "
                        f"sit, {named}; check them too.")
    return verdict


def run_wide_causes(findings: list[Finding]) -> list[Finding]:
    """Rule 6's positive evidence, most severe first."""
    return [f for f in by_severity(findings) if not f.per_example and (
        (f.check in RUN_WIDE_CAUSES and f.severity in ("warning", "critical"))
        or (f.check == "many_epochs" and f.severity == "critical"))]


def _diffuse(
    regression: dict[str, Any], findings: list[Finding], top: ClusterSummary | None, symptoms: Symptoms | None = None
) -> Verdict:
    run_wide = sorted((f for f in by_severity(findings) if not f.per_example),
                      key=lambda f: f.check not in HYPERPARAMETER_CHECKS)  # stable: hyperparameters first
    causes = sorted(run_wide_causes(findings), key=lambda f: f.check not in HYPERPARAMETER_CHECKS)
    evidence: dict[str, Any] = {"findings": [f.check for f in run_wide], "run_wide_causes": [f.check for f in causes],
                                "cause_found": bool(causes)}
    where = ""
    if top is not None:
        evidence["top_cluster"] = _top(top)
        where = (f": the most harmful, \u201c{top.name}\u201d, holds {pct(top.harm_share)} of it for "
                 f"{pct(top.size_share)} of the rows ({top.lift:.1f}x its size)")
    observed = ""
    if symptoms is not None and symptoms.dominant is not None:
        evidence["symptom"] = _symptom(symptoms)
        observed = f" {symptom_sentence(symptoms)}"
    if not causes:
        return Verdict(
            kind="diffuse", evidence=evidence,
            summary=f"{measured(regression)} No cause was found. No cluster of training rows holds the harm{where}, "
            "no audit finding flags rows where the failures sit, and nothing run-wide is flagged (step size, eval "
            f"loss, loss spikes).{observed}",
            next_action="no cause found, so nothing to change on evidence: read the failing answers (Symptoms) and "
            "the most harmful rows, then measure on more eval prompts or with reference answers and attribute again",
        )
    cited = "; ".join(f.title.rstrip(".") for f in causes[:2])
    text = (f"{measured(regression)} No cluster of training rows holds the harm{where}. The regression is spread "
            f"over the data, and the run shows a run-wide cause: {cited}.{observed}")
    if top is not None and concentrated(top):  # rule 5's exception: a flagged step size, no defect in the rows
        evidence["outranked_by_step_size"] = True
        text = (f"{measured(regression)} The harm shows most in \u201c{top.name}\u201d ({pct(top.harm_share)} "
                f"of it for {pct(top.size_share)} of the rows, {top.lift:.1f}x its size), but nothing in its rows is "
                "wrong and the run's step size is flagged: a learning rate far too high collapses the model toward "
                "whatever pattern some clean rows carry, and dropping them would move the collapse elsewhere. "
                "Fix the step size first; if the regression stays, attribute the new run.")
    hints = "; ".join(f.fix for f in causes[:2] if f.fix) or "lower the learning rate, and measure again"
    evidence_text = ", ".join(f.check for f in causes[:2])
    return Verdict(kind="diffuse", summary=text, evidence=evidence,
                   next_action=f"look at hyperparameters: {hints} (evidence: {evidence_text})")


def _top(cluster: ClusterSummary) -> dict[str, Any]:
    return {"id": cluster.id, "name": cluster.name, "harm_share": cluster.harm_share,
            "harm_share_ci": list(cluster.harm_share_ci), "size_share": cluster.size_share, "lift": cluster.lift}


def _symptom(symptoms: Symptoms) -> dict[str, Any]:
    dominant = symptoms.dominant
    return {"dominant": dominant, "share": symptoms.shares[dominant] if dominant else None,
            "n_failing": symptoms.n_failing}
