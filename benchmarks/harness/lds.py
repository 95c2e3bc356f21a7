"""The linear datamodeling score (LDS) as EleutherAI bergson's `validate` measures it, with a bootstrap CI.

For M subsets S_m of the training rows, each left out (zero weight) in one retrain, and Q failing queries:
`measured[m, q]` is the change of query q's loss when S_m is left out (retrain without S_m − retrain with every row),
`predicted[m]` (or `predicted[m, q]`) a method's prediction of that change. Per query, Spearman ρ between the
predicted and the measured change over the M subsets; the LDS is the mean ρ over the queries (a query whose
measured change is constant has no ρ and is left out). The 95% CI resamples the subsets with replacement.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

RESAMPLES = 1000


def per_query_rho(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """(Q,) Spearman ρ per query; NaN where either side is constant over the subsets.

    Each column ranked once (ties averaged), then Pearson's r of the two rank columns by `np.corrcoef`: what
    `scipy.stats.spearmanr` computes for one pair of columns, to the last bit, without its per-call checks."""
    measured = np.asarray(measured, dtype=np.float64)  # (M, Q)
    predicted = np.asarray(predicted, dtype=np.float64)
    if predicted.ndim == 1:
        predicted = predicted[:, None]  # (M, 1): one prediction for all queries
    ranked_measured = stats.rankdata(measured, axis=0)  # (M, Q)
    ranked_predicted = stats.rankdata(predicted, axis=0)  # (M, Q) or (M, 1)
    varied_predicted = np.ptp(predicted, axis=0) > 0
    out = np.full(measured.shape[1], np.nan)
    for q in np.flatnonzero(np.ptp(measured, axis=0) > 0):
        column = q if predicted.shape[1] > 1 else 0
        if varied_predicted[column]:
            pair = np.column_stack((ranked_predicted[:, column], ranked_measured[:, q]))  # (M, 2)
            out[q] = np.corrcoef(pair, rowvar=False)[1, 0]
    return out


def lds(predicted: np.ndarray, measured: np.ndarray, seed: int = 0) -> dict[str, float | list[float] | int]:
    """{"lds", "ci", "queries", "subsets"}: the mean per-query ρ and its 95% bootstrap CI over subsets."""
    rho = per_query_rho(predicted, measured)
    value = float(np.nanmean(rho)) if np.isfinite(rho).any() else float("nan")
    rng = np.random.default_rng(seed)
    m = len(measured)
    draws = []
    for _ in range(RESAMPLES):
        pick = rng.integers(0, m, size=m)
        resampled = per_query_rho(np.asarray(predicted)[pick], np.asarray(measured)[pick])
        if np.isfinite(resampled).any():
            draws.append(float(np.nanmean(resampled)))
    low, high = (np.percentile(draws, [2.5, 97.5]) if draws else (np.nan, np.nan))
    return {"lds": value, "ci": [float(low), float(high)], "queries": int(np.isfinite(rho).sum()), "subsets": m}
