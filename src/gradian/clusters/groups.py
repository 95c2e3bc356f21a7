"""Candidate groups beyond clusters, and where the failures sit.

Every per-row audit finding (`cut_in_data`, `truncated_completion`, `duplicate`, `fails_capability`, any check that
names rows) becomes a group of training rows with the numbers a cluster has: its harm share, the bootstrap CI over
eval queries and its lift, computed by `clusters.summary.group_statistics`, the same code as for clusters.

Where the failures sit: each failing eval prompt is matched to the training rows whose prompts resemble it most
(TF-IDF cosine, scikit-learn), its `NEIGHBOURS` nearest rows. A group's `failure_share` is the mean, over failing
prompts, of the fraction of those nearest rows that belong to the group: 1.0 when every failing prompt looks like
the group's rows only, about the group's size share when the failures are spread over the data. It needs no
gradients, so it holds where gradient harm is spread.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from gradian.audit.finding import Finding, by_severity
from gradian.clusters.summary import ClusterSummary, group_statistics
from gradian.data.examples import Example

NEIGHBOURS = 10
METHOD = "tf-idf cosine of each failing eval prompt with the training rows' prompts"


@dataclass
class FindingGroup:
    """The rows one per-row check flags, with their share of the harm (None when attribution did not run)."""

    check: str
    severity: str
    title: str
    example_ids: list[str]
    size_share: float
    harm_share: float | None = None
    harm_share_ci: tuple[float, float] | None = None
    lift: float | None = None
    mean_effect: float | None = None
    failure_share: float | None = None

    @property
    def size(self) -> int:
        return len(self.example_ids)

    @property
    def failure_lift(self) -> float | None:
        """How much more the failing prompts resemble these rows than the rows' number predicts."""
        if self.failure_share is None or not self.size_share:
            return None
        return self.failure_share / self.size_share

    def to_dict(self) -> dict[str, Any]:
        """The numbers; the rows themselves are the findings' `example_ids` (one owner: report.json's findings)."""
        data = asdict(self)
        del data["example_ids"]
        data["harm_share_ci"] = None if self.harm_share_ci is None else list(self.harm_share_ci)
        return {**data, "size": self.size, "failure_lift": self.failure_lift}


@dataclass
class CandidateGroups:
    """The finding groups, the clusters with their failure shares, and how the failures were located."""

    groups: list[FindingGroup] = field(default_factory=list)
    clusters: list[ClusterSummary] | None = None
    n_failing_prompts: int = 0

    def sites(self) -> dict[str, Any]:
        """report.json's `failure_sites`: how `failure_share` was measured."""
        return {"method": METHOD, "neighbours": NEIGHBOURS, "n_failing_prompts": self.n_failing_prompts}


def candidate_groups(
    examples: Sequence[Example],
    findings: list[Finding],
    effects: np.ndarray | None,
    clusters: list[ClusterSummary] | None,
    failing_prompts: Sequence[str],
    *,
    seed: int = 0,
) -> CandidateGroups:
    """Finding groups (most harmful first when effects exist, else largest first) and clusters, each with its
    failure share; `effects` is (Q, N) or None when attribution did not run."""
    ids = [example.id for example in examples]
    groups = finding_groups(ids, findings, effects, seed=seed)
    neighbours = nearest_rows([_row_text(e) for e in examples], list(failing_prompts))  # (P, k)
    if neighbours is not None:
        position = {example_id: i for i, example_id in enumerate(ids)}
        groups = [dataclasses.replace(g, failure_share=failure_share(neighbours, _members(g.example_ids, position)))
                  for g in groups]
        clusters = [dataclasses.replace(c, failure_share=failure_share(neighbours,
                                                                       _members(c.example_ids, position)))
                    for c in clusters or []] if clusters is not None else None
    return CandidateGroups(groups, clusters, 0 if neighbours is None else len(neighbours))


def finding_groups(
    ids: list[str], findings: list[Finding], effects: np.ndarray | None, *, seed: int = 0
) -> list[FindingGroup]:
    """One group per check that names rows (findings of one check merged, the most severe one's title kept)."""
    known = set(ids)
    merged: dict[str, tuple[Finding, set[str]]] = {}
    for finding in by_severity(findings):
        rows = {str(i) for i in finding.example_ids} & known
        if rows:  # the first finding of a check is its most severe: its title names the group
            merged.setdefault(finding.check, (finding, set()))[1].update(rows)
    if not merged:
        return []
    checks = sorted(merged)
    membership = np.array([[i in merged[check][1] for i in ids] for check in checks], dtype=bool)  # (G, N)
    groups = [FindingGroup(check, merged[check][0].severity, merged[check][0].title,
                           [i for i, hit in zip(ids, row, strict=True) if hit], float(row.mean()))
              for check, row in zip(checks, membership, strict=True)]
    if effects is not None:
        stats = group_statistics(effects, membership, seed=seed)
        groups = [dataclasses.replace(
            group, harm_share=float(stats.harm_share[g]), harm_share_ci=(float(stats.ci_low[g]),
                                                                         float(stats.ci_high[g])),
            lift=float(stats.lift[g]), mean_effect=float(stats.mean_effect[g]))
            for g, group in enumerate(groups)]
        return sorted(groups, key=lambda g: (-(g.harm_share or 0.0), g.check))
    return sorted(groups, key=lambda g: (-g.size, g.check))


def nearest_rows(train_texts: list[str], prompts: list[str], k: int = NEIGHBOURS) -> np.ndarray | None:
    """(P, k) indices of the k training rows most similar to each prompt (TF-IDF cosine, most similar first);
    prompts that share no term with any row are left out. None when there is nothing to match."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.metrics.pairwise import linear_kernel

    if not train_texts or not prompts:
        return None
    vectorizer = TfidfVectorizer(sublinear_tf=True, token_pattern=r"(?u)\b\w+\b")
    try:
        rows = vectorizer.fit_transform(train_texts)  # (N, V), rows l2-normalised
    except ValueError:  # no term at all in the training rows
        return None
    similarity = linear_kernel(vectorizer.transform(prompts), rows)  # (P, N) cosine
    similarity = similarity[similarity.max(axis=1) > 0]
    if not len(similarity):
        return None
    k = min(k, similarity.shape[1])
    return np.argsort(-similarity, axis=1, kind="stable")[:, :k]


def failure_share(neighbours: np.ndarray, inside: np.ndarray) -> float:
    """Mean over prompts of the fraction of their nearest rows inside the group (`inside`: (N,) boolean)."""
    return float(inside[neighbours].mean())  # (P, k) -> scalar


def _members(example_ids: list[str], position: dict[str, int]) -> np.ndarray:
    inside = np.zeros(len(position), dtype=bool)
    inside[[position[i] for i in example_ids if i in position]] = True
    return inside


def _row_text(example: Example) -> str:
    return example.prompt_text or example.completion_text
