"""The verdict's decisions: each test reads the evidence and returns what it found, typed, with no prose.

Check categories come from the audit's registry (`gradian.audit.registry.category_of`, `teaches`, `cause_from`), so a
plug-in check registered as `stop`, `hyperparameter` or `run-wide`, or as teaching a symptom, weighs like a built-in.
What a check's rows teach is read through one function, `taught_by` (a `stop` check teaches `never-stops` unless it
says otherwise: the registry's default).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gradian.audit.finding import SEVERITIES, Finding, by_severity
from gradian.audit.registry import ANY_SYMPTOM, category_of, cause_from, measures, repeats, teaches
from gradian.clusters.groups import FindingGroup
from gradian.clusters.summary import ClusterSummary
from gradian.data.columns import mask_of, positions_of
from gradian.regression.symptoms import SYMPTOMS, Symptoms, words_of
from gradian.verdict.thresholds import (
    CULPRIT_ROBUST_Z,
    DECISIVE_HARM,
    MAD_TO_SIGMA,
    MIN_AGREEMENT,
    MIN_CI_LOW_OVER_SIZE,
    MIN_CLUSTER_INSIDE,
    MIN_FAILURE_LIFT,
    MIN_FAILURE_SHARE,
    MIN_FLAG_GAP,
    MIN_HARM_SHARE,
    MIN_LIFT,
    MIN_OUTLIER_HARM,
    MIN_SETTING_EXPLAINS,
    OTHER_ROWS,
    SERVING_ONLY_SHARE,
    SETUP_ROW_SHARE,
)

# Categories whose findings never make a `setup` verdict: a step size or a schedule acts through the data, so it is
# what `diffuse` points at, and a planted cluster still shows as one.
NEVER_SETUP = ("hyperparameter", "run-wide")


def is_regression(regression: dict[str, Any]) -> bool:
    """Significant and a drop (the fine-tuned model does worse than the base)."""
    return bool(regression.get("significant")) and float(regression.get("delta", 0.0)) < 0


def named_differences(served: dict[str, Any]) -> list[dict[str, Any]]:
    """The differences a `serving` verdict names as causes. A BOS doubled only if the server tokenizes the rendered
    prompt with special tokens (`double_bos` where `tokenizer`) is a guess about the server, not something the
    export shows: it is named only when nothing the export does show explains the drop."""
    found = served.get("differences") or []
    shown = [d for d in found if not (d["rule"] == "double_bos" and d["evidence"].get("where") == "tokenizer")]
    return shown or found


def serving_only(regression: dict[str, Any], served: dict[str, Any] | None) -> bool:
    """The served drop is significant and the training path's is not, or is at most `SERVING_ONLY_SHARE` of it."""
    if served is None or not is_regression(served.get("regression") or {}):
        return False
    if not is_regression(regression):
        return True
    return -float(regression.get("delta", 0.0)) <= SERVING_ONLY_SHARE * -float(served["regression"]["delta"])


def at_least(finding: Finding, severity: str) -> bool:
    return SEVERITIES.index(finding.severity) <= SEVERITIES.index(severity)


def explains_stopping(finding: Finding, regression: dict[str, Any]) -> bool:
    """A `stop` finding explains the failure only when the fine-tuned model runs on more than the base."""
    if category_of(finding) != "stop":
        return True
    finetuned, base = regression.get("finetuned_no_stop_rate"), regression.get("base_no_stop_rate")
    return finetuned is None or base is None or finetuned > base


def explaining_setup_finding(regression: dict[str, Any], findings: list[Finding], n_rows: int) -> Finding | None:
    """Rule 2: the most severe critical finding that breaks the whole run and explains the failure, if any."""
    for finding in by_severity(findings):
        if finding.severity != "critical" or category_of(finding) in NEVER_SETUP:
            continue
        run_wide = not finding.per_example or len(set(finding.example_ids)) >= SETUP_ROW_SHARE * max(n_rows, 1)
        if run_wide and explains_stopping(finding, regression):
            return finding
    return None


