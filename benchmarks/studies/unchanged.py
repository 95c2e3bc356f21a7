"""Did a change move any suite number? Compare the results two checkouts wrote on the same cached builds.

Run the suite with each checkout on one SUITE's builds (each into its own SUITE folder, `runs/` linked), then:

    python -m benchmarks.studies.unchanged BEFORE_CHECKOUT AFTER_CHECKOUT [--verify BEFORE.json AFTER.json]

Every value of `benchmarks/results/suite_quality.json` and `suite_quality_catalog.json` (and, with `--verify`, the
two `suite_verify.py --results` files) is compared, wall times left out; the count compared and every difference
go to benchmarks/results/house_unchanged.json and the terminal.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "results"
FILES = ("suite_quality.json", "suite_quality_catalog.json")


def ignored(key: str) -> bool:
    """Wall times, and what differs by where a run was cached (its work folder, whether a retrain was reused)."""
    return key in {"seconds", "epochs_worth", "fresh", "work", "reused"} or key.endswith("_s") or (
        key.endswith("seconds") and key != "epoch_seconds")


def differences(before: Any, after: Any, path: str = "") -> tuple[int, list[str]]:
    """(values compared, where they differ) over two JSON values, `ignored` keys left out."""
    if isinstance(before, dict) and isinstance(after, dict):
        count, diffs = 0, [f"{path}/{k}: only one side" for k in set(before) ^ set(after) if not ignored(k)]
        for key in sorted(set(before) & set(after), key=str):
            if not ignored(key):
                n, d = differences(before[key], after[key], f"{path}/{key}")
                count, diffs = count + n, diffs + d
        return count, diffs
    if isinstance(before, list) and isinstance(after, list):
        if len(before) != len(after):
            return 1, [f"{path}: {len(before)} against {len(after)} items"]
        count, diffs = 0, []
        for i, (x, y) in enumerate(zip(before, after, strict=True)):
            n, d = differences(x, y, f"{path}[{i}]")
            count, diffs = count + n, diffs + d
        return count, diffs
    same = before == after or (isinstance(before, float) and isinstance(after, float)
                                and math.isnan(before) and math.isnan(after))
    return 1, [] if same else [f"{path}: {before!r} against {after!r}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--verify", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--out", type=Path, default=RESULTS / "house_unchanged.json")
    args = parser.parse_args(argv)
    pairs = {name: (args.before / "benchmarks" / "results" / name, args.after / "benchmarks" / "results" / name)
             for name in FILES}
    if args.verify:
        pairs["suite_verify.json"] = tuple(args.verify)
    record = {}
    for name, (before, after) in pairs.items():
        count, diffs = differences(json.loads(before.read_text()), json.loads(after.read_text()))
        record[name] = {"compared": count, "differ": len(diffs), "differences": diffs}
        print(f"{name}: {count} values compared, {len(diffs)} differ", *diffs[:20], sep="\n  ")
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
