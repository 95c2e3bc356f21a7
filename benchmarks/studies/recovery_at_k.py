"""Each ranking's top k rows at zero weight, on runs `benchmarks/harness/suite_quality.py` ranked: the counterfactual
beside the planted-row AUPRC.

Planted rows are a scenario's claim. Where two rankings differ on them, the question that decides is what removing
each one's top rows does to the capability. Per WORK (a folder suite_quality left: `ingredients.{json,npz}`,
`attribute/`), k = the planted rows' count; each method's top k (`suite_quality.methods_of`, ties in dataset order)
is retrained at zero weight with the run's own recipe and seed (`suite_verify.report_retrain`), as are the planted
rows and `--draws` random draws of k rows (the band a removal of that size moves by chance). A set two methods share
is retrained once. Each retrain is measured on the report's eval prompts: its recovery with the paired bootstrap CI,
and per prompt how many of the answers the fine-tune broke it fixes and how many right answers now fail.

    python -m benchmarks.studies.recovery_at_k WORK [WORK ...] [--methods NAME ...] [--draws 0 1]
        [--jobs N] [--results R.json] [--markdown R.md]

Resumable: retrains are cached under WORK/attribute/verify/.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import jobs
from benchmarks.harness.counterfactual import slug
from benchmarks.harness.suite_quality import methods_of
from benchmarks.harness.suite_verify import CAUSAL, report_retrain
from gradian.data.examples import read_dataset
from gradian.files import atomic_write
from gradian.verify.sets import random_set, top_k

METHODS = ("gradient (default)", "activation", "gradient + activation")
BASELINES = ("length control", "category oracle", "TF-IDF (max)", "RepSim (max)")  # the default is compared with


def run(work: Path, methods: list[str], draws: list[int]) -> dict[str, Any]:
    meta = json.loads((work / "ingredients.json").read_text())
    arrays = dict(np.load(work / "ingredients.npz"))
    truth = json.loads((Path(meta["folder"]) / "truth.json").read_text())
    ids, planted = meta["ids"], set(truth["culprit_ids"])
    k = len(planted)
    every = methods_of(meta, arrays, truth)
    sets: dict[str, list[str]] = {name: top_k(every[name][0], ids, k) for name in methods}
    sets["planted rows"] = sorted(planted)
    rows = read_dataset(Path(meta["folder"]) / "train.jsonl")
    for draw in draws:
        sets[f"random {draw}"] = random_set(rows, k, [11, draw])
    done: dict[frozenset[str], dict[str, Any]] = {}
    out: dict[str, Any] = {"work": str(work), "family": truth.get("family"), "split": truth.get("split"),
                           "seed": truth["seed"], "k": k, "n_rows": len(ids), "retrains": {}}
    for name, chosen in sets.items():
        key = frozenset(chosen)
        if key not in done:
            done[key] = report_retrain(work / "attribute", f"top{k}-{slug(name)}", zero_ids=key)
        out["retrains"][name] = {**done[key], "planted_in_top_k": len(key & planted)}
        got = out["retrains"][name]
        print(f"{work.name} · {name}: {got['planted_in_top_k']}/{k} planted, recovery {got['recovery']:.2f} "
              f"{got['recovery_ci']}, answers {got['answers']}", flush=True)
    return out


def markdown(records: list[dict[str, Any]]) -> str:
    """Per run, each retrain's recovery (the planted rows in its top k); per family, the mean over the seeds whose
    planted rows are the cause (recover at least `CAUSAL` at zero weight), the default against the best baseline."""
    names = list(dict.fromkeys(name for r in records for name in r["retrains"]))
    lines = ["| run | split | k | " + " | ".join(names) + " |", "|---|---|---|" + "---|" * len(names)]
    for r in records:
        cells = [f"{r['retrains'][n]['recovery']:.2f} ({r['retrains'][n]['planted_in_top_k']})"
                 if n in r["retrains"] else "n/a" for n in names]
        lines.append(f"| {Path(r['work']).name} | {r['split']} | {r['k']} | " + " | ".join(cells) + " |")
    families: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if r["retrains"]["planted rows"]["recovery"] >= CAUSAL:
            families.setdefault(r["family"], []).append(r)
    lines += ["", f"Families over their seeds whose planted rows recover at least {CAUSAL:.0%}:", "",
              "| family | split | seeds | " + " | ".join(names) + " | default at or above every baseline |",
              "|---|---|---|" + "---|" * (len(names) + 1)]
    for family, runs in sorted(families.items(), key=lambda item: (item[1][0]["split"], item[0])):
        mean = {n: float(np.mean([r["retrains"][n]["recovery"] for r in runs])) for n in names
                if all(n in r["retrains"] for r in runs)}
        best = max((mean[n] for n in BASELINES if n in mean), default=float("nan"))
        verdict = "yes" if mean.get("gradient (default)", float("nan")) >= best else "no"
        lines.append(f"| {family} | {runs[0]['split']} | {len(runs)} | " + " | ".join(
            f"{mean[n]:.2f}" if n in mean else "n/a" for n in names) + f" | {verdict} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("works", nargs="+", type=Path)
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--draws", type=int, nargs="*", default=[0, 1])
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, one thread each")
    parser.add_argument("--results", type=Path, default=None)
    parser.add_argument("--markdown", type=Path, default=None)
    args = parser.parse_args()
    records = jobs.run_jobs(run, [(work, args.methods, args.draws) for work in args.works], args.jobs)
    if args.results:
        records = jobs.merge_records(args.results, records, "work")
    if args.markdown:
        atomic_write(args.markdown, markdown(records))


if __name__ == "__main__":
    main()
