"""How often verify's recovery CI holds the true recovery, by simulation: the paired bootstrap verify printed before
against the posterior interval `verify.measure.recovery` prints now.

Each cell draws R eval sets of n prompts, each a (base, fine-tuned, after) triple of pass/fail scores: the base
passes with probability 0.85; the fine-tune breaks a passing answer with probability β and fixes a failing one with
probability 0.05; the retrain fixes a broken answer with probability ρ, breaks a right one with probability ν and
fixes an answer both models failed with probability 0.02. With `--mean-of 2` the retrain's score is the mean of two
such retrains (as verify averages its random controls). The true recovery is E[after − fine-tuned] / E[base −
fine-tuned]. Only eval sets whose regression passes the gate (exact McNemar, p < 0.05) are counted, as verify
explains only a regression `attribute` found. Printed as a markdown table: coverage and mean width of each interval.

    python -m benchmarks.studies.recovery_coverage [--draws R] [--seed S] [--results R.json]
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import numpy as np
from scipy import stats

from gradian.regression.statistics import N_RESAMPLES, mcnemar_counts
from gradian.verify.measure import PRIOR, ratio_interval

SIZES = (40, 80, 200)
BROKEN = (0.1, 0.25)  # β
FIXES = (0.0, 0.5, 0.9, 1.0)  # ρ
BREAKS = (0.0, 0.03)  # ν
BASE, FT_FIXES, BOTH_FAILED_FIXED = 0.85, 0.05, 0.02


def truth(broken: float, fixes: float, breaks: float) -> float:
    """E[after − fine-tuned] / E[base − fine-tuned] under the cell's model."""
    lost = BASE * broken - (1 - BASE) * FT_FIXES
    right = BASE * (1 - broken) + (1 - BASE) * FT_FIXES  # P(fine-tuned passes)
    gained = BASE * broken * fixes + (1 - BASE) * (1 - FT_FIXES) * BOTH_FAILED_FIXED - right * breaks
    return gained / lost


def draw(n: int, broken: float, fixes: float, breaks: float, mean_of: int,
         rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One eval set: base, fine-tuned and after scores, each (n,)."""
    base = (rng.random(n) < BASE).astype(float)
    finetuned = np.where(base == 1, rng.random(n) >= broken, rng.random(n) < FT_FIXES).astype(float)
    after = np.zeros(n)
    for _ in range(mean_of):
        u = rng.random(n)
        fixed_if_failing = np.where(base == 1, u < fixes, u < BOTH_FAILED_FIXED)
        after += np.where(finetuned == 1, u >= breaks, fixed_if_failing) / mean_of
    return base, finetuned, after


def bootstrap(base: np.ndarray, finetuned: np.ndarray, after: np.ndarray, seed: int = 0) -> tuple[float, float]:
    """The paired bootstrap verify printed before (BCa, the percentile interval where BCa is not finite)."""
    gained, lost = after - finetuned, base - finetuned
    value = gained.mean() / lost.mean()
    if np.all(gained == gained[0]) and np.all(lost == lost[0]):
        return value, value

    def ratio(g: np.ndarray, l: np.ndarray, axis: int = -1) -> np.ndarray:  # noqa: E741
        total = l.mean(axis=axis)
        return np.where(total > 0, g.mean(axis=axis) / np.where(total > 0, total, 1.0), 0.0)

    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = stats.bootstrap((gained, lost), ratio, paired=True, vectorized=True, method=method,
                                     n_resamples=N_RESAMPLES, rng=np.random.default_rng(seed))
        low, high = result.confidence_interval
        if np.isfinite(low) and np.isfinite(high):
            return float(low), float(high)
    return value, value


def cell(n: int, broken: float, fixes: float, breaks: float, draws: int, rng: np.random.Generator,
         mean_of: int = 1, prior: float = PRIOR) -> dict:
    """Coverage and mean width of both intervals over the `draws` eval sets that pass the gate."""
    true = truth(broken, fixes, breaks)
    held = {"bootstrap": 0, "posterior": 0}
    width = {"bootstrap": 0.0, "posterior": 0.0}
    counted = 0
    seen: dict[tuple, tuple] = {}
    for _ in range(draws):
        base, finetuned, after = draw(n, broken, fixes, breaks, mean_of, rng)
        if mcnemar_counts(int(np.sum(base > finetuned)), int(np.sum(base < finetuned)), n).p_value >= 0.05:
            continue
        counted += 1
        key = tuple(np.unique(np.c_[base, finetuned, after], axis=0, return_counts=True)[1].tolist()) + tuple(
            np.unique(np.c_[base, finetuned, after], axis=0).ravel().tolist())
        if key not in seen:
            seen[key] = (bootstrap(base, finetuned, after),
                         ratio_interval(after - finetuned, base - finetuned, np.random.default_rng(0), prior=prior))
        for name, (low, high) in zip(held, seen[key], strict=True):
            held[name] += low - 1e-12 <= true <= high + 1e-12
            width[name] += high - low
    return {"n": n, "broken": broken, "fixes": fixes, "breaks": breaks, "mean_of": mean_of, "prior": prior, "truth": true,
            "counted": counted, **{f"coverage {k}": v / max(counted, 1) for k, v in held.items()},
            **{f"width {k}": v / max(counted, 1) for k, v in width.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mean-of", type=int, default=1, help="the retrain's score is the mean of this many")
    parser.add_argument("--prior", type=float, default=PRIOR, help="each corner's weight in the posterior's prior")
    parser.add_argument("--results", type=Path, help="also write every cell here (JSON)")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    cells = []
    print("| n | β broken | ρ fixed | ν newly failing | true recovery | eval sets past the gate | coverage, bootstrap "
          "| coverage, posterior | width, bootstrap | width, posterior |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in SIZES:
        for b in BROKEN:
            for f in FIXES:
                for v in BREAKS:
                    c = cell(n, b, f, v, args.draws, rng, args.mean_of, args.prior)
                    cells.append(c)
                    print(f"| {n} | {b:g} | {f:g} | {v:g} | {100 * c['truth']:.0f}% | {c['counted']} | "
                          f"{c['coverage bootstrap']:.3f} | {c['coverage posterior']:.3f} | "
                          f"{100 * c['width bootstrap']:.0f} | {100 * c['width posterior']:.0f} |", flush=True)
    if args.results:
        args.results.write_text(json.dumps(cells, indent=1) + "\n")


if __name__ == "__main__":
    main()
