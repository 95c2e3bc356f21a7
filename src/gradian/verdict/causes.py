"""Every cause named (rule 8): the first cause a rule found, split by symptom, then the causes beside it.

A run can hold more than one cause: rows cut in one category and rows fenced in another, or a setup fault beside
a data cause. A further cause is a finding group that

- teaches a symptom a share of the failing answers show (`MIN_CAUSE_EXPLAINS`): its evidence on the answers' side;
- holds harm beyond its size: the lower end of its harm share's CI above its size share, the rows it adds above
  their size share by the mean effects, and at least `MIN_CAUSE_HARM_SHARE` of all harm: its evidence on the
  gradients' side. A group that teaches one symptom and holds no row named before may pass this on the failing
  queries whose answers show that symptom instead (`clusters.groups.SymptomHarm`; its rows are then the rows it
  adds, so its harm there is theirs): a second cause that breaks other answers than the first can hold little of
  the harm over all of them (`located_by` `symptom-harm`);
- and is not the first cause seen again (it overlaps the rows already named by less than `MAX_CAUSE_OVERLAP`); a
  group split by symptom is tried through its parts only, so none passes on the harm of rows named before.

Both kinds of evidence are required, so a null run (refused earlier) or a single-cause run does not grow a second
cause from a group that merely sits near the first, and nothing is added when attribution did not run. Symptom
sub-groups (`clusters.groups`) are tried before whole groups, so a capability check that flags both the cut and the
fenced rows names each with its own numbers. A `stop` finding that takes stopping from the whole run is named beside
a data cause when a share of the failing answers never stop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gradian.audit.finding import Finding, by_severity
from gradian.clusters.groups import FindingGroup, SymptomHarm
from gradian.clusters.summary import ClusterSummary
from gradian.regression.symptoms import Symptoms
from gradian.verdict.rules import explains, holds_harm, shown_most, stop_fault, taught, taught_by
from gradian.verdict.thresholds import (
    MAX_CAUSE_OVERLAP,
    MIN_CAUSE_CI_LOW_OVER_SIZE,
    MIN_CAUSE_EXPLAINS,
    MIN_CAUSE_HARM_SHARE,
    MIN_CAUSE_LIFT,
    SETUP_ROW_SHARE,
)
from gradian.verdict.types import Cause

SYMPTOM_HARM = "symptom-harm"  # located by its harm on the queries that show its symptom


def group_cause(group: FindingGroup, symptoms: Symptoms | None, findings: list[Finding], located_by: str,
                rows: list[str] | None = None) -> Cause:
    """A finding group as a cause (`rows`: those it names, all of its rows unless given); named by its harm on its
    symptom's queries (`located_by` `symptom-harm`), its harm numbers are those."""
    on = group.on_symptom if located_by == SYMPTOM_HARM else None
    symptom = on.symptom if on is not None else group.symptom or (
        symptoms.dominant if symptoms is not None and symptoms.dominant in taught(group) else None)
    harm = (on.harm_share, on.harm_share_ci, on.lift) if on is not None else (group.harm_share, group.harm_share_ci,
                                                                               group.lift)
    return Cause("rows", group.name, located_by, list(group.example_ids if rows is None else rows), symptom,
                 explains((symptom,) if symptom else taught(group), symptoms), group.size_share, *harm,
                 fix_of(group.check, findings), *setting_of(group.check, findings))


def cluster_cause(cluster: ClusterSummary, rows: list[str], check: str | None, symptoms: Symptoms | None,
                  findings: list[Finding]) -> Cause:
    """A gradient cluster as a cause, naming `rows` (its flagged or outlying rows); `check` is its mechanism."""
    symptom = symptoms.dominant if symptoms is not None and check is not None and symptoms.dominant \
        in taught_by(check) else None
    return Cause("rows", f"cluster {cluster.id}", "gradients", rows, symptom,
                 explains((symptom,), symptoms) if symptom else None, cluster.size_share, cluster.harm_share,
                 cluster.harm_share_ci, cluster.lift, *((fix_of(check, findings), *setting_of(check, findings))
                                                        if check else ("", "", "")))


