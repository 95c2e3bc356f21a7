"""Which rows each removal takes: a seeded random set, a set from the named rows' own topic, the ranking's top k.

Every set is a list of row ids; `plan` turns each into a zero-weight retrain.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gradian.data.examples import Example
from gradian.errors import InputError

# `gradian verify --curve`: remove the ranking's top k rows for k = each share of the training rows.
CURVE_SHARES = (0.01, 0.02, 0.05, 0.10, 0.20)


def random_set(examples: Sequence[Example], size: int, seed: Sequence[int]) -> list[str]:
    """`size` row ids drawn without replacement, seeded by `seed` (e.g. [run seed, draw number])."""
    ids = [e.id for e in examples]
    return [str(i) for i in np.random.default_rng(list(seed)).choice(ids, size=min(size, len(ids)), replace=False)]


@dataclass
class TopicPool:
    """The named rows' own category (a `category` column) or cluster (the report's), as a pool to draw from."""

    source: str  # "category" | "cluster"
    name: str
    pool: list[str]


def named_topic(examples: Sequence[Example], rows: Sequence[dict[str, Any]], named: set[str]) -> TopicPool | None:
    """The category, else the report cluster, holding most of the named rows; None when rows have neither."""
    category = {e.id: e.raw.get("category") for e in examples if isinstance(e.raw.get("category"), (str, int))}
    cluster = {row["id"]: row["cluster"] for row in rows if row.get("cluster") is not None}
    for source, labels in (("category", category), ("cluster", cluster)):
        held = Counter(labels[i] for i in named if i in labels)
        if held:
            label = held.most_common(1)[0][0]
            return TopicPool(source, str(label), [e.id for e in examples if labels.get(e.id) == label])
    return None


def topic_set(topic: TopicPool, size: int, seed: int) -> tuple[list[str] | None, str | None]:
    """`size` rows drawn from the topic (the named rows among them as likely as any), or (None, why not)."""
    if len(topic.pool) <= size:
        return None, (f"the named rows' {topic.source} ({topic.name}) holds {len(topic.pool)} rows, no more than the "
                      f"{size} named: a same-size draw from it would be the named rows themselves")
    drawn = np.random.default_rng([seed, 1_000_003]).choice(topic.pool, size=size, replace=False)
    return [str(i) for i in drawn], None


def ranking_of(rows: Sequence[dict[str, Any]], report_dir: Any) -> tuple[list[str], str]:
    """Row ids, most suspect first, by the report's `rank_score` (else harm, −`effect`), and the field used.

    Raises `InputError` when the report holds no per-row ranking (attribution did not run)."""
    for field, sign in (("rank_score", 1.0), ("effect", -1.0)):
        if rows and all(row.get(field) is not None for row in rows):
            return top_k([sign * float(row[field]) for row in rows], [row["id"] for row in rows], len(rows)), field
    raise InputError("holds no per-row ranking (examples.jsonl has no rank_score or effect: attribution did not run), "
                     "so there is no top k to remove; run `gradian verify` without --curve.", report_dir)


def top_k(scores: Sequence[float] | np.ndarray, ids: Sequence[str], k: int) -> list[str]:
    """The ids of the k highest scores, highest first; ties keep dataset order."""
    order = sorted(range(len(ids)), key=lambda i: (-scores[i], i))
    return [ids[i] for i in order[:k]]


def curve_sizes(n_rows: int, shares: Sequence[float] = CURVE_SHARES) -> list[tuple[float, int]]:
    """(share, k) for each share of the rows, k ≥ 1, each k once (small data can round two shares together)."""
    seen: set[int] = set()
    out = []
    for share in shares:
        k = max(1, round(share * n_rows))
        if k not in seen and k < n_rows:
            seen.add(k)
            out.append((share, k))
    return out
