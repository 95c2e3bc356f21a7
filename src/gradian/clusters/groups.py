"""Candidate groups beyond clusters, and where the failures sit.

Every per-row audit finding (`cut_in_data`, `truncated_completion`, `duplicate`, `fails_capability`, any check that
names rows) becomes a group of training rows with the numbers a cluster has: its harm share, its bootstrap lower bound
over eval queries and its lift, computed by `clusters.summary.group_statistics`, the same code as for clusters.

Where the failures sit: each failing eval prompt is matched to the training rows whose prompts resemble it most
(TF-IDF cosine, scikit-learn), its `NEIGHBOURS` nearest rows. A group's `failure_share` is the mean, over failing
prompts, of the fraction of those nearest rows that belong to the group: 1.0 when every failing prompt looks like
the group's rows only, about the group's size share when the failures are spread over the data. It needs no
gradients, so it holds where gradient harm is spread.

Split by symptom: a check that applies the capability to the training targets (`fails_capability`, or any check
registered as teaching `ANY_SYMPTOM` whose findings name their capability) flags rows that fail in different ways:
rows cut mid-object teach stopping early, rows wrapped in prose teach wrapping. When its rows' own targets show at
least two symptoms (`regression.symptoms.classify_answer` on each target, as an answer that stopped), the group is
also given one sub-group per symptom (`name` `check:symptom`), so each cause can be named with its own rows.

Harm on its own symptom: a group whose rows teach one symptom (a sub-group's, or a check's single one such as
`missing_fields`'s `wrong-fields`) also gets its harm share over the failing queries whose answers show that symptom
(`on_symptom`). Where two causes fail different answers, the all-query share can hide one. On a dev run with rows
cut in one category and a field dropped from another (half the failing answers stop early, half have wrong fields),
the dropped-field rows hold 14.5% of the harm over all failing answers, under their 17% of the rows, and 27.0% (at
least 26.8%) over the answers with wrong fields; the cut rows hold 83% and 84%.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from gradian.audit.capability import target_text
from gradian.audit.finding import Finding, by_severity
from gradian.audit.registry import ANY_SYMPTOM, teaches
from gradian.capabilities import get_capability
from gradian.clusters.summary import CHUNK_ROWS, ClusterSummary, group_statistics
from gradian.data.columns import ids_of, positions_of, texts_of
from gradian.data.examples import Example
from gradian.regression.symptoms import classify_answer

NEIGHBOURS = 10
METHOD = "tf-idf cosine of each failing eval prompt with the training rows' prompts"


@dataclass
class SymptomHarm:
    """A group's harm over the failing queries that show the symptom its rows teach, as `group_statistics` computes it."""

    symptom: str
    queries: int
    harm_share: float
    harm_share_ci: tuple[float, float]
    lift: float


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
    symptom: str | None = None  # a sub-group: the symptom its rows' own targets show (see the module docstring)
    on_symptom: SymptomHarm | None = None  # its harm on the queries that show the one symptom it teaches

    @property
    def name(self) -> str:
        return self.check if self.symptom is None else f"{self.check}:{self.symptom}"

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
        if self.on_symptom is not None:
            data["on_symptom"]["harm_share_ci"] = list(self.on_symptom.harm_share_ci)
        return {**data, "name": self.name, "size": self.size, "failure_lift": self.failure_lift}


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
    query_symptoms: Sequence[str | None] | None = None,
) -> CandidateGroups:
    """Finding groups (most harmful first when effects exist, else largest first) and clusters, each with its
    failure share; `effects` is (Q, N) or None when attribution did not run, `query_symptoms` (Q,) the symptom of
    each query's failing answer."""
    ids = ids_of(examples)
    groups = finding_groups(ids, findings, effects, seed=seed, examples=examples, query_symptoms=query_symptoms)
    neighbours = nearest_rows(_row_texts(examples), list(failing_prompts))  # (P, k)
    if neighbours is not None:
        groups = [dataclasses.replace(g, failure_share=failure_share(neighbours, _members(ids, g.example_ids)))
                  for g in groups]
        clusters = [dataclasses.replace(c, failure_share=failure_share(neighbours, _members(ids, c.example_ids)))
                    for c in clusters or []] if clusters is not None else None
    return CandidateGroups(groups, clusters, 0 if neighbours is None else len(neighbours))


