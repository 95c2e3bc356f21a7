"""Rows dropped from the file, named or at random: the control `gradian verify` lacks for its `without-culprits-dropped`.

verify's random controls remove rows at zero weight (the run's batches kept); its dropped retrain drops the named
rows from the file, which reshuffles every batch after the first dropped row. This study retrains the same way with
the report's named rows dropped, or with N random clean rows (not planted, `truth.json`) dropped, one seeded draw each,
and measures the recovery on the report's eval prompts.

    python -m benchmarks.studies.dropped_rows REPORT_DIR N [--named] [--draws 0 1 2]

Writes REPORT_DIR/dropped-rows-N.json (its retrains under REPORT_DIR/verify/) and prints one line per retrain.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from benchmarks.harness.suite_verify import report_retrain
from gradian.data.examples import read_dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("n", type=int, help="random clean rows to drop per draw")
    parser.add_argument("--named", action="store_true", help="also drop the verdict's named rows")
    parser.add_argument("--draws", type=int, nargs="*", default=[0, 1, 2])
    args = parser.parse_args()
    report = json.loads((args.report / "report.json").read_text())
    used, named = report["settings"], report["verdict"]["culprit_ids"]
    truth = json.loads((Path(used["dataset"]).parent / "truth.json").read_text())
    rows = read_dataset(used["dataset"])
    clean = sorted(e.id for e in rows if e.id not in set(truth["culprit_ids"]))
    sets = ([("dropped-named", set(named))] if args.named else []) + [
        (f"dropped-random-{args.n}-{draw}", set(np.random.default_rng(draw).choice(clean, args.n, replace=False)))
        for draw in args.draws]
    result = {}
    for name, drop in sets:
        got = report_retrain(args.report, name, [e for e in rows if e.id not in drop])
        result[name] = {"dropped": len(drop), "recovery": got["recovery"], "ci": got["recovery_ci"],
                        "wall_s": got["wall_s"]}
        print(name, json.dumps(result[name]), flush=True)
    (args.report / f"dropped-rows-{args.n}.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
