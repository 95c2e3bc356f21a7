"""Peak memory of the report's per-token harm (`scores.token_harm`) beside the per-example gradient extraction.

    python -m benchmarks.speed.token_harm_memory FOLDER [--rows 50] [--batch-size 16]

FOLDER is a scenario or suite run (`base/`, `run/`, `train.jsonl`). Each measurement runs in a fresh process (peak
RSS only grows): load the fine-tuned model, then either extract the projected per-example gradients of the first
`--rows` training rows (what every attribution does over all rows) or compute their per-token harms along one
query direction (what the report does for its 50 top rows: a double backward under the math SDPA kernel). Printed:
each process's peak RSS above the model's, in MB, and the ratio. Memory of one process on one machine, not a timed
assertion.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KB


def measure(folder: Path, what: str, rows: int, batch_size: int) -> dict[str, float]:
    import torch

    from gradian.audit import diagnose
    from gradian.gradients.extract import GradientSettings, extract_train_features
    from gradian.gradients.hooks import lora_matrices
    from gradian.regression.loading import load_models
    from gradian.scores.token_harm import token_harms

    torch.set_num_threads(1)
    audit = diagnose(folder / "train.jsonl", base_model=str(folder / "base"), run=str(folder / "run"))
    model, _ = load_models(audit.base_ref, folder / "run", device="cpu")
    chosen = [audit.rendered[i] for i in range(min(rows, len(audit.rendered)))]
    loaded = peak_mb()
    if what == "extract":
        with tempfile.TemporaryDirectory() as store:
            extract_train_features(model, chosen, store, settings=GradientSettings(batch_size=batch_size))
    else:
        direction = [torch.randn_like(m.module.weight) for m in lora_matrices(model)]  # any v: memory only
        token_harms(model, chosen, direction, batch_size=batch_size)
    return {"model_mb": loaded, "peak_above_model_mb": peak_mb() - loaded}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--rows", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--only", choices=["extract", "token-harm"], help="one measurement, in this process")
    args = parser.parse_args(argv)
    if args.only:
        print(json.dumps(measure(args.folder, args.only, args.rows, args.batch_size)))
        return 0
    got = {}
    for what in ("extract", "token-harm"):
        out = subprocess.run([sys.executable, __file__, str(args.folder), "--rows", str(args.rows), "--batch-size",
                              str(args.batch_size), "--only", what], check=True, capture_output=True, text=True)
        got[what] = json.loads(out.stdout.strip().splitlines()[-1])
    ratio = got["token-harm"]["peak_above_model_mb"] / max(got["extract"]["peak_above_model_mb"], 1e-9)
    print(f"| rows | batch | model loaded (MB) | extraction peak above it (MB) | token harm peak above it (MB) | ratio |\n"
          f"|---|---|---|---|---|---|\n| {args.rows} | {args.batch_size} | {got['extract']['model_mb']:.0f} | "
          f"{got['extract']['peak_above_model_mb']:.0f} | {got['token-harm']['peak_above_model_mb']:.0f} | {ratio:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