def split_by_symptom(first: Cause, group: FindingGroup | None, groups: list[FindingGroup] | None,
                     symptoms: Symptoms | None, findings: list[Finding]) -> list[Cause]:
    """The first cause, or its symptom sub-groups when it is a whole group that has them: each part of the rows
    is named with the symptom it teaches and the share of the failing answers it explains."""
    if group is None or group.symptom is not None:
        return [first]
    parts = [g for g in groups or [] if g.check == group.check and g.symptom is not None]
    if not parts:
        return [first]
    causes = [group_cause(g, symptoms, findings, first.located_by) for g in parts]
    covered = {i for g in parts for i in g.example_ids}
    rest = [i for i in first.example_ids if i not in covered]  # rows without a target to classify
    return causes + ([group_cause(group, symptoms, findings, first.located_by, rest)] if rest else [])


def further_causes(named: set[str], groups: list[FindingGroup] | None, symptoms: Symptoms | None,
                   findings: list[Finding], effects_mean: np.ndarray | None, ids: Sequence[str]) -> list[Cause]:
    """The finding groups beside the causes already named (module docstring), sub-groups first, then by harm;
    `effects_mean` (N,) is each row's mean effect (None when attribution did not run: then none)."""
    if effects_mean is None or not groups:
        return []
    harm = np.maximum(-np.asarray(effects_mean, dtype=np.float64), 0.0)  # (N,)
    position = {example_id: i for i, example_id in enumerate(ids)}
    split = {g.check for g in groups if g.symptom is not None}
    causes: list[Cause] = []
    named = set(named)
    for group in sorted(groups, key=lambda g: (g.symptom is None, -(g.harm_share or 0.0), g.name)):
        if not taught(group) or group.size >= SETUP_ROW_SHARE * max(len(ids), 1) or (
                group.symptom is None and group.check in split):
            continue
        overlap = len(set(group.example_ids) & named) / max(group.size, 1)
        share = explains(taught(group), symptoms)
        if overlap >= MAX_CAUSE_OVERLAP or share is None or share < MIN_CAUSE_EXPLAINS:
            continue
        rows = [i for i in group.example_ids if i not in named]
        if beyond_size(group):
            located_by = "harm"
            added = np.array([position[i] for i in rows], dtype=np.int64)
            if harm.sum() <= 0 or harm[added].sum() / harm.sum() <= MIN_CAUSE_LIFT * len(added) / len(ids):
                continue
        elif not overlap and group.on_symptom is not None and beyond_size(group, group.on_symptom):
            located_by = SYMPTOM_HARM  # all its rows are added: its CI above their size share is their lift test
        else:
            continue
        causes.append(group_cause(group, symptoms, findings, located_by, rows))
        named |= set(rows)
    return causes


def beyond_size(group: FindingGroup, on: SymptomHarm | None = None) -> bool:
    """The group's harm share (over all failing queries, or `on` its symptom's) is significantly above its size
    share and at least MIN_CAUSE_HARM_SHARE (no lift test: a further cause need not pass the data-cluster test's)."""
    lift, ci, harm = (on.lift, on.harm_share_ci, on.harm_share) if on is not None else (
        group.lift, group.harm_share_ci, group.harm_share)
    return holds_harm(lift, ci, harm, group.size_share, min_lift=None, min_ci_over=MIN_CAUSE_CI_LOW_OVER_SIZE,
                      min_harm=MIN_CAUSE_HARM_SHARE, strict=True)


def setup_beside(regression: dict[str, Any], findings: list[Finding], symptoms: Symptoms | None,
                 n_rows: int) -> list[Cause]:
    """A `stop` fault beside a data cause: the run takes stopping away and at least MIN_CAUSE_EXPLAINS of the
    failing answers show what its rows teach, never stopping (rule 3 names it alone when most of them do)."""
    for fault in by_severity(findings):
        taught = taught_by(fault.check)
        share = explains(taught, symptoms)
        if stop_fault(fault, regression, n_rows) and share is not None and share >= MIN_CAUSE_EXPLAINS:
            setting, finding = setting_of(fault.check, findings)
            return [Cause("setup", fault.check, "symptom", [], shown_most(taught, symptoms), share, fix=fault.fix,
                          setting_fix=setting, setting_finding=finding)]
    return []


def fix_of(check: str, findings: list[Finding]) -> str:
    return next((f.fix for f in by_severity(findings) if f.check == check and f.fix), "")


def setting_of(check: str, findings: list[Finding]) -> tuple[str, str]:
    """The setting's one-line change that the finding of `check` names (its `setting_fix`: the setting cut the rows
    as they were trained) and that finding's title; empty strings when it names none."""
    finding = next((f for f in by_severity(findings) if f.check == check and f.values.get("setting_fix")), None)
    return ("", "") if finding is None else (str(finding.values["setting_fix"]), finding.title)
