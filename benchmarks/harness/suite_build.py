"""Build the scenario suite's runs (every family of `gradian.scenarios.suite`, each seed) into one folder.

    python -m benchmarks.harness.suite_build --out /tmp/suite --seeds 0 1 [--split dev] [--family NAME ...] [--jobs N]

Resumable: a finished run is kept when today's code would make it again (`current`: its base's tokenizer, train
rows, eval rows and truth), and built afresh otherwise. Prints one line per run (the capability's
drop in points, overall and on the worst category) and writes `builds.json` beside the runs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from tokenizers import Tokenizer
from transformers import AutoTokenizer

from benchmarks.harness import jobs
from gradian.scenarios import build, built_before
from gradian.scenarios.base import base_model, tokenizer_text
from gradian.scenarios.family import make_family_data
from gradian.scenarios.suite import FAMILIES, families


def current(folder: Path, name: str, seed: int) -> bool:
    """`folder` is a finished build of family `name` at `seed` that today's code would make again: its base's
    tokenizer, its train rows, eval rows and truth all as they come out now. A build that predates a change to a
    recipe, a cause or a vocabulary is then rebuilt, never measured stale (a stale base once moved home-rename-volume's
    numbers)."""
    if not built_before(folder, name, seed):
        return False
    family = FAMILIES[name]
    saved = Tokenizer.from_file(str(folder / "base" / "tokenizer.json")).to_str()
    if saved != tokenizer_text(family.domain, family.tokenizer):
        return False
    made = make_family_data(family, seed, AutoTokenizer.from_pretrained(folder / "base"))
    found = [[json.loads(line) for line in (folder / "train.jsonl").read_text().splitlines()],
             [json.loads(line) for line in (folder / "eval.jsonl").read_text().splitlines()],
             json.loads((folder / "truth.json").read_text())]
    return found == json.loads(json.dumps(made))


def build_one(name: str, split: str, seed: int, out: Path) -> dict:
    """Build family `name` at `seed` into `out/runs/` unless built before; its line of builds.json."""
    folder = out / "runs" / f"{name}-seed{seed}"
    started = time.perf_counter()
    if not current(folder, name, seed):
        shutil.rmtree(folder, ignore_errors=True)
        build(name, folder, seed, cache_dir=out / "cache")
    measured = json.loads((folder / "measured.json").read_text())
    drop = measured["drop_points"]
    worst = max(drop["by_category"].items(), key=lambda item: item[1])
    return {"family": name, "split": split, "seed": seed, "folder": str(folder),
            "drop_overall": round(drop["overall"], 1), "worst_category": worst[0], "drop_worst": round(worst[1], 1),
            "ran_on": measured["finetuned"]["ran_on"], "seconds": round(time.perf_counter() - started, 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--split", choices=["dev", "test"], default=None)
    parser.add_argument("--family", nargs="*", default=None)
    parser.add_argument("--jobs", type=int, default=jobs.default_jobs(), help="runs built at once (default: CPUs)")
    args = parser.parse_args(argv)
    todo = [(f.name, f.split, seed, args.out) for f in families(args.split)
            if not args.family or f.name in args.family for seed in args.seeds]
    bases = sorted({(0, args.out / "cache", None, f.domain, f.tokenizer) for f in families(args.split)
                    if any(name == f.name for name, *_ in todo)})
    jobs.run_jobs(base_model, bases, args.jobs)  # first, so no two runs pretrain the same base at once
    rows = jobs.run_jobs(build_one, todo, args.jobs, done=lambda row: print(json.dumps(row), flush=True))
    (args.out / "builds.json").write_text(json.dumps(rows, indent=1) + "\n")

if __name__ == "__main__":
    main()
