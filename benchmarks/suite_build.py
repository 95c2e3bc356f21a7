"""Build the scenario suite's runs (every family of `gradian.scenarios.suite`, each seed) into one folder.

    python benchmarks/suite_build.py --out /tmp/suite --seeds 0 1 [--split dev] [--family NAME ...]

Resumable: a run whose truth.json and measured.json exist is kept. Prints one line per run (the capability's
drop in points, overall and on the worst category) and writes `builds.json` beside the runs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from gradian.scenarios import build, built_before
from gradian.scenarios.suite import families


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--split", choices=["dev", "test"], default=None)
    parser.add_argument("--family", nargs="*", default=None)
    args = parser.parse_args(argv)
    cache, rows = args.out / "cache", []
    for family in families(args.split):
        if args.family and family.name not in args.family:
            continue
        for seed in args.seeds:
            folder = args.out / "runs" / f"{family.name}-seed{seed}"
            started = time.perf_counter()
            if not built_before(folder, family.name, seed):
                shutil.rmtree(folder, ignore_errors=True)
                build(family.name, folder, seed, cache_dir=cache)
            measured = json.loads((folder / "measured.json").read_text())
            drop = measured["drop_points"]
            worst = max(drop["by_category"].items(), key=lambda item: item[1])
            row = {"family": family.name, "split": family.split, "seed": seed, "folder": str(folder),
                   "drop_overall": round(drop["overall"], 1), "worst_category": worst[0],
                   "drop_worst": round(worst[1], 1), "ran_on": measured["finetuned"]["ran_on"],
                   "seconds": round(time.perf_counter() - started, 1)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    (args.out / "builds.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
