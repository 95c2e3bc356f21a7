"""`report.json`: the versioned contract that holds every number the HTML and Markdown reports show.

Documented field by field in docs/report-schema.md. Bump SCHEMA_VERSION's minor number when adding fields and its
major number when renaming or removing one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from gradian.audit.finding import Finding, by_severity
from gradian.clusters.cluster import Embedding, embed_examples
from gradian.clusters.groups import CandidateGroups
from gradian.clusters.summary import ClusterSummary, RowFlags
from gradian.data.columns import ids_of, mask_of, texts_of
from gradian.data.examples import Example
from gradian.data.framework_version import package_version
from gradian.regression.symptoms import Symptoms
from gradian.report.rows import EXAMPLES_FILE
from gradian.scores.scoring import distinct, total_effect
from gradian.verdict import Verdict

if TYPE_CHECKING:
    from gradian.scores.combine import Ranking

SCHEMA_VERSION = "2.21"  # 2.0: per-row results moved to examples.jsonl; 2.1: symptoms, groups, failure_sites, ranking;
# 2.2: top_rows[].harm_token; 2.3: ranking.checks[].auc is the agreement with the gradient (it was a separation),
# verdict.evidence.located_by; 2.4: ranking.row_harm, the rows' token_harm; 2.5: ranking.row_harm positions, the
# rows' token_harm renamed row_harm (the harm of whichever kind); 2.6: verdict.causes, groups[].name and .symptom,
# verdict.evidence.gradients.top_cluster.inside_named_rows; 2.7: run.tracin_cp.captured_steps; 2.8: groups[].on_symptom,
# causes located_by symptom-harm; 2.9: run.preparation; regression.test, .interval (the CI is the deciding test
# inverted) and .detectable_drop; effects.distinct; the substitution symptom; run.gradient_check; 2.10: ranking.activation and
# ranking.agreement (--rank activation)
# 2.11: served, verdict kind serving and causes of kind serving; 2.12: causes' setting_fix and setting_finding,
# run.preparation.rows and code trainer+port (TRL's own preparation code renders the rows); 2.13: run.preparation.trainer
# `OpenAI fine-tuning` (a data file with OpenAI weight keys and no run settings); 2.14: trainer `LLaMA-Factory` (its
# own code prepares the rows), setup.llamafactory, setup.prepared_by.llamafactory_version; 2.15: regression.training_noise;
# 2.16: symptoms.ran_to_limit; 2.17: regression.stricter; 2.18: regression.interval exact-product / signed-rank-product
# (the CI holds how many answers changed too); 2.19: harm_share_ci is one-sided, [low, 1]; 2.20: symptoms.departures and
# verdict.evidence.outliers.departures_written (rule 5's outlying rows must write the failing answers' departures)
# 2.21: regression.slice (a refusal's eval category that dropped while the whole eval did not)
CONFIDENCE_LEVEL = 0.95
HISTOGRAM_BINS = 30
# The report lists this many rows with their text: enough to read the pattern, small enough to open in a browser.
TOP_ROWS = 50
TEXT_CHARS = 2000
# The cluster map shows at most this many points (culprits always, the rest a seeded sample).
MAP_POINTS = 4000


@dataclass(frozen=True)
class Attribution:
    """What attribution found, as the report shows it: absent when it did not run (no regression, or a setup verdict
    reached before it)."""

    effects: np.ndarray  # (Q, N) per eval query and training row
    labels: np.ndarray | None = None  # (N,) each row's cluster
    clusters: list[ClusterSummary] = field(default_factory=list)
    embedding: Embedding | None = None  # the space the clusters were fitted in, for the cluster map
    features: np.ndarray | None = None  # (N, k): the map is fitted on these and the texts when `embedding` is None
    ranking: Ranking | None = None  # each row's gradient effect, relevances and rank score


@dataclass(frozen=True)
class Context:
    """How the report was made: the settings, the files written beside it, what was read of the run, the seed."""

    settings: dict[str, Any] = field(default_factory=dict)
    artifacts: dict[str, Any] = field(default_factory=dict)
    run: dict[str, Any] = field(default_factory=dict)
    seed: int = 0


def build_report(regression: dict[str, Any], verdict: Verdict, findings: list[Finding],
                 examples: Sequence[Example] = (), *, attribution: Attribution | None = None,
                 symptoms: Symptoms | None = None, groups: CandidateGroups | None = None,
                 context: Context | None = None, served: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything the report shows, as plain JSON-ready data.

    Per-row results go to examples.jsonl (`report.rows.ExampleRows`), not into this dict. `symptoms` classify the
    failing answers; `groups` hold the per-row finding groups and where the failures sit; `served` is the served
    regression's block (only with the served answers).
    """
    context = context or Context()
    ids = ids_of(examples)  # a StringColumn for ExampleColumns: no list of N ids
    effects = attribution.effects if attribution is not None else None  # (Q, N)
    effect = None if attribution is None else _row_effect(attribution)  # (N,)
    labels = attribution.labels if attribution is not None else None
    flags = RowFlags.of(ids, findings)
    culprits = mask_of(ids, verdict.culprit_ids)  # (N,) bool
    ranking = attribution.ranking if attribution is not None else None
    report = {
        "schema_version": SCHEMA_VERSION,
        "gradian_version": package_version("gradian") or "unknown",
        "confidence_level": CONFIDENCE_LEVEL,
        "verdict": verdict.to_dict(),
        "regression": dict(regression),
        "findings": [_finding(f) for f in by_severity(findings)],
        "examples_file": EXAMPLES_FILE,
        "n_examples": len(ids),
        "clusters": [_cluster(c) for c in attribution.clusters] if attribution is not None else [],
        "symptoms": symptoms.to_dict() if symptoms is not None else {},
        "groups": [g.to_dict() for g in groups.groups] if groups is not None else [],
        "failure_sites": groups.sites() if groups is not None else {},
        "effects": _effects_summary(effects, effect),
        "top_rows": _top_rows(examples, effect, labels, flags, culprits),
        "charts": _charts(ids, effect, labels, _embedding(examples, attribution, context.seed), culprits, verdict,
                          context.seed),
        "settings": context.settings,
        "artifacts": context.artifacts,
        "run": context.run,
        "ranking": ranking.summary() if ranking is not None else {},
    }
    if served is not None:
        report["served"] = served
    return jsonable(report)


