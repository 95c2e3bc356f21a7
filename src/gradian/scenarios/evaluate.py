"""How well a ranking of training rows recovers a scenario's planted culprits (tests and benchmarks).

Scores are compared with two references: random order, and the category oracle (every row of the
affected category first, in random order) — a method that cannot beat the oracle is naming the
category, not separating the culprits from their clean neighbours.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sklearn.metrics import average_precision_score


def culprit_metrics(effect: np.ndarray, ids: Sequence[str], truth: dict, seed: int = 0) -> dict[str, float]:
    """AUPRC and precision at k = number of culprits, ranking by −effect (most harmful first), and separation."""
    culprits = set(truth["culprit_ids"])
    positive = np.array([example_id in culprits for example_id in ids])
    if not positive.any():
        raise ValueError("this scenario has no planted culprit rows")
    order = np.argsort(effect, kind="stable")
    k = int(positive.sum())
    effect = np.asarray(effect, dtype=np.float64)
    clean = effect[~positive]
    spread = 1.4826 * float(np.median(np.abs(clean - np.median(clean)))) or 1e-12
    return {
        "auprc": float(average_precision_score(positive, -effect)),
        "precision_at_k": float(positive[order[:k]].mean()),
        # how far below the clean rows the culprits sit, in robust standard deviations of the clean rows: it
        # still tells methods apart when both rank every culprit first (AUPRC 1.0)
        "separation": (float(np.median(clean)) - float(np.median(effect[positive]))) / spread,
        "culprits_helpful": float((effect[positive] > 0).mean()),  # culprits ranked as helping the capability
        "random_auprc": float(positive.mean()),
        "oracle_auprc": oracle_auprc(ids, truth, seed),
    }


def oracle_auprc(ids: Sequence[str], truth: dict, seed: int = 0) -> float:
    """AUPRC of the category oracle: the affected category first, each group in random order."""
    rng = np.random.default_rng(seed)
    category = set(truth.get("category_ids") or [])
    score = np.array([example_id in category for example_id in ids], dtype=np.float64) + rng.random(len(ids)) * 0.5
    positive = np.array([example_id in set(truth["culprit_ids"]) for example_id in ids])
    return float(average_precision_score(positive, score))
