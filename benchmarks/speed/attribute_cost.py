"""The whole `gradian attribute` on a built scenario, in training epochs of the run it explains.

Runs `attribute` with its defaults into a fresh folder `--repeats` times (nothing cached between runs) and divides
each wall time by the run's own epoch: `train_runtime / epoch` from the run folder's `trainer_state.json`. Run it
with nothing else on the machine, one thread, to compare two versions of Gradian: alternate them (for another
checkout, put its `src` first on PYTHONPATH).

    OMP_NUM_THREADS=1 python -m benchmarks.speed.attribute_cost ~/.cache/gradian/smollm2-suite/runs/smol-kitchen-fence-seed0 \
        [more run folders] [--stages] [--results R.json]

`--copies K` explains the same run as if its training file held each row K times (ids made distinct, the text
unchanged): the costs that do not grow with the rows (the answers to the eval prompts, the query, the energy pass's
sample, the gradient check, the report's top rows) are then spread over K times the rows. Its epoch is the run's
epoch times K, an estimate: an epoch of K times the rows takes K times the steps of the same shapes.

`--retime` trains one epoch of the run's own recipe (its sft_config.yaml, rows, base and seed) in this process before
explaining it, and divides by that epoch instead of the build's: the build may have trained beside other jobs, and a
ratio is only a ratio when both sides were timed in one run on a quiet machine.

`--stages` also prints each stage's seconds inside the run (`stage_clock`: the pipeline's stages, the extraction's
energy pass, gradient check and long pass, and the report's harm tokens), to see where the time goes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gradian
import gradian.pipeline
import gradian.stages.extraction
import gradian.stages.reporting
from gradian import attribute
from gradian.scenarios import attribute_settings
from gradian.scenarios.finetune import recorded_recipe, train_lora

STAGES = {gradian.pipeline: ("run_audit", "load", "regression", "queries", "extract", "score", "rank", "cluster",
                             "report"),
          gradian.stages.extraction: ("share_budget", "check_extraction", "extract_train_features"),
          gradian.stages.reporting: ("harm_tokens",)}


def epoch_seconds(folder: Path) -> float:
    """The run's training seconds per epoch, from the last entry of its trainer_state.json."""
    last = json.loads((folder / "run" / "trainer_state.json").read_text())["log_history"][-1]
    return float(last["train_runtime"]) / float(last["epoch"])


def retimed_epoch(folder: Path) -> float:
    """Seconds of one epoch of the run's own recipe, trained now: the rows, base, seed and sft_config.yaml of the
    scenario folder (`finetune.recorded_recipe`: its LoRA settings and collator as the build passed them)."""
    sft, lora, collator = recorded_recipe(folder / "run")
    rows = [json.loads(line) for line in (folder / "train.jsonl").read_text().splitlines() if line.strip()]
    truth = folder / "truth.json"
    seed = int(json.loads(truth.read_text()).get("seed", 0)) if truth.exists() else 0
    with tempfile.TemporaryDirectory() as work:
        train_lora(folder / "base", rows, Path(work) / "run", {**sft, "num_train_epochs": 1}, lora, collator, seed)
        return epoch_seconds(Path(work))


def copied(folder: Path, copies: int, into: Path) -> Path:
    """A scenario folder like `folder` whose train.jsonl holds each row `copies` times (ids `<id>~<k>`); the other
    files are links to the original's."""
    into.mkdir()
    for path in folder.iterdir():
        if path.name != "train.jsonl":
            (into / path.name).symlink_to(path.resolve())
    rows = [json.loads(line) for line in (folder / "train.jsonl").read_text().splitlines() if line.strip()]
    with (into / "train.jsonl").open("w") as out:
        for k in range(copies):
            for row in rows:
                out.write(json.dumps({**row, "id": f"{row['id']}~{k}" if k else row["id"]}) + "\n")
    return into


@contextmanager
def stage_clock() -> Iterator[dict[str, float]]:
    """Seconds spent in each of `STAGES` while inside (summed over calls), each wrapped where its caller finds it."""
    seconds: dict[str, float] = {}

    def timed(name: str, function: Callable) -> Callable:
        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start
        return run

    originals = [(module, name, getattr(module, name)) for module, names in STAGES.items() for name in names]
    for module, name, function in originals:
        setattr(module, name, timed(name, function))
    try:
        yield seconds
    finally:
        for module, name, function in originals:
            setattr(module, name, function)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", type=Path, nargs="+",
                        help="built scenario folders (base/, run/, train.jsonl, eval.jsonl), explained one at a time")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--rank", default=None, help="attribute's --rank (default: its own default)")
    parser.add_argument("--copies", type=int, default=1, help="each training row this many times (module docstring)")
    parser.add_argument("--retime", action="store_true", help="train one epoch of the run's recipe here first and "
                        "divide by it (module docstring)")
    parser.add_argument("--stages", action="store_true", help="each stage's seconds too")
    parser.add_argument("--results", type=Path, help="also write every run's seconds here (JSON), as they come")
    args = parser.parse_args()
    print(f"gradian from {Path(gradian.__file__).parent}")
    records = []
    for folder in args.folders:
        built = epoch_seconds(folder)
        epoch = (retimed_epoch(folder) if args.retime else built) * args.copies
        print(f"{folder.name}: the run's epoch {epoch:.1f} s" + (f" (its own times {args.copies})" if args.copies > 1
                                                                 else "") +
              (f", retimed here (the build's: {built:.1f} s)" if args.retime else ""), flush=True)
        with tempfile.TemporaryDirectory() as work:
            explained = copied(folder, args.copies, Path(work) / "run") if args.copies > 1 else folder
            for _ in range(args.repeats):
                out = Path(work) / "out"
                with stage_clock() as stages:
                    start = time.perf_counter()
                    attribute(attribute_settings(explained, out, **({"rank": args.rank} if args.rank else {})))
                    seconds = time.perf_counter() - start
                shutil.rmtree(out)
                print(f"  attribute {seconds:.1f} s = {seconds / epoch:.2f} epochs", flush=True)
                if args.stages:
                    print("  " + ", ".join(f"{name} {value:.1f} s" for name, value in stages.items()), flush=True)
                records.append({"run": folder.name, "copies": args.copies, "epoch_s": epoch,
                                "build_epoch_s": built * args.copies, "retimed": args.retime, "attribute_s": seconds,
                                "epochs": seconds / epoch, "stages": dict(stages)})
                if args.results:
                    args.results.write_text(json.dumps(records, indent=1) + "\n")


if __name__ == "__main__":
    main()
