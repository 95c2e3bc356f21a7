"""How often the regression's 95% CI holds the true difference, by simulation: the interval conditional on how many
answers changed (the test's interval of the change among them, times the share as observed) against the one
`regression.statistics` prints (every product of that interval with the share's own Clopper-Pearson interval).

Each cell draws R eval sets of n prompts: a prompt's answer changes with probability δ, a changed answer is a broken
one with probability π, so the true difference is δ (1 − 2π). Printed as a markdown table: coverage and mean width
of each interval, and how often the gate (exact McNemar) passes.

    python -m benchmarks.studies.interval_coverage [--draws R] [--seed S]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from gradian.regression.statistics import clopper_pearson, mcnemar_counts

SIZES = (40, 80, 200)
CHANGED = (0.05, 0.15, 0.3)  # δ: the share of prompts whose answer changes
BROKEN = (0.5, 0.75, 0.95, 1.0)  # π: the share of the changed answers that break


def conditional(broken: int, fixed: int, n: int) -> tuple[float, float]:
    """The interval conditional on the discordant count: π's Clopper-Pearson interval mapped at the observed share."""
    low, high = clopper_pearson(broken, broken + fixed)
    share = (broken + fixed) / n
    return share * (1 - 2 * high), share * (1 - 2 * low)


def cell(n: int, changed: float, broken: float, draws: int, rng: np.random.Generator) -> dict:
    """Coverage, mean width and the gate's pass rate of both intervals over `draws` simulated eval sets."""
    truth = changed * (1 - 2 * broken)
    moved = rng.binomial(n, changed, draws)  # (R,)
    bad = rng.binomial(moved, broken)  # (R,)
    seen: dict[tuple[int, int], tuple] = {}
    held = {"conditional": 0, "product": 0}
    width = {"conditional": 0.0, "product": 0.0}
    passed = 0
    for m, b in zip(moved.tolist(), bad.tolist(), strict=True):
        if (m, b) not in seen:
            evidence = mcnemar_counts(b, m - b, n)
            seen[(m, b)] = (conditional(b, m - b, n), (evidence.ci_low, evidence.ci_high), evidence.p_value < 0.05)
        intervals, gate = dict(zip(held, seen[(m, b)][:2], strict=True)), seen[(m, b)][2]
        passed += gate
        for name, (low, high) in intervals.items():
            held[name] += low - 1e-12 <= truth <= high + 1e-12
            width[name] += high - low
    return {"n": n, "changed": changed, "broken": broken, "truth": truth, "gate": passed / draws,
            **{f"coverage {k}": v / draws for k, v in held.items()}, **{f"width {k}": v / draws for k, v in width.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--results", type=Path, help="also write every cell here (JSON)")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    cells = [cell(n, d, p, args.draws, rng) for n in SIZES for d in CHANGED for p in BROKEN]
    print("| n | δ changed | π broken | true difference | gate passes | coverage, conditional | coverage, product "
          "| width, conditional | width, product |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in cells:
        print(f"| {c['n']} | {c['changed']:g} | {c['broken']:g} | {100 * c['truth']:+.1f} | {c['gate']:.2f} | "
              f"{c['coverage conditional']:.3f} | {c['coverage product']:.3f} | {100 * c['width conditional']:.1f} | "
              f"{100 * c['width product']:.1f} |")
    if args.results:
        args.results.write_text(json.dumps(cells, indent=1) + "\n")


if __name__ == "__main__":
    main()
