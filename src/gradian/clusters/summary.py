"""Per cluster: how much of the harm it holds, how sure that is, and which audit findings it carries (the join).

An example's effect is its mean over eval queries (negative = pushed the model toward the failure); its harm is
max(-effect, 0). A cluster's harm share is the sum of its rows' harm over the total. How sure that is: a lower
bound from a bootstrap over eval queries (the queries are the sample: another eval set would give other queries),
one-sided because with few queries the share is biased down and a bootstrap's upper end misses the truth above it
(BENCHMARKS.md, "The harm share's interval").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

import numpy as np
from scipy.stats import bootstrap

from gradian.audit.finding import Finding
from gradian.data.columns import StringColumn, positions_of
from gradian.scores.scoring import total_effect

N_RESAMPLES = 2000
CHUNK_ROWS = 16384  # rows read at a time when summing per group
# The lower bound is the bootstrap's 2.5th percentile, the lower end of a two-sided 95% interval (nominally 97.5% one
# sided). Subsampling 32 suite runs it held the share of all queries in >= 94% of 5-query draws and >= 95% of 10-query
# ones, so 95% is the level it earns; the data-cluster gate reads it as it read the two-sided interval's lower end.
LOWER_BOUND_CONFIDENCE = 0.975


@dataclass
class ClusterSummary:
    """One cluster of training rows with its share of the harm and its audit flag rates inside vs outside."""

    id: int
    name: str
    example_ids: Sequence[str]  # a `StringColumn` (data.columns) over the run's ids, or a list
    size_share: float
    harm_share: float
    harm_share_ci: tuple[float, float]
    lift: float
    mean_effect: float
    flag_rates: dict[str, dict[str, float]] = field(default_factory=dict)
    failure_share: float | None = None  # set by clusters.groups: share of the failing prompts' nearest rows

    @property
    def size(self) -> int:
        return len(self.example_ids)

    def to_dict(self, *, ids: bool = True) -> dict[str, Any]:
        """Plain data; without `ids` the members are left out (report.json has them in examples.jsonl)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}  # not asdict: it would deep-copy the ids
        if ids:
            data["example_ids"] = list(self.example_ids)
        else:
            del data["example_ids"]
        data["flag_rates"] = {check: dict(rates) for check, rates in self.flag_rates.items()}
        data["harm_share_ci"] = list(self.harm_share_ci)
        return data


def summarize_clusters(
    ids: Sequence[str],
    labels: np.ndarray,
    effects: np.ndarray,
    names: dict[int, str],
    findings: list[Finding],
    *,
    seed: int = 0,
) -> list[ClusterSummary]:
    """One `ClusterSummary` per cluster, most harmful first. `effects` is (Q, N), one row per eval query (it may be
    the memory-mapped scores.npy: it is read a chunk of rows at a time). A cluster's `example_ids` are a
    `StringColumn` when `ids` is one (`data.columns`), else a list."""
    effects = np.atleast_2d(effects)  # (Q, N), not copied
    labels = np.asarray(labels)
    if effects.shape[1] != len(ids) or len(labels) != len(ids):
        raise ValueError(f"{len(ids)} ids, {len(labels)} labels and effects of shape {effects.shape} disagree")
    clusters = sorted(int(c) for c in np.unique(labels))
    membership = LabelMembership(labels, clusters)
    stats = group_statistics(effects, membership, seed=seed)
    flags = RowFlags.of(ids, findings)
    summaries = []
    for row, cluster in enumerate(clusters):
        inside = labels == cluster  # (N,) bool
        summaries.append(ClusterSummary(
            id=cluster,
            name=names.get(cluster, f"cluster {cluster}"),
            example_ids=_subset(ids, np.flatnonzero(inside)),
            size_share=float(stats.size_share[row]),
            harm_share=float(stats.harm_share[row]),
            harm_share_ci=(float(stats.ci_low[row]), float(stats.ci_high[row])),
            lift=float(stats.lift[row]),
            mean_effect=float(stats.mean_effect[row]),
            flag_rates=flags.rates(inside),
        ))
    return sorted(summaries, key=lambda s: (-s.harm_share, -s.lift, s.id))


