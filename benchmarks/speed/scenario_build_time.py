"""Time to build each tiny scenario with the base cached, and the regression each one measured.

Prints a markdown table (for BENCHMARKS.md): seconds per scenario, base vs fine-tuned JSON validity
overall and on the affected category, and the share of generations that ran on to the token limit.

    python -m benchmarks.speed.scenario_build_time [--scenarios null truncated-cluster] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from gradian.scenarios import SCENARIOS, build
from gradian.scenarios.base import base_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=SCENARIOS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", type=Path, default=None, help="base cache folder (default: GRADIAN_CACHE)")
    args = parser.parse_args()
    start = time.perf_counter()
    base_model(0, args.cache)
    base_seconds = time.perf_counter() - start
    print(f"Base model ready in {base_seconds:.0f} s (0 when cached). CPU cores: {os.cpu_count()}.\n")
    print("| scenario | build s | validity base → tuned (overall) | affected category: base → tuned | "
          "ran on: base → tuned |")
    print("|---|---:|---|---|---|")
    with tempfile.TemporaryDirectory() as root:
        for name in args.scenarios:
            start = time.perf_counter()
            folder = build(name, Path(root) / name, args.seed, cache_dir=args.cache)
            print(_row(name, time.perf_counter() - start, json.loads((folder / "measured.json").read_text())),
                  flush=True)


def _row(name: str, seconds: float, measured: dict) -> str:
    base, tuned = measured["base"], measured["finetuned"]
    overall = f"{base['overall']['validity']:.0%} → {tuned['overall']['validity']:.0%}"
    affected = measured["affected_category"]
    if affected:
        b, t = base["by_category"][affected], tuned["by_category"][affected]
        category = f"{affected}: {b['valid']}/{b['total']} → {t['valid']}/{t['total']}"
    else:
        category = "—"
    ran_on = f"{base['overall']['ran_on_rate']:.0%} → {tuned['overall']['ran_on_rate']:.0%}"
    return f"| {name} | {seconds:.0f} | {overall} | {category} | {ran_on} |"


if __name__ == "__main__":
    main()