def _settings_on_rows(findings: list[Finding]) -> list[Finding]:
    """Critical `setup` findings that name rows: a setting changed those rows as they were trained (the max length
    cut them and EOS was appended, say), so the fix is the setting however few rows it touched."""
    return [f for f in findings if f.severity == "critical" and f.per_example and category_of(f) == "setup"]


def setting_by_symptom(findings: list[Finding], symptoms: Symptoms | None) -> Finding | None:
    """Rule 2b: a setting on rows whose rows teach what most failing answers show."""
    return next((f for f in _settings_on_rows(findings)
                 if (explains(taught_by(f.check), symptoms) or 0.0) >= MIN_SETTING_EXPLAINS), None)


def setting_behind_rows(culprits: list[str], findings: list[Finding]) -> Finding | None:
    """Rule 2b, from the rows: the rows a data verdict would name lie (almost all) inside a setting's rows; then the
    setting changed them, and it is the fix, whatever the answers' symptoms."""
    named = set(culprits)
    return next((f for f in _settings_on_rows(findings)
                 if named and len(named & set(f.example_ids)) / len(named) >= MIN_CLUSTER_INSIDE), None)


def stop_fault(finding: Finding, regression: dict[str, Any], n_rows: int) -> bool:
    """A `stop` finding that takes stopping from the whole run: pad == eos masked (collator known or not: not known
    to keep EOS), or EOS unsupervised in at least half the rows; and it explains the failure."""
    if category_of(finding) != "stop":
        return False
    wide = len(set(finding.example_ids)) >= SETUP_ROW_SHARE * max(n_rows, 1)
    masked = not finding.per_example and finding.values.get("collator_masks_pad") is not False
    return (wide or masked) and explains_stopping(finding, regression)


def stop_by_symptom(
    regression: dict[str, Any], findings: list[Finding], symptoms: Symptoms | None, n_rows: int
) -> Finding | None:
    """Rule 3: the run takes stopping away (`stop_fault`) and the failing answers show what its rows teach (they
    never stop) more than any other way of failing (`leads`). Not a majority: the fault is run-wide and the
    fine-tuned model runs on more than the base, so the answers need only confirm that running on is how they
    fail, and no 50% line decides it."""
    if symptoms is None or not symptoms.n_failing:
        return None
    return next((f for f in by_severity(findings)
                 if stop_fault(f, regression, n_rows) and leads(taught_by(f.check), symptoms)), None)


def leads(symptoms: tuple[str, ...], observed: Symptoms) -> bool:
    """More failing answers show one of `symptoms` than show any single other symptom."""
    share = explains(symptoms, observed) or 0.0
    return share > max((observed.shares.get(s, 0.0) for s in SYMPTOMS if s not in symptoms), default=0.0)


def taught(group: FindingGroup) -> tuple[str, ...]:
    """The symptoms a group's rows teach: a sub-group's own; else its check's (ANY_SYMPTOM: every symptom a
    target can show, which is all but never stopping)."""
    return (group.symptom,) if group.symptom is not None else taught_by(group.check)


def taught_by(check: str) -> tuple[str, ...]:
    """The symptoms the rows a check flags teach, ANY_SYMPTOM expanded."""
    symptoms = teaches(check)
    return tuple(s for s in SYMPTOMS if s != "never-stops") if ANY_SYMPTOM in symptoms else symptoms


def explains(symptoms: tuple[str, ...], observed: Symptoms | None) -> float | None:
    """The share of the failing answers whose symptom is one of `symptoms`."""
    if observed is None or not observed.n_failing:
        return None
    return float(sum(observed.shares.get(s, 0.0) for s in symptoms))


def shown_most(symptoms: tuple[str, ...], observed: Symptoms | None) -> str | None:
    """Of `symptoms`, the one the failing answers show most (the first on a tie); None when none is shown."""
    share = explains(symptoms, observed)
    if not share or observed is None:
        return None
    return max(symptoms, key=lambda s: observed.shares.get(s, 0.0))