def finding_groups(
    ids: Sequence[str], findings: list[Finding], effects: np.ndarray | None, *, seed: int = 0,
    examples: Sequence[Example] | None = None, query_symptoms: Sequence[str | None] | None = None,
) -> list[FindingGroup]:
    """One group per check that names rows (findings of one check merged, the most severe one's title kept), and
    with `examples`, the symptom sub-groups of a check that applies the capability; with `query_symptoms` (Q,),
    each single-symptom group's harm on its symptom's queries (module docstring)."""
    merged: dict[str, tuple[Finding, np.ndarray]] = {}
    for finding in by_severity(findings):
        found = positions_of(ids, [str(i) for i in finding.example_ids])
        rows = found[found >= 0]
        if len(rows):  # the first finding of a check is its most severe: its title names the group
            first, seen = merged.get(finding.check, (finding, np.zeros(0, dtype=np.int64)))
            merged[finding.check] = (first, np.union1d(seen, rows))
    if not merged:
        return []
    parts: list[tuple[str, str | None, np.ndarray]] = [(check, None, merged[check][1]) for check in sorted(merged)]
    if examples is not None:
        parts += [(check, symptom, rows) for check in sorted(merged)
                  for symptom, rows in symptom_split(examples, merged[check][0], merged[check][1]).items()]
    membership = np.zeros((len(parts), len(ids)), dtype=bool)  # (G, N)
    for row, (_, _, rows) in zip(membership, parts, strict=True):
        row[rows] = True
    groups = [FindingGroup(check, merged[check][0].severity, merged[check][0].title,
                           [ids[int(i)] for i in np.flatnonzero(row)], float(row.mean()), symptom=symptom)
              for (check, symptom, _), row in zip(parts, membership, strict=True)]
    if effects is not None:
        stats = group_statistics(effects, membership, seed=seed)
        groups = [dataclasses.replace(
            group, harm_share=float(stats.harm_share[g]), harm_share_ci=(float(stats.ci_low[g]),
                                                                         float(stats.ci_high[g])),
            lift=float(stats.lift[g]), mean_effect=float(stats.mean_effect[g]))
            for g, group in enumerate(groups)]
        if query_symptoms is not None:
            groups = with_symptom_harm(groups, membership, effects, query_symptoms, seed)
        return sorted(groups, key=lambda g: (-(g.harm_share or 0.0), g.name))
    return sorted(groups, key=lambda g: (-g.size, g.name))


def with_symptom_harm(groups: list[FindingGroup], membership: np.ndarray, effects: np.ndarray,
                      query_symptoms: Sequence[str | None], seed: int) -> list[FindingGroup]:
    """Each group that teaches one symptom, with its harm over the queries (rows of `effects`, (Q, N)) whose
    answers show it; `membership` (G, N) in the groups' order."""
    shown = np.asarray(query_symptoms, dtype=object)  # (Q,)
    out = list(groups)
    for symptom in sorted({s for g in groups if (s := single_symptom(g)) is not None}):
        queries = np.flatnonzero(shown == symptom)
        picked = [g for g, group in enumerate(groups) if single_symptom(group) == symptom]
        if not len(queries) or not picked:
            continue
        stats = group_statistics(effects[queries], membership[picked], seed=seed)
        for k, g in enumerate(picked):
            out[g] = dataclasses.replace(groups[g], on_symptom=SymptomHarm(
                symptom, len(queries), float(stats.harm_share[k]), (float(stats.ci_low[k]), float(stats.ci_high[k])),
                float(stats.lift[k])))
    return out


