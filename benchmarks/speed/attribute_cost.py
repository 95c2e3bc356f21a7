"""The whole `gradian attribute` on a built scenario, in training epochs of the run it explains.

Runs `attribute` with its defaults into a fresh folder `--repeats` times (nothing cached between runs) and divides
each wall time by the run's own epoch: `train_runtime / epoch` from the run folder's `trainer_state.json`. Run it
with nothing else on the machine, one thread, to compare two versions of Gradian: alternate them (for another
checkout, put its `src` first on PYTHONPATH).

    OMP_NUM_THREADS=1 python -m benchmarks.speed.attribute_cost ~/.cache/gradian/smollm2-suite/runs/smol-kitchen-fence-seed0
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import gradian
from gradian import attribute
from gradian.scenarios import attribute_settings


def epoch_seconds(folder: Path) -> float:
    """The run's training seconds per epoch, from the last entry of its trainer_state.json."""
    last = json.loads((folder / "run" / "trainer_state.json").read_text())["log_history"][-1]
    return float(last["train_runtime"]) / float(last["epoch"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a built scenario folder (base/, run/, train.jsonl, eval.jsonl)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--rank", default=None, help="attribute's --rank (default: its own default)")
    args = parser.parse_args()
    epoch = epoch_seconds(args.folder)
    print(f"gradian from {Path(gradian.__file__).parent}; the run's epoch {epoch:.1f} s")
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as out:
            start = time.perf_counter()
            attribute(attribute_settings(args.folder, out, **({"rank": args.rank} if args.rank else {})))
            seconds = time.perf_counter() - start
        print(f"attribute {seconds:.1f} s = {seconds / epoch:.2f} epochs")


if __name__ == "__main__":
    main()