def sits_where_failures_are(group: FindingGroup) -> bool:
    lift = group.failure_lift
    return group.failure_share is not None and lift is not None and group.failure_share >= MIN_FAILURE_SHARE \
        and lift >= MIN_FAILURE_LIFT


def holds_harm(lift: float | None, ci: tuple[float, float] | None, harm: float | None, size_share: float, *,
               min_lift: float | None = MIN_LIFT, min_ci_over: float = MIN_CI_LOW_OVER_SIZE,
               min_harm: float = MIN_HARM_SHARE, strict: bool = False) -> bool:
    """Harm beyond size: a lift of at least `min_lift` (None: no lift test), the harm share's CI lower bound at least
    `min_ci_over` times the size share (above it when `strict`), and at least `min_harm` of all harm. The defaults
    are the data-cluster test; a further cause passes a weaker one (`verdict.causes`)."""
    if ci is None or harm is None:
        return False
    lifted = min_lift is None or (lift is not None and lift >= min_lift)
    floor = min_ci_over * size_share
    return lifted and (ci[0] > floor if strict else ci[0] >= floor) and harm >= min_harm


def concentrated(cluster: ClusterSummary) -> bool:
    return holds_harm(cluster.lift, cluster.harm_share_ci, cluster.harm_share, cluster.size_share)


def group_concentrated(group: FindingGroup) -> bool:
    """Rule 5's data-cluster test applied to a finding group's rows (False when attribution did not run)."""
    return holds_harm(group.lift, group.harm_share_ci, group.harm_share, group.size_share)


def symptom_group(symptoms: Symptoms | None, groups: list[FindingGroup] | None, n_rows: int) \
        -> tuple[FindingGroup, str] | None:
    """Rule 4: the finding group whose rows teach the dominant symptom (any symptom the group's own failure shows
    when none dominates) and that sits where the failures are (`failures`), else that holds the harm (`harm`);
    preferred: a check that teaches the symptom alone, then the larger failure lift, then the larger harm lift."""
    if symptoms is None or not symptoms.n_failing or not groups:
        return None
    dominant = symptoms.dominant
    fitting = [g for g in groups if g.size < SETUP_ROW_SHARE * max(n_rows, 1) and _teaches_dominant(g, dominant)]
    for located_by, test in (("failures", sits_where_failures_are), ("harm", group_concentrated)):
        found = [g for g in fitting if test(g)]
        if found:
            return min(found, key=lambda g: (len(taught(g)), g.symptom is not None, -(g.failure_lift or 0.0),
                                             -(g.lift or 0.0), g.name)), located_by
    return None


def _teaches_dominant(group: FindingGroup, dominant: str | None) -> bool:
    if dominant is None:  # answers that fail in mixed ways: only targets that fail the capability themselves
        return group.symptom is None and ANY_SYMPTOM in teaches(group.check)
    return dominant in taught(group)


def step_size_outranks(findings: list[Finding], cluster: ClusterSummary) -> bool:
    """Rule 5's exception: a flagged step size outranks a concentrated cluster whose rows show no defect. One with
    evidence of damage always does: a critical `hyperparameter` finding, or a warning whose training log shows the
    damage (`values.log_shows`: NaN, spikes, a loss that never fell). A warning whose log shows smooth training is a
    risk: it outranks unless the cluster holds the harm beyond doubt (`harm_share_ci[0] >= DECISIVE_HARM`), since a
    step size acts on every row and spreads the harm it does (BENCHMARKS.md: on smol-home-rename-volume, lr 2e-3
    against a limit of 1.78e-3 and a cluster at 86-99.9% of the harm, removing the cluster's rows recovered the drop
    and lr 1e-3 recovered nothing; on the tiny `diffuse` family, a collapse at 1.9x the limit, the cluster held
    53-73%)."""
    flagged = [f for f in findings if category_of(f) == "hyperparameter" and at_least(f, "warning")]
    if any(at_least(f, "critical") or f.values.get("log_shows") for f in flagged):
        return True
    return bool(flagged) and cluster.harm_share_ci[0] < DECISIVE_HARM


