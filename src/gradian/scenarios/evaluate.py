"""How well a ranking of training rows recovers a scenario's planted culprits (tests and benchmarks).

The one AUPRC (`auprc`, scikit-learn's average precision: tied scores form one threshold, so a constant ranking
scores the culprits' share) and the two references every method is compared with: random order
(`random_scores`), and the category oracle (`category_oracle`: every row of the affected category first, in
random order) — a method that cannot beat the oracle is naming the category, not separating the culprits from
their clean neighbours. Both references read the scenario's ground truth, so only tests and benchmarks use them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from sklearn.metrics import average_precision_score


def auprc(scores: np.ndarray, positive: np.ndarray) -> float:
    """Average precision of `scores` (higher = more suspect) with the `positive` rows (the culprits) as positives."""
    positive = np.asarray(positive, dtype=bool)
    if not positive.any():
        raise ValueError("no positive rows")
    return float(average_precision_score(positive, np.asarray(scores, dtype=np.float64)))


def planted(ids: Sequence[str], truth: dict[str, Any]) -> np.ndarray:
    """(N,) bool: which of the rows `ids` the scenario's `truth.json` planted (its `culprit_ids`)."""
    culprits = set(truth["culprit_ids"])
    return np.array([example_id in culprits for example_id in ids], dtype=bool)


def random_scores(n_rows: int, seed: int = 0) -> np.ndarray:
    """(N,) a seeded random order: the floor every method must clear."""
    return np.random.default_rng(seed).random(n_rows)


def category_oracle(ids: Sequence[str], truth: dict[str, Any], seed: int = 0,
                    row_categories: Sequence[str | None] | None = None) -> np.ndarray:
    """(N,) every row of the affected category(ies) above every other row, in random order within each group.

    It reads the scenario's `truth.json`: `category_ids`, and for a two-cause run each cause's `category` (the
    rows whose `category` in `row_categories`, the training rows' own field, is that one).
    """
    category = set(truth.get("category_ids") or [])
    named = {cause.get("category") for cause in truth.get("causes") or []} - {None}
    if named and row_categories is not None:
        category |= {i for i, c in zip(ids, row_categories, strict=True) if c in named}
    inside = np.array([example_id in category for example_id in ids], dtype=np.float64)
    return inside + 0.5 * random_scores(len(ids), seed)


def oracle_auprc(ids: Sequence[str], truth: dict, seed: int = 0,
                 row_categories: Sequence[str | None] | None = None) -> float:
    """AUPRC of the category oracle, the planted culprits positive."""
    return auprc(category_oracle(ids, truth, seed, row_categories), planted(ids, truth))


def culprit_metrics(effect: np.ndarray, ids: Sequence[str], truth: dict, seed: int = 0) -> dict[str, float]:
    """AUPRC and precision at k = number of culprits, ranking by −effect (most harmful first), and separation."""
    positive = planted(ids, truth)
    if not positive.any():
        raise ValueError("this scenario has no planted culprit rows")
    order = np.argsort(effect, kind="stable")
    k = int(positive.sum())
    effect = np.asarray(effect, dtype=np.float64)
    clean = effect[~positive]
    spread = 1.4826 * float(np.median(np.abs(clean - np.median(clean)))) or 1e-12
    return {
        "auprc": auprc(-effect, positive),
        "precision_at_k": float(positive[order[:k]].mean()),
        # how far below the clean rows the culprits sit, in robust standard deviations of the clean rows: it
        # still tells methods apart when both rank every culprit first (AUPRC 1.0)
        "separation": (float(np.median(clean)) - float(np.median(effect[positive]))) / spread,
        "culprits_helpful": float((effect[positive] > 0).mean()),  # culprits ranked as helping the capability
        "random_auprc": float(positive.mean()),
        "oracle_auprc": oracle_auprc(ids, truth, seed),
    }
