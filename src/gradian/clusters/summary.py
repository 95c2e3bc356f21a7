"""Per cluster: how much of the harm it holds, how sure that is, and which audit findings it carries (the join).

An example's effect is its mean over eval queries (negative = pushed the model toward the failure); its harm is
max(-effect, 0). A cluster's harm share is the sum of its rows' harm over the total; the 95% CI comes from a
bootstrap over eval queries (the queries are the sample: another eval set would give other queries).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from scipy.stats import bootstrap

from gradian.audit.finding import Finding

N_RESAMPLES = 2000
CONFIDENCE = 0.95


@dataclass
class ClusterSummary:
    """One cluster of training rows with its share of the harm and its audit flag rates inside vs outside."""

    id: int
    name: str
    example_ids: list[str]
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

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["harm_share_ci"] = list(self.harm_share_ci)
        return data


def summarize_clusters(
    ids: list[str],
    labels: np.ndarray,
    effects: np.ndarray,
    names: dict[int, str],
    findings: list[Finding],
    *,
    seed: int = 0,
) -> list[ClusterSummary]:
    """One `ClusterSummary` per cluster, most harmful first. `effects` is (Q, N), one row per eval query."""
    effects = np.atleast_2d(np.asarray(effects, dtype=np.float64))  # (Q, N)
    labels = np.asarray(labels)
    if effects.shape[1] != len(ids) or len(labels) != len(ids):
        raise ValueError(f"{len(ids)} ids, {len(labels)} labels and effects of shape {effects.shape} disagree")
    clusters = sorted(int(c) for c in np.unique(labels))
    membership = np.stack([labels == c for c in clusters])  # (C, N)
    stats = group_statistics(effects, membership, seed=seed)
    flagged = flagged_ids(findings)
    summaries = []
    for row, cluster in enumerate(clusters):
        inside = membership[row]
        summaries.append(ClusterSummary(
            id=cluster,
            name=names.get(cluster, f"cluster {cluster}"),
            example_ids=[ids[i] for i in np.flatnonzero(inside)],
            size_share=float(stats.size_share[row]),
            harm_share=float(stats.harm_share[row]),
            harm_share_ci=(float(stats.ci_low[row]), float(stats.ci_high[row])),
            lift=float(stats.lift[row]),
            mean_effect=float(stats.mean_effect[row]),
            flag_rates=flag_rates(ids, inside, flagged),
        ))
    return sorted(summaries, key=lambda s: (-s.harm_share, -s.lift, s.id))


@dataclass
class GroupStatistics:
    """Per group of rows (clusters, or the rows a finding flags; groups may overlap), each array (G,)."""

    size_share: np.ndarray
    harm_share: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    lift: np.ndarray
    mean_effect: np.ndarray


def group_statistics(effects: np.ndarray, membership: np.ndarray, *, seed: int = 0) -> GroupStatistics:
    """Harm share, its bootstrap CI over queries, lift and mean effect of every group. `effects` (Q, N), `membership`
    (G, N) boolean; a group's lift is its harm share over its size share (nan for an empty group)."""
    effects = np.atleast_2d(np.asarray(effects, dtype=np.float64))  # (Q, N)
    inside = np.asarray(membership, dtype=bool)  # (G, N)
    weights = inside.astype(np.float64)
    mean_effect = effects.mean(axis=0)  # (N,)
    shares = harm_shares(mean_effect, weights)  # (G,)
    low, high = harm_share_ci(effects, weights, seed=seed)
    sizes = weights.sum(axis=1)  # (G,)
    size_share = sizes / max(inside.shape[1], 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        lift = np.where(sizes > 0, shares / size_share, np.nan)
        group_mean = np.where(sizes > 0, weights @ mean_effect / sizes, np.nan)
    return GroupStatistics(size_share, shares, np.atleast_1d(low), np.atleast_1d(high), lift, group_mean)


def harm_shares(effect: np.ndarray, membership: np.ndarray) -> np.ndarray:
    """Share of the total harm per cluster, (..., C), for effects (..., N) and membership (C, N); 0 with no harm."""
    harm = np.maximum(-effect, 0.0)  # (..., N)
    total = harm.sum(axis=-1, keepdims=True)  # (..., 1)
    per_cluster = harm @ membership.T  # (..., C)
    return np.divide(per_cluster, total, out=np.zeros_like(per_cluster), where=total > 0)


def harm_share_ci(
    effects: np.ndarray, membership: np.ndarray, *, seed: int = 0, n_resamples: int = N_RESAMPLES
) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap CI of every cluster's harm share, resampling eval queries (rows of `effects`)."""
    n_queries = effects.shape[0]
    point = harm_shares(effects.mean(axis=0), membership)
    if n_queries < 2:  # one query: nothing to resample, the share is all we know
        return point.copy(), point.copy()

    def statistic(query_rows: np.ndarray, axis: int = -1) -> np.ndarray:
        query_rows = np.atleast_2d(query_rows)  # (B, Q) resampled query indices
        counts = np.zeros((query_rows.shape[0], n_queries))
        np.add.at(counts, (np.arange(query_rows.shape[0])[:, None], query_rows), 1.0)  # (B, Q)
        resampled = counts @ effects / n_queries  # (B, N): mean effect under each resample
        return harm_shares(resampled, membership).T  # (C, B)

    result = bootstrap(
        (np.arange(n_queries),), statistic, vectorized=True, n_resamples=n_resamples, batch=200,
        confidence_level=CONFIDENCE, method="percentile", rng=np.random.default_rng(seed),
    )
    low, high = result.confidence_interval
    return np.minimum(np.atleast_1d(low), point), np.maximum(np.atleast_1d(high), point)


def flagged_ids(findings: list[Finding]) -> dict[str, set[str]]:
    """Per-example findings merged by check id: `{check: {example ids}}`."""
    flagged: dict[str, set[str]] = {}
    for finding in findings:
        if finding.per_example:
            flagged.setdefault(finding.check, set()).update(str(i) for i in finding.example_ids)
    return flagged


def flag_rates(ids: list[str], inside: np.ndarray, flagged: dict[str, set[str]]) -> dict[str, dict[str, float]]:
    """The join: for each check, the share of rows flagged inside the cluster and outside it."""
    n_inside, n_outside = int(inside.sum()), int((~inside).sum())
    rates = {}
    for check, flagged_set in sorted(flagged.items()):
        hits = np.array([i in flagged_set for i in ids], dtype=bool)
        rates[check] = {
            "inside": float(hits[inside].sum() / n_inside) if n_inside else 0.0,
            "outside": float(hits[~inside].sum() / n_outside) if n_outside else 0.0,
        }
    return rates


def examples_flags(ids: list[str], findings: list[Finding]) -> dict[str, list[str]]:
    """`{example id: [checks that flag it]}` for every id (empty list when unflagged)."""
    flags: dict[str, list[str]] = {i: [] for i in ids}
    for check, flagged_set in sorted(flagged_ids(findings).items()):
        for example_id in flagged_set:
            if example_id in flags:
                flags[example_id].append(check)
    return flags
