"""How often a cluster's harm-share interval holds the share it estimates, measured on ranked suite runs by subsampling
their queries: the one `attribute` prints (`clusters.summary.harm_share_ci`, the percentile bootstrap's lower bound
over the failing eval queries, to 1) and the two-sided intervals tried before it.

A run's Q failing queries stand for the population; the share over all Q is the truth. For each of R subsamples of q
queries (without replacement) the CI is computed from those q alone, as `attribute` would with q failing answers.
The group is the run's cluster that holds the most harm. Printed per run and q: two-sided coverage, how often the
lower end stays at or below the truth, and how often the data-cluster gate's CI condition (lower end ≥ 1.5 × size
share) passes on a subsample, beside whether it passes on all Q.

    python -m benchmarks.studies.harm_share_coverage QUALITY/<run> [...] [--sizes 5 10 20] [--draws R]
        [--method printed|percentile|basic-high|BCa]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from scipy.stats import bootstrap

from gradian.clusters.summary import harm_share_ci, harm_shares
from gradian.scores.scoring import total_effect
from gradian.verdict.thresholds import MIN_CI_LOW_OVER_SIZE

CONFIDENCE = 0.95  # the two-sided intervals tried


def run_groups(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """(Q, N) effects and (1, N) membership of the cluster holding the most harm."""
    effects = np.load(folder / "attribute" / "scores.npy")
    clusters = [json.loads(line)["cluster"] for line in (folder / "attribute" / "examples.jsonl").open()]
    labels = np.array([-1 if c is None else int(c) for c in clusters])
    ids = sorted(set(labels.tolist()) - {-1})
    membership = np.array([labels == c for c in ids])  # (C, N)
    top = int(np.argmax(harm_shares(total_effect(effects), membership)))
    return effects, membership[top:top + 1]


def interval(effects: np.ndarray, group: np.ndarray, resamples: int, seed: int, method: str) -> tuple[float, float]:
    """The group's harm-share interval: the one `attribute` prints (printed: the percentile lower bound, to 1), the
    two-sided percentile interval it printed before (percentile), that interval's lower end with the basic bootstrap's
    upper end (basic-high), or the same resampling with BCa's ends."""
    if method == "printed":
        low, high = harm_share_ci(effects, group, n_resamples=resamples, seed=seed)
        return float(low[0]), float(high[0])

    def share(queries: np.ndarray, axis: int = -1) -> np.ndarray:  # queries (..., q) resampled query indices
        flat = queries.reshape(-1, queries.shape[-1])  # (B, q)
        means = effects[flat].mean(axis=1)  # (B, N)
        return harm_shares(means, group)[:, 0].reshape(queries.shape[:-1])

    result = bootstrap((np.arange(len(effects)),), share, vectorized=True, n_resamples=resamples, batch=200,
                       method="BCa" if method == "BCa" else "percentile", confidence_level=CONFIDENCE,
                       rng=np.random.default_rng(seed))
    point = float(harm_shares(effects.mean(0), group)[0])
    low, high = min(float(result.confidence_interval.low), point), max(float(result.confidence_interval.high), point)
    if method == "basic-high":  # the basic bootstrap's upper end: 2 share − q_low
        return low, min(1.0, max(high, 2 * point - low))
    return low, high


def study(folder: Path, sizes: list[int], draws: int, rng: np.random.Generator, resamples: int,
          method: str = "printed") -> list[dict]:
    effects, group = run_groups(folder)
    n_queries = len(effects)
    truth = float(harm_shares(total_effect(effects), group)[0])
    size_share = float(group.mean())
    gate_all = interval(effects, group, resamples, 0, method)[0] >= MIN_CI_LOW_OVER_SIZE * size_share
    out = []
    for q in sizes:
        if q >= n_queries:
            continue
        held = lower_held = passes = 0
        for _ in range(draws):
            chosen = rng.choice(n_queries, q, replace=False)
            low, high = interval(effects[chosen], group, resamples, int(rng.integers(1 << 30)), method)
            held += low <= truth <= high
            lower_held += low <= truth
            passes += low >= MIN_CI_LOW_OVER_SIZE * size_share
        out.append({"run": folder.name, "method": method, "queries": n_queries, "q": q, "truth": truth, "size_share": size_share,
                    "gate_on_all": gate_all, "coverage": held / draws, "lower_end_held": lower_held / draws,
                    "gate_passes": passes / draws})
        print(f"| {folder.name} | {n_queries} | {q} | {truth:.3f} | {size_share:.3f} | {'pass' if gate_all else 'fail'} "
              f"| {held / draws:.2f} | {lower_held / draws:.2f} | {passes / draws:.2f} |", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--sizes", nargs="+", type=int, default=[5, 10, 20])
    parser.add_argument("--draws", type=int, default=100)
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--method", choices=["printed", "percentile", "basic-high", "BCa"], default="printed")
    parser.add_argument("--results", type=Path)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    print("| run | queries | q | harm share (all) | size share | gate on all | coverage | lower end ≤ truth | gate passes |")
    print("|---|---|---|---|---|---|---|---|---|")
    cells = [c for run in args.runs for c in study(run, args.sizes, args.draws, rng, args.resamples, args.method)]
    if args.results:
        args.results.write_text(json.dumps(cells, indent=1) + "\n")


if __name__ == "__main__":
    main()
