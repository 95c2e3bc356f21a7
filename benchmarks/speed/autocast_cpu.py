"""What TRL's default bf16 autocast costs a LoRA training step on this CPU, as a ratio in one run.

TRL's `SFTConfig` turns `bf16` on by default, on a CPU too, and the trainer then runs every forward under
`torch.autocast("cpu", dtype=torch.bfloat16)`. On a CPU without bf16 units (no AVX512-BF16 or AMX) those matmuls
are emulated. The scenarios and the SmolLM2 story train with `bf16=False` for this (`scenarios.finetune.CPU_TRAINING`).

On random-weight Llamas from a config (`gradient_speed.SHAPES`), LoRA on every linear layer: a batch of 8 rows of
100 tokens, forward and backward of the loss, with autocast off and on, best of `--repeats` interleaved timings.

    python -m benchmarks.speed.autocast_cpu --models tiny smollm2-135m
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.speed import gradient_speed as speed


def step_seconds(model: torch.nn.Module, ids: torch.Tensor, autocast: bool) -> float:
    """One forward and backward of the LoRA model's loss on `ids` (8, 100), under bf16 autocast or not."""
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    for parameter in model.parameters():
        parameter.grad = None
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2-135m"], choices=list(speed.SHAPES))
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    cpuinfo = Path("/proc/cpuinfo")
    flags = " ".join(sorted({f for f in cpuinfo.read_text().split() if "bf16" in f or f.startswith("amx")})) \
        if cpuinfo.exists() else "unknown (no /proc/cpuinfo)"
    print(f"CPU bf16 flags: {flags or 'none'}; threads: {torch.get_num_threads()}\n")
    print("| model | float32 step, s | bf16 autocast step, s | ratio |")
    print("|---|---:|---:|---:|")
    for name in args.models:
        model = speed.build(name, "cpu", torch.float32, "all-linear").train()
        ids = torch.randint(3, speed.SHAPES[name]["vocab_size"], (8, 100), generator=torch.Generator().manual_seed(0))
        step_seconds(model, ids, False)  # warm-up
        plain, autocast = [], []
        for _ in range(args.repeats):
            plain.append(step_seconds(model, ids, False))
            autocast.append(step_seconds(model, ids, True))
        print(f"| {name} | {min(plain):.3f} | {min(autocast):.3f} | {min(autocast) / min(plain):.1f}x |", flush=True)


if __name__ == "__main__":
    main()