def _subset(ids: Sequence[str], rows: np.ndarray) -> Sequence[str]:
    return ids.take(rows) if isinstance(ids, StringColumn) else [ids[i] for i in rows]


class Membership(Protocol):
    """Which rows belong to each of G groups, read a chunk of rows at a time."""

    @property
    def n_groups(self) -> int: ...

    @property
    def n_rows(self) -> int: ...

    def block(self, span: slice) -> np.ndarray:
        """(G, c) float64 0/1 of the rows in `span`."""
        ...


@dataclass
class LabelMembership:
    """Clusters as groups: row i belongs to the group of its label (no (G, N) array is built)."""

    labels: np.ndarray  # (N,)
    clusters: list[int]

    @property
    def n_groups(self) -> int:
        return len(self.clusters)

    @property
    def n_rows(self) -> int:
        return len(self.labels)

    def block(self, span: slice) -> np.ndarray:
        return (np.asarray(self.labels[span])[None, :] == np.asarray(self.clusters)[:, None]).astype(np.float64)


@dataclass
class MaskMembership:
    """Groups that may overlap (the rows each finding flags): a (G, N) 0/1 array, converted a chunk at a time."""

    mask: np.ndarray  # (G, N) bool or 0/1

    @property
    def n_groups(self) -> int:
        return len(self.mask)

    @property
    def n_rows(self) -> int:
        return self.mask.shape[1]

    def block(self, span: slice) -> np.ndarray:
        return np.asarray(self.mask[:, span], dtype=np.float64)


def as_membership(membership: np.ndarray | Membership) -> Membership:
    if isinstance(membership, np.ndarray):
        return MaskMembership(np.atleast_2d(membership))
    return membership


def group_sums(values: np.ndarray, membership: Membership, chunk_rows: int = CHUNK_ROWS) -> np.ndarray:
    """(..., G) sums of (..., N) `values` over each group's rows, a chunk of rows at a time."""
    out = np.zeros((*values.shape[:-1], membership.n_groups))
    for start in range(0, membership.n_rows, chunk_rows):
        span = slice(start, start + chunk_rows)
        out += np.asarray(values[..., span], dtype=np.float64) @ membership.block(span).T
    return out


def group_sizes(membership: Membership) -> np.ndarray:
    """(G,) rows in each group."""
    return group_sums(np.ones(membership.n_rows), membership)


@dataclass
class GroupStatistics:
    """Per group of rows (clusters, or the rows a finding flags; groups may overlap), each array (G,)."""

    size_share: np.ndarray
    harm_share: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    lift: np.ndarray
    mean_effect: np.ndarray