def single_symptom(group: FindingGroup) -> str | None:
    """The one symptom a group's rows teach (a sub-group's own, or its check's only one), else None."""
    if group.symptom is not None:
        return group.symptom
    taught = teaches(group.check)
    return taught[0] if len(taught) == 1 and taught[0] != ANY_SYMPTOM else None


def symptom_split(examples: Sequence[Example], finding: Finding, rows: np.ndarray) -> dict[str, np.ndarray]:
    """{symptom: positions} of the rows a capability check flags, by the symptom of each row's own target; empty
    unless the check teaches any symptom, names its capability, and its rows show at least two symptoms."""
    name = finding.values.get("capability")
    if ANY_SYMPTOM not in teaches(finding.check) or not isinstance(name, str):
        return {}
    capability = get_capability(name)
    split: dict[str, list[int]] = {}
    for i in rows.tolist():
        text = target_text(examples[i], None)
        if text is not None:
            split.setdefault(classify_answer(text, True, None, capability), []).append(i)
    return {s: np.asarray(r, dtype=np.int64) for s, r in sorted(split.items())} if len(split) >= 2 else {}


def nearest_rows(train_texts: Sequence[str], prompts: list[str], k: int = NEIGHBOURS,
                 chunk_rows: int = CHUNK_ROWS) -> np.ndarray | None:
    """(P, k) indices of the k training rows most similar to each prompt (TF-IDF cosine, most similar first, ties
    to the earlier row); prompts that share no term with any row are left out. None when there is nothing to match.

    The similarities are computed a chunk of training rows at a time, keeping each prompt's best k so far: memory
    holds a (P, chunk + k) block, never (P, N).
    """
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.metrics.pairwise import linear_kernel

    if not len(train_texts) or not prompts:
        return None
    vectorizer = TfidfVectorizer(sublinear_tf=True, token_pattern=r"(?u)\b\w+\b")
    try:
        vectorizer.fit(train_texts)
    except ValueError:  # no term at all in the training rows
        return None
    queries = vectorizer.transform(prompts)  # (P, V)
    k = min(k, len(train_texts))
    best = np.zeros((len(prompts), 0), dtype=np.int64)  # (P, ≤ k) rows, best first
    best_scores = np.zeros((len(prompts), 0))
    for start in range(0, len(train_texts), chunk_rows):
        stop = min(start + chunk_rows, len(train_texts))
        block = linear_kernel(queries, vectorizer.transform([train_texts[i] for i in range(start, stop)]))  # (P, c)
        rows = np.hstack([best, np.broadcast_to(np.arange(start, stop), block.shape)])  # (P, k + c)
        scores = np.hstack([best_scores, block])
        order = np.lexsort((rows, -scores), axis=-1)[:, :k]  # highest first, the earlier row on a tie
        best, best_scores = np.take_along_axis(rows, order, 1), np.take_along_axis(scores, order, 1)
    matched = best_scores.max(axis=1) > 0
    return best[matched] if matched.any() else None


def failure_share(neighbours: np.ndarray, inside: np.ndarray) -> float:
    """Mean over prompts of the fraction of their nearest rows inside the group (`inside`: (N,) boolean)."""
    return float(inside[neighbours].mean())  # (P, k) -> scalar


def _members(ids: Sequence[str], example_ids: Sequence[str]) -> np.ndarray:
    """(N,) bool: the rows among `ids` named in `example_ids`."""
    found = positions_of(ids, example_ids)
    inside = np.zeros(len(ids), dtype=bool)
    inside[found[found >= 0]] = True
    return inside


class _RowTexts(Sequence[str]):
    """Each row's prompt text, its completion text when it has no prompt, read one row at a time."""

    def __init__(self, texts: Sequence[tuple[str, str]]) -> None:
        self.texts = texts

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, index: int) -> str:  # type: ignore[override]
        prompt, completion = self.texts[index]
        return prompt or completion

    def __iter__(self) -> Iterator[str]:
        return (prompt or completion for prompt, completion in self.texts)


def _row_texts(examples: Sequence[Example]) -> Sequence[str]:
    return _RowTexts(texts_of(examples))