def run_wide_causes(findings: list[Finding]) -> list[Finding]:
    """Rule 6's positive evidence, most severe first: run-wide `hyperparameter` and `run-wide` findings at or above
    their check's `cause_from` severity (warning unless the check says otherwise)."""
    return [f for f in by_severity(findings) if not f.per_example and category_of(f) in NEVER_SETUP
            and at_least(f, "warning") and at_least(f, cause_from(f.check))]


def mechanism(cluster: ClusterSummary) -> tuple[str, float, float] | None:
    """The per-example finding with the largest inside-vs-outside gap, when the gap is at least MIN_FLAG_GAP. Checks
    whose rows have nothing wrong in them never name it: a repeated row (`repeats`) is a clean row counted again, and
    a row that asks an eval prompt (`measures`) says how the eval was built; a cluster of either is explained by
    what its rows teach, which the outlier test reads."""
    gaps = [(rates["inside"] - rates["outside"], check) for check, rates in cluster.flag_rates.items()
            if not repeats(check) and not measures(check)]
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


def outliers(cluster: ClusterSummary, effects_mean: np.ndarray, ids: list[str]) -> tuple[list[str], float]:
    """The rows `culprits_by_effect` names in the cluster, and the share of all harm (max(−effect, 0) of the mean
    effects, (N,)) they hold; 0 with no harm."""
    rows, _ = culprits_by_effect(cluster, effects_mean, ids)
    harm = np.maximum(-effects_mean, 0.0)  # (N,)
    inside = mask_of(ids, rows)  # (N,)
    total = float(harm.sum())
    return rows, float(harm[inside].sum()) / total if total > 0 else 0.0


@dataclass(frozen=True)
class Written:
    """How often rows write the failing answers' departures (`Departure.written_in`): `inside`, the share of the rows
    in question that write one; `outside`, the share of the other rows; `example`, the one most of them write."""

    inside: float
    outside: float
    example: str

    def to_dict(self) -> dict[str, Any]:
        return {"inside": self.inside, "outside": self.outside, "example": self.example}


@dataclass(frozen=True)
class Outliers:
    """Rule 5's last test, for a cluster without a mechanism: its outlying rows (`culprits_by_effect`, `rows` of
    them) hold `harm_share` of all harm, and `written` says how often they write the failing answers' departures
    (None where no failing answer's departure is known)."""

    rows: int
    harm_share: float
    written: Written | None

    @property
    def hold_the_harm(self) -> bool:
        """They hold `MIN_OUTLIER_HARM` of all harm."""
        return self.harm_share >= MIN_OUTLIER_HARM

    @property
    def named(self) -> bool:
        """They hold the harm and, where it can be read, write the departures more often than the other rows, by
        `MIN_FLAG_GAP`."""
        return self.hold_the_harm and (self.written is None or self.written.inside - self.written.outside >= MIN_FLAG_GAP)

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "harm_share": self.harm_share,
                "departures_written": None if self.written is None else self.written.to_dict()}


def outlier_test(cluster: ClusterSummary, effects_mean: np.ndarray, ids: list[str], symptoms: Symptoms | None,
                 texts: Sequence[tuple[str, str]] | None) -> Outliers | None:
    """Rule 5's last test (`Outliers`), None for a cluster with a mechanism, whose flagged rows are named."""
    if mechanism(cluster) is not None:
        return None
    named, share = outliers(cluster, effects_mean, ids)
    return Outliers(len(named), share, departures_written(named, ids, symptoms, texts))


