"""Build the real-model suite's runs (every family of `gradian.scenarios.smollm2_suite`, each seed) into one folder.

    python -m benchmarks.harness.smollm2_build [--out ~/.cache/gradian/smollm2-suite] [--seeds 0 1] [--split dev] [--jobs N]

Needs SmolLM2-135M-Instruct converted once (`python -m benchmarks.studies.build_smollm2 --convert-only`). Resumable: a run
whose truth.json and measured.json exist, with the train and eval rows its family draws today, is kept; the
stage-one bases are cached under `--out`/cache. Builds dev before test and seed 0 before seed 1, one thread a job.
Prints one line per run and writes `builds.json`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from transformers import AutoTokenizer

from benchmarks.harness import jobs
from gradian.scenarios import built_before
from gradian.scenarios.base import cache_root
from gradian.scenarios.smollm2_suite import SMOL_FAMILIES, build_smollm2_family, family_rows, stage_one_base

DEFAULT_OUT = Path.home() / ".cache" / "gradian" / "smollm2-suite"


def build_one(name: str, split: str, seed: int, out: Path) -> dict:
    """Build family `name` at `seed` into `out/runs/` unless built before; its line of builds.json."""
    folder = out / "runs" / f"{name}-seed{seed}"
    started = time.perf_counter()
    if not current(folder, name, seed):
        shutil.rmtree(folder, ignore_errors=True)
        build_smollm2_family(name, folder, seed, root=out / "cache", progress=lambda m: print(m, flush=True))
    measured = json.loads((folder / "measured.json").read_text())
    state = json.loads((folder / "run" / "trainer_state.json").read_text())
    train_seconds = next(e["train_runtime"] for e in state["log_history"] if "train_runtime" in e)
    drop = measured["drop_points"]
    worst = max(drop["by_category"].items(), key=lambda item: item[1])
    return {"family": name, "split": split, "seed": seed, "folder": str(folder),
            "drop_overall": round(drop["overall"], 1), "worst_category": worst[0], "drop_worst": round(worst[1], 1),
            "ran_on": measured["finetuned"]["ran_on"], "train_seconds": round(train_seconds, 1),
            "seconds": round(time.perf_counter() - started, 1)}


def current(folder: Path, name: str, seed: int) -> bool:
    """`folder` is a finished build of family `name` at `seed` with the rows the family draws now: the same train and
    eval rows, row for row (a family rebuilt with more eval prompts, another size or other rows is built again)."""
    if not built_before(folder, name, seed):
        return False
    train, eval_rows, _ = family_rows(SMOL_FAMILIES[name], seed, AutoTokenizer.from_pretrained(folder / "base"))
    return (_rows(folder / "train.jsonl"), _rows(folder / "eval.jsonl")) == (train, eval_rows)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--split", choices=["dev", "test"], default=None)
    parser.add_argument("--family", nargs="*", default=None)
    parser.add_argument("--jobs", type=int, default=jobs.default_jobs(), help="runs built at once (default: CPUs)")
    args = parser.parse_args(argv)
    (args.out / "cache").mkdir(parents=True, exist_ok=True)
    source = cache_root() / "smollm2-135m-instruct"  # converted once; linked so the cache has one copy
    if not (args.out / "cache" / source.name).exists():
        (args.out / "cache" / source.name).symlink_to(source, target_is_directory=True)
    todo = [(f.name, f.split, seed, args.out) for split in ("dev", "test") if args.split in (None, split)
            for seed in args.seeds for f in SMOL_FAMILIES.values()
            if f.split == split and (not args.family or f.name in args.family)]
    # the stage-one bases first, so no two runs train the same one at once
    jobs.run_jobs(stage_one_base, [(seed, args.out / "cache", print) for seed in args.seeds], args.jobs)
    rows = jobs.run_jobs(build_one, todo, args.jobs, done=lambda row: print(json.dumps(row), flush=True))
    (args.out / "builds.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
