"""`report.json`: the versioned contract that holds every number the HTML and Markdown reports show.

Documented field by field in docs/report-schema.md. Bump SCHEMA_VERSION's minor number when adding fields and its
major number when renaming or removing one.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gradian.audit.finding import Finding, by_severity
from gradian.clusters.cluster import Embedding, embed_examples
from gradian.clusters.groups import CandidateGroups
from gradian.clusters.summary import ClusterSummary, examples_flags, total_mean
from gradian.data.examples import Example
from gradian.regression.symptoms import Symptoms
from gradian.report.rows import EXAMPLES_FILE
from gradian.report.verdict import Verdict

SCHEMA_VERSION = "2.1"  # 2.0: per-row results moved to examples.jsonl; 2.1: symptoms, groups, failure_sites, ranking
CONFIDENCE_LEVEL = 0.95
HISTOGRAM_BINS = 30
# The report lists this many rows with their text: enough to read the pattern, small enough to open in a browser.
TOP_ROWS = 50
TEXT_CHARS = 2000
# The cluster map shows at most this many points (culprits always, the rest a seeded sample).
MAP_POINTS = 4000


def build_report(
    *,
    regression: dict[str, Any],
    verdict: Verdict,
    findings: list[Finding],
    examples: list[Example] | None = None,
    effects: np.ndarray | None = None,
    labels: np.ndarray | None = None,
    clusters: list[ClusterSummary] | None = None,
    features: np.ndarray | None = None,
    embedding: Embedding | None = None,
    settings: dict[str, Any] | None = None,
    artifacts: dict[str, Any] | None = None,
    run: dict[str, Any] | None = None,
    seed: int = 0,
    symptoms: Symptoms | None = None,
    groups: CandidateGroups | None = None,
    ranking: Any = None,
) -> dict[str, Any]:
    """Everything the report shows, as plain JSON-ready data.

    `effects` is (Q, N) per eval query and training row (None when attribution did not run: no-regression, or a
    setup verdict reached before it); `labels` (N,) the cluster of each row; `embedding` the space the clusters
    were fitted in, for the cluster map (else it is fitted here on `features` (N, k) and the texts). Per-row
    results go to examples.jsonl (`report.rows.ExampleRows`), not into this dict.
    `symptoms` classify the failing answers; `groups` hold the per-row finding groups and where the failures sit.
    `ranking` (a `gradian.scores.combine.Ranking`) adds each row's gradient effect, relevances and rank score.
    """
    examples = examples or []
    ids = [e.id for e in examples]
    effect = None if effects is None else total_mean(np.atleast_2d(effects))  # (N,)
    flags = examples_flags(ids, findings)
    culprits = set(verdict.culprit_ids)
    report = {
        "schema_version": SCHEMA_VERSION,
        "gradian_version": _gradian_version(),
        "confidence_level": CONFIDENCE_LEVEL,
        "verdict": verdict.to_dict(),
        "regression": dict(regression),
        "findings": [_finding(f) for f in by_severity(findings)],
        "examples_file": EXAMPLES_FILE,
        "n_examples": len(ids),
        "clusters": [_cluster(c) for c in clusters or []] if effect is not None else [],
        "symptoms": symptoms.to_dict() if symptoms is not None else {},
        "groups": [g.to_dict() for g in groups.groups] if groups is not None else [],
        "failure_sites": groups.sites() if groups is not None else {},
        "effects": _effects_summary(effects, effect),
        "top_rows": _top_rows(examples, effect, labels, flags, culprits),
        "charts": _charts(examples, effect, labels, embedding or _embedding(examples, features, labels, seed),
                          culprits, verdict, seed),
        "settings": settings or {},
        "artifacts": artifacts or {},
        "run": run or {},
        "ranking": {"rank": ranking.rank, "checks": ranking.checks} if ranking is not None else {},
    }
    return jsonable(report)


def _gradian_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gradian")
    except PackageNotFoundError:
        return "unknown"


def _finding(finding: Finding) -> dict[str, Any]:
    return finding.to_dict()


def _cluster(cluster: ClusterSummary) -> dict[str, Any]:
    data = cluster.to_dict()
    del data["example_ids"]  # members are in examples.jsonl (`cluster`): report.json stays small in N
    return {**data, "size": cluster.size}


def _embedding(examples: list[Example], features: np.ndarray | None, labels: np.ndarray | None,
               seed: int) -> Embedding | None:
    if labels is None or not examples:
        return None
    return embed_examples([(e.prompt_text, e.completion_text) for e in examples], features, seed=seed)


def _effects_summary(effects: np.ndarray | None, effect: np.ndarray | None) -> dict[str, Any]:
    if effects is None or effect is None or effect.size == 0:
        return {}
    harm = np.maximum(-effect, 0.0)
    return {
        "n_queries": int(np.atleast_2d(effects).shape[0]), "n_examples": int(effect.size),
        "mean": float(effect.mean()), "min": float(effect.min()), "max": float(effect.max()),
        "total_harm": float(harm.sum()), "n_harmful": int((effect < 0).sum()),
    }


def _top_rows(examples, effect, labels, flags, culprits) -> list[dict[str, Any]]:
    """The culprits (most harmful first), else the most harmful rows, each with its text."""
    if effect is None or not examples:
        return []
    order = np.argsort(effect, kind="stable")
    chosen = [i for i in order if examples[i].id in culprits] if culprits else [i for i in order if effect[i] < 0]
    return [
        {
            "id": examples[i].id, "effect": float(effect[i]), "cluster": None if labels is None else int(labels[i]),
            "flags": flags[examples[i].id], "culprit": examples[i].id in culprits,
            "prompt": _clip(examples[i].prompt_text), "completion": _clip(examples[i].completion_text),
        }
        for i in chosen[:TOP_ROWS]
    ]


def _clip(text: str) -> str:
    return text if len(text) <= TEXT_CHARS else text[:TEXT_CHARS] + " \u2026"


def _charts(examples, effect, labels, embedding, culprits, verdict, seed) -> dict[str, Any]:
    """Data behind the HTML charts: the effect histogram and the 2-D cluster map."""
    if effect is None or effect.size == 0:
        return {}
    counts, edges = np.histogram(effect, bins=HISTOGRAM_BINS)
    threshold = verdict.evidence.get("effect_threshold")
    charts: dict[str, Any] = {
        "effect_histogram": {"edges": edges.tolist(), "counts": counts.tolist(), "threshold": threshold},
    }
    if labels is not None and embedding is not None:
        keep = _map_sample(examples, culprits, seed)
        coordinates = embedding.coordinates(np.asarray(keep, dtype=np.int64))  # (len(keep), 2)
        charts["cluster_map"] = {
            "method": embedding.method,
            "points": [
                {"id": examples[i].id, "x": float(coordinates[j, 0]), "y": float(coordinates[j, 1]),
                 "cluster": int(labels[i]), "culprit": examples[i].id in culprits}
                for j, i in enumerate(keep)
            ],
        }
    return charts


def _map_sample(examples: list[Example], culprits: set[str], seed: int) -> list[int]:
    if len(examples) <= MAP_POINTS:
        return list(range(len(examples)))
    forced = [i for i, e in enumerate(examples) if e.id in culprits]
    others = np.array([i for i, e in enumerate(examples) if e.id not in culprits])
    room = max(MAP_POINTS - len(forced), 0)
    sample = np.random.default_rng(seed).choice(others, size=min(room, len(others)), replace=False)
    return sorted(forced + sample.tolist())


def jsonable(value: Any) -> Any:
    """Plain JSON types only: numpy scalars and arrays unwrapped, tuples as lists, NaN and inf as None."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [jsonable(v) for v in (sorted(value) if isinstance(value, set) else value)]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