def _finding(finding: Finding) -> dict[str, Any]:
    return finding.to_dict()


def _cluster(cluster: ClusterSummary) -> dict[str, Any]:
    data = cluster.to_dict(ids=False)  # members are in examples.jsonl (`cluster`): report.json stays small in N
    return {**data, "size": cluster.size}


def _embedding(examples: Sequence[Example], attribution: Attribution | None, seed: int) -> Embedding | None:
    if attribution is None or attribution.labels is None or not len(examples):
        return None
    return attribution.embedding or embed_examples(texts_of(examples), attribution.features, seed=seed)


def _row_effect(attribution: Attribution) -> np.ndarray:
    """(N,) each row's mean effect: the ranking's (equal scores give exactly equal effects), else the effects'."""
    if attribution.ranking is not None:
        return attribution.ranking.effect
    return total_effect(np.atleast_2d(attribution.effects))


def _effects_summary(effects: np.ndarray | None, effect: np.ndarray | None) -> dict[str, Any]:
    if effects is None or effect is None or effect.size == 0:
        return {}
    harm = np.maximum(-effect, 0.0)
    return {
        "n_queries": int(np.atleast_2d(effects).shape[0]), "n_examples": int(effect.size),
        "mean": float(effect.mean()), "min": float(effect.min()), "max": float(effect.max()),
        "total_harm": float(harm.sum()), "n_harmful": int((effect < 0).sum()), "distinct": distinct(effect),
    }


def _top_rows(examples: Sequence[Example], effect: np.ndarray | None, labels: np.ndarray | None, flags: RowFlags,
              culprits: np.ndarray) -> list[dict[str, Any]]:
    """The culprits (most harmful first), else the most harmful rows when the effects tell rows apart, each with
    its text; rows of equal effect in dataset order."""
    if effect is None or not len(examples):
        return []
    order = np.argsort(effect, kind="stable")  # (N,) ties: the row's position
    harmful = effect[order] < 0 if distinct(effect) else np.zeros(len(order), dtype=bool)
    chosen = order[culprits[order]] if culprits.any() else order[harmful]
    rows = []
    for i in chosen[:TOP_ROWS].tolist():
        example = examples[i]
        rows.append({
            "id": example.id, "effect": float(effect[i]), "cluster": None if labels is None else int(labels[i]),
            "flags": flags.of_row(i), "culprit": bool(culprits[i]),
            "prompt": _clip(example.prompt_text), "completion": _clip(example.completion_text),
        })
    return rows


def _clip(text: str) -> str:
    return text if len(text) <= TEXT_CHARS else text[:TEXT_CHARS] + " \u2026"


def _charts(ids: Sequence[str], effect: np.ndarray | None, labels: np.ndarray | None, embedding: Embedding | None,
            culprits: np.ndarray, verdict: Verdict, seed: int) -> dict[str, Any]:
    """Data behind the HTML charts: the effect histogram (left out when every row scored the same: there is no
    spread to draw, and the report says so) and the 2-D cluster map."""
    if effect is None or effect.size == 0:
        return {}
    charts: dict[str, Any] = {}
    if distinct(effect):
        counts, edges = np.histogram(effect, bins=HISTOGRAM_BINS, range=(float(effect.min()), float(effect.max())))
        threshold = verdict.evidence.get("effect_threshold")
        charts["effect_histogram"] = {"edges": edges.tolist(), "counts": counts.tolist(), "threshold": threshold}
    if labels is not None and embedding is not None:
        keep = _map_sample(culprits, seed)
        coordinates = embedding.coordinates(keep)  # (len(keep), 2)
        charts["cluster_map"] = {
            "method": embedding.method,
            "points": [
                {"id": ids[i], "x": float(coordinates[j, 0]), "y": float(coordinates[j, 1]),
                 "cluster": int(labels[i]), "culprit": bool(culprits[i])}
                for j, i in enumerate(keep.tolist())
            ],
        }
    return charts


def _map_sample(culprits: np.ndarray, seed: int) -> np.ndarray:
    """(≤ MAP_POINTS,) rows of the map in dataset order: every culprit, the rest a seeded sample."""
    if len(culprits) <= MAP_POINTS:
        return np.arange(len(culprits))
    forced, others = np.flatnonzero(culprits), np.flatnonzero(~culprits)
    room = max(MAP_POINTS - len(forced), 0)
    sample = np.random.default_rng(seed).choice(others, size=min(room, len(others)), replace=False)
    return np.sort(np.concatenate([forced, sample]))


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