def departures_written(named: list[str], ids: list[str], symptoms: Symptoms | None,
                       texts: Sequence[tuple[str, str]] | None) -> Written | None:
    """How often the `named` rows' answers write a failing answer's departure, beside the other rows (at most
    `OTHER_ROWS` of them, a seeded sample); None where no departure is known or there are no texts."""
    if symptoms is None or not symptoms.departures or texts is None or not named:
        return None
    departures = Counter(symptoms.departures.values())  # each departure, by how many failing answers make it
    inside = positions_of(ids, named)  # (K,)
    others = np.flatnonzero(~mask_of(ids, named))  # (N - K,)
    if len(others) > OTHER_ROWS:
        others = np.sort(np.random.default_rng(0).choice(others, OTHER_ROWS, replace=False))

    def writes(rows: np.ndarray) -> np.ndarray:  # (rows, departures) bool
        return np.array([[d.written_in(words) for d in departures]
                         for words in (words_of(texts[int(i)][1]) for i in rows)], dtype=np.bool_)

    mine, theirs = writes(inside), writes(others)  # (K, D), (N - K, D)
    kinds, written = list(departures), mine.sum(0)  # (D,) named rows writing each
    shown = max(range(len(kinds)), key=lambda d: (written[d], departures[kinds[d]]))  # ties: the most answers' one
    return Written(float(mine.any(1).mean()), float(theirs.any(1).mean()) if len(theirs) else 0.0,
                   kinds[shown].shown())


@dataclass
class Agreement:
    """How the gradients' most harmful cluster (`top`) stands to the rows the audit names.

    `held`: the share of the first cause's rows inside the cluster; `inside`: the share of the cluster's rows that
    some cause names. `agree` when the cluster is concentrated and holds at least half of the first cause's rows
    or lies inside the named rows (a subset); `disagree` when it is concentrated elsewhere; `spread` when it is not
    concentrated; `not-run` without gradients.
    """

    agreement: str
    top: ClusterSummary | None = None
    held: float = 0.0
    inside: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        if self.top is None:
            return {"agreement": self.agreement}
        return {"agreement": self.agreement,
                "top_cluster": {**top_numbers(self.top), "holds_group_rows": self.held,
                                "inside_named_rows": self.inside}}


def agreement(first_rows: list[str], named_rows: set[str], top: ClusterSummary | None) -> Agreement:
    if top is None:
        return Agreement("not-run")
    members = set(top.example_ids)
    held = len(set(first_rows) & members) / max(len(first_rows), 1)
    inside = len(members & named_rows) / max(len(members), 1)
    if not concentrated(top):
        return Agreement("spread", top, held, inside)
    agree = held >= MIN_AGREEMENT or inside >= MIN_CLUSTER_INSIDE
    return Agreement("agree" if agree else "disagree", top, held, inside)


def defects_elsewhere(cluster: ClusterSummary, groups: list[FindingGroup] | None, named: set[str],
                      n_rows: int) -> list[FindingGroup]:
    """Rule 5's note: finding groups that teach a symptom and sit where the failures are, but hold few of the
    cluster's rows and were not named as a cause."""
    inside = set(cluster.example_ids)
    return [g for g in groups or [] if g.symptom is None and taught(g) and sits_where_failures_are(g)
            and g.size < SETUP_ROW_SHARE * max(n_rows, 1) and len(set(g.example_ids) & inside) < MIN_AGREEMENT * g.size
            and len(set(g.example_ids) & named) < MIN_AGREEMENT * g.size]


def top_numbers(cluster: ClusterSummary) -> dict[str, Any]:
    return {"id": cluster.id, "name": cluster.name, "harm_share": cluster.harm_share,
            "harm_share_ci": list(cluster.harm_share_ci), "size_share": cluster.size_share, "lift": cluster.lift}


def symptom_numbers(symptoms: Symptoms) -> dict[str, Any]:
    dominant = symptoms.dominant
    return {"dominant": dominant, "share": symptoms.shares[dominant] if dominant else None,
            "n_failing": symptoms.n_failing}
