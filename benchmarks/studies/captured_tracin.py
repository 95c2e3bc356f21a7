"""Captured TracIn against the final-adapter default, on the tiny suite's three gated dev families (seed 0).

Each family is built twice with the same seed: as the suite builds it, and with `GradianCallback(capture=True)` in
its trainer. The two adapters must be byte-equal (capturing must not change training). On the captured build,
`attribute` runs four ways into one folder (generations and stores reused): the final adapter (the default) and
`--checkpoints captured` (TracIn over the steps each row trained at, the run's own learning rates and Adam scaling),
each ranked combined (the default) and by the gradient alone. Culprit AUPRC against the planted rows, beside the
category oracle and random.

    python -m benchmarks.studies.captured_tracin [--work ~/.cache/gradian/captured-tracin] [--families ...]

Writes benchmarks/results/captured_tracin.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from gradian import GradianCallback, attribute
from gradian.report.rows import read_examples
from gradian.scenarios import attribute_settings, build, built_before
from gradian.scenarios.evaluate import auprc, oracle_auprc, planted, random_scores

RESULTS = Path(__file__).resolve().parents[1] / "results" / "captured_tracin.json"
FAMILIES = ("tickets-cut", "travel-cut-small", "kitchen-fence-spaced")  # the dev families tests/e2e gates
WAYS = {"final, combined": {}, "final, gradient": {"rank": "gradient"},
        "captured, combined": {"checkpoints": "captured"}, "captured, gradient": {"checkpoints": "captured",
                                                                                   "rank": "gradient"}}


def built(name: str, folder: Path, seed: int, **options) -> Path:
    if not built_before(folder, name, seed):
        build(name, folder, seed, **options)
    return folder


def measure(name: str, work: Path, seed: int) -> dict:
    plain = built(name, work / "plain" / f"{name}-seed{seed}", seed)
    captured = built(name, work / "captured" / f"{name}-seed{seed}", seed,
                     callbacks=[GradianCallback(capture=True, on_critical="warn", echo=lambda _: None)])
    adapter = Path("run") / "adapter_model.safetensors"
    same = (plain / adapter).read_bytes() == (captured / adapter).read_bytes()
    truth = json.loads((captured / "truth.json").read_text())
    out = work / "reports" / f"{name}-seed{seed}"
    row = {"family": name, "seed": seed, "adapters_equal": same,
           "steps": len(list((captured / "run" / "gradian_capture").glob("step-*")))}
    for way, options in WAYS.items():
        report = attribute(attribute_settings(captured, out, **options)).report
        rows = read_examples(out)
        positive = planted([r["id"] for r in rows], truth)
        row[way] = auprc(np.array([r["rank_score"] for r in rows]), positive)
        row[f"{way} verdict"] = report["verdict"]["kind"]
    ids = [r["id"] for r in rows]
    row["oracle"] = oracle_auprc(ids, truth)
    row["random"] = auprc(random_scores(len(ids), seed), positive)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path.home() / ".cache" / "gradian" / "captured-tracin")
    parser.add_argument("--families", nargs="+", default=list(FAMILIES))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows = []
    for name in args.families:
        rows.append(measure(name, args.work, args.seed))
        print(json.dumps(rows[-1]), flush=True)
        RESULTS.write_text(json.dumps(rows, indent=2) + "\n")
    print("| family (seed) | adapters equal | steps | " + " | ".join(WAYS) + " | category oracle | random |")
    print("|---|---|---|" + "---|" * len(WAYS) + "---|---|")
    for r in rows:
        print(f"| {r['family']} ({r['seed']}) | {'yes' if r['adapters_equal'] else 'no'} | {r['steps']} | "
              + " | ".join(f"{r[w]:.3f}" for w in WAYS) + f" | {r['oracle']:.3f} | {r['random']:.3f} |")


if __name__ == "__main__":
    main()