def group_statistics(effects: np.ndarray, membership: np.ndarray | Membership, *, seed: int = 0) -> GroupStatistics:
    """Harm share, its bootstrap lower bound over queries, lift and mean effect of every group. `effects` (Q, N),
    `membership` (G, N) boolean or a `Membership`; a group's lift is its harm share over its size share (nan for an
    empty group)."""
    effects = np.atleast_2d(effects)  # (Q, N), read in chunks
    groups = as_membership(membership)
    mean_effect = total_effect(effects)  # (N,)
    shares = harm_shares(mean_effect, groups)  # (G,)
    low, high = harm_share_ci(effects, groups, seed=seed)
    sizes = group_sizes(groups)  # (G,)
    size_share = sizes / max(groups.n_rows, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        lift = np.where(sizes > 0, shares / size_share, np.nan)
        group_mean = np.where(sizes > 0, group_sums(mean_effect, groups) / sizes, np.nan)
    return GroupStatistics(size_share, shares, np.atleast_1d(low), np.atleast_1d(high), lift, group_mean)


def harm_shares(effect: np.ndarray, membership: np.ndarray | Membership) -> np.ndarray:
    """Share of the total harm per cluster, (..., C), for effects (..., N) and membership (C, N); 0 with no harm."""
    harm = np.maximum(-effect, 0.0)  # (..., N)
    total = harm.sum(axis=-1, keepdims=True)  # (..., 1)
    per_cluster = group_sums(harm, as_membership(membership))  # (..., C)
    return np.divide(per_cluster, total, out=np.zeros_like(per_cluster), where=total > 0)


def harm_share_ci(
    effects: np.ndarray, membership: np.ndarray | Membership, *, seed: int = 0, n_resamples: int = N_RESAMPLES,
    chunk_rows: int = 16384,
) -> tuple[np.ndarray, np.ndarray]:
    """Every cluster's harm share's one-sided 95% interval (low, 1): the percentile bootstrap's lower bound,
    resampling eval queries (rows of `effects`). No upper end is claimed: a bootstrap over few queries inherits the
    share's downward bias, so its upper end fell under the share of all queries in up to every draw on a strong
    cluster.

    Each resample's harm is summed per cluster a chunk of training rows at a time, so memory holds a
    (resamples, chunk) block, never (resamples, N): `effects` may be the memory-mapped scores.npy.
    """
    groups = as_membership(membership)
    n_queries, n_rows = effects.shape
    point = harm_shares(total_effect(effects, chunk_rows), groups)
    if n_queries < 2:  # one query: nothing to resample, the share is all we know
        return point.copy(), np.ones_like(point)

    def statistic(query_rows: np.ndarray, axis: int = -1) -> np.ndarray:
        query_rows = np.atleast_2d(query_rows)  # (B, Q) resampled query indices
        counts = np.zeros((query_rows.shape[0], n_queries))
        np.add.at(counts, (np.arange(query_rows.shape[0])[:, None], query_rows), 1.0)  # (B, Q)
        per_cluster = np.zeros((query_rows.shape[0], groups.n_groups))  # (B, C) Σ harm inside each cluster
        total = np.zeros((query_rows.shape[0], 1))  # (B, 1) Σ harm of every row
        for start in range(0, n_rows, chunk_rows):
            span = slice(start, start + chunk_rows)
            harm = np.maximum(-(counts @ np.asarray(effects[:, span], dtype=np.float64) / n_queries), 0.0)  # (B, c)
            per_cluster += harm @ groups.block(span).T
            total += harm.sum(axis=1, keepdims=True)
        return np.divide(per_cluster, total, out=np.zeros_like(per_cluster), where=total > 0).T  # (C, B)

    result = bootstrap(
        (np.arange(n_queries),), statistic, vectorized=True, n_resamples=n_resamples, batch=200,
        confidence_level=LOWER_BOUND_CONFIDENCE, alternative="greater", method="percentile",
        rng=np.random.default_rng(seed),
    )
    low = np.atleast_1d(result.confidence_interval.low)  # (C,); its high is +inf
    return np.minimum(low, point), np.ones_like(point)


def flagged_ids(findings: list[Finding]) -> dict[str, set[str]]:
    """Per-example findings merged by check id: `{check: {example ids}}`."""
    flagged: dict[str, set[str]] = {}
    for finding in findings:
        if finding.per_example:
            flagged.setdefault(finding.check, set()).update(str(i) for i in finding.example_ids)
    return flagged


@dataclass
class RowFlags:
    """Which per-row checks flag each row: `hits[k, i]` is True when `checks[k]` flags row i (a (K, N) bool array,
    not a dict of N lists)."""

    checks: list[str]  # sorted
    hits: np.ndarray  # (K, N) bool

    @classmethod
    def of(cls, ids: Sequence[str], findings: list[Finding]) -> RowFlags:
        flagged = flagged_ids(findings)
        checks = sorted(flagged)
        hits = np.zeros((len(checks), len(ids)), dtype=bool)
        for k, check in enumerate(checks):
            rows = positions_of(ids, flagged[check])
            hits[k, rows[rows >= 0]] = True
        return cls(checks, hits)

    def of_row(self, i: int) -> list[str]:
        """The checks that flag row i, sorted."""
        return [self.checks[k] for k in np.flatnonzero(self.hits[:, i])]

    def rates(self, inside: np.ndarray) -> dict[str, dict[str, float]]:
        """The join: for each check, the share of rows flagged inside the group (`inside`, (N,) bool) and outside."""
        n_inside, n_outside = int(inside.sum()), int((~inside).sum())
        return {check: {
            "inside": float(self.hits[k, inside].sum() / n_inside) if n_inside else 0.0,
            "outside": float(self.hits[k, ~inside].sum() / n_outside) if n_outside else 0.0,
        } for k, check in enumerate(self.checks)}
