"""The answer: one of four verdicts, with its evidence, the exact next action and the rows to drop.

Order of the rules, and why:
1. `no-regression`: the drop is not significant (its CI holds zero) or is not a drop. Attributing noise would send
   the user after rows that did nothing, so Gradian refuses and says so.
2. `setup`: a critical run-wide finding (pad == eos masked away, no EOS, loss on the prompt...) breaks every row at
   once; no subset of rows is to blame, and dropping rows would not fix it.
3. `data-cluster`: the harm is concentrated in one cluster, beyond what its size and query sampling explain,
   unless the run's step size is flagged and nothing in the cluster's rows is wrong (no mechanism from the join):
   a learning rate far too high makes the model collapse toward whatever pattern some clean rows carry (a run
   that writes "city" fields into every answer blames the shipping rows), and dropping those rows would only move
   the collapse elsewhere. Then the verdict is `diffuse`, naming the cluster where the harm shows.
4. `diffuse`: a regression with no cluster to blame points at how the run was trained: hyperparameters.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from gradian.audit.finding import Finding, by_severity
from gradian.clusters.summary import ClusterSummary

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

CHECK_PHRASES = {
    "truncated_completion": "completions truncated by the run's max length",
    "cut_in_data": "completions cut in the data itself",
    "missing_eos": "no EOS in the supervised tokens",
    "duplicate": "duplicated rows",
    "near_duplicate": "near-duplicate rows",
    "train_eval_overlap": "rows copied from the eval set",
    "prompt_loss": "loss on the prompt",
}


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
) -> Verdict:
    """Apply the rules in order (see the module docstring) and return the first verdict that holds."""
    if not is_regression(regression):
        return _no_regression(regression)
    setup = explaining_setup_finding(regression, findings, len(ids))
    if setup is not None:
        return _setup(regression, setup)
    clusters = sorted(clusters or [], key=lambda c: (-c.harm_share, -c.lift, c.id))
    if clusters and effects_mean is not None and concentrated(clusters[0]):
        if mechanism(clusters[0]) is not None or not step_size_flagged(findings):
            return _data_cluster(regression, findings, clusters[0], np.asarray(effects_mean, dtype=np.float64), ids)
    return _diffuse(regression, findings, clusters[0] if clusters else None)


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


def _measured(regression: dict[str, Any]) -> str:
    """The regression in one sentence: rates, difference, CI, p-value, n."""
    return (
        f"On {regression.get('capability', 'the capability')}, the fine-tuned model scores "
        f"{pct(regression.get('finetuned_rate'))} vs {pct(regression.get('base_rate'))} for the base model "
        f"(difference {pct(regression.get('delta'), signed=True)}, 95% CI {pct(regression.get('ci_low'), signed=True)} "
        f"to {pct(regression.get('ci_high'), signed=True)}, p = {number(regression.get('p_value'))}, "
        f"n = {regression.get('n', '?')} eval prompts)."
    )


def _no_regression(regression: dict[str, Any]) -> Verdict:
    if regression.get("significant"):
        reason = "The fine-tuned model is not worse, so there is no regression to attribute."
    else:
        reason = "This is inside the noise band, so Gradian does not attribute it to any training rows."
    return Verdict(
        kind="no-regression",
        summary=f"{_measured(regression)} {reason}",
        next_action="Nothing to fix. To detect a smaller drop, measure on more eval prompts, "
        "or rerun with --force to attribute anyway.",
        evidence={"regression": {k: regression.get(k) for k in ("delta", "ci_low", "ci_high", "p_value", "n")}},
    )


def _setup(regression: dict[str, Any], finding: Finding) -> Verdict:
    return Verdict(
        kind="setup",
        summary=f"{_measured(regression)} The cause is in the training setup, not in a group of rows: "
        f"{finding.title.rstrip('.')}. This affects every row, so dropping rows would not fix it.",
        next_action=finding.fix,
        evidence={"finding": finding.to_dict()},
    )


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
        f"{_measured(regression)} One cluster of {cluster.size} training rows ({pct(cluster.size_share)} of the data), "
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


def _diffuse(regression: dict[str, Any], findings: list[Finding], top: ClusterSummary | None) -> Verdict:
    run_wide = sorted((f for f in by_severity(findings) if not f.per_example),
                      key=lambda f: f.check not in HYPERPARAMETER_CHECKS)  # stable: hyperparameters first
    evidence: dict[str, Any] = {"findings": [f.check for f in run_wide]}
    text = f"{_measured(regression)} No cluster of training rows holds the harm"
    if top is not None:
        evidence["top_cluster"] = {"id": top.id, "name": top.name, "harm_share": top.harm_share,
                                   "harm_share_ci": list(top.harm_share_ci), "size_share": top.size_share,
                                   "lift": top.lift}
        text += (f": the most harmful, \u201c{top.name}\u201d, holds {pct(top.harm_share)} of it for "
                 f"{pct(top.size_share)} of the rows ({top.lift:.1f}x its size)")
    text += ". The regression is spread over the data, which points at how the run was trained."
    if top is not None and concentrated(top):  # rule 3's exception: a flagged step size, no defect in the rows
        evidence["outranked_by_step_size"] = True
        text = (f"{_measured(regression)} The harm shows most in \u201c{top.name}\u201d ({pct(top.harm_share)} "
                f"of it for {pct(top.size_share)} of the rows, {top.lift:.1f}x its size), but nothing in its rows is "
                "wrong and the run's step size is flagged: a learning rate far too high collapses the model toward "
                "whatever pattern some clean rows carry, and dropping them would move the collapse elsewhere. "
                "Fix the step size first; if the regression stays, attribute the new run.")
    hints = "; ".join(f.fix for f in run_wide[:2] if f.fix)
    action = hints or "lower the learning rate or the number of epochs, and measure again"
    return Verdict(kind="diffuse", summary=text, next_action=f"look at hyperparameters: {action}", evidence=evidence)


def pct(value: Any, *, signed: bool = False) -> str:
    """A share as a percentage with one decimal ("81.0%"), "n/a" when absent."""
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return "n/a"
    return f"{100 * float(value):+.1f}%" if signed else f"{100 * float(value):.1f}%"


def number(value: Any) -> str:
    """A number with 3 significant digits, "n/a" when absent."""
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return "n/a"
    return f"{float(value):.3g}"
