"""Per-example gradients and the report's token harms with the output layer on the trained positions only, or on
every position: time and memory.

`lora_backward` projects only the positions whose next token is trained (`logits_to_keep`). A row with a long
prompt and a short answer (a system prompt, retrieved context, earlier turns under assistant-only loss) then skips
most of the vocabulary projection and most of the (B, T, V) logits. On a random-weight SmolLM2-shaped Llama
(`gradient_speed.SHAPES`), `--rows` rows of `--prompt` untrained and `--answer` trained tokens, one batch; each way
in a fresh process so its peak resident memory is its own. Best of `--repeats` times. The token harms'
forward-mode pass (`token_harm.token_harms`, the report's harmful token of each top row) is timed after, on the
same rows, every position meaning the logits sliced after the forward (the path of a model without
`logits_to_keep`).

    OMP_NUM_THREADS=1 python -m benchmarks.speed.kept_logits --prompt 512 --answer 32
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch


def run(way: str, rows: int, prompt: int, answer: int, repeats: int) -> dict[str, float]:
    from benchmarks.speed.gradient_speed import build
    from gradian.data.render import IGNORE, Rendered
    from gradian.gradients import extract
    from gradian.gradients.batches import collate
    from gradian.gradients.extract import example_gradients
    from gradian.gradients.hooks import lora_matrices
    from gradian.scores.token_harm import token_harms

    model = build("smollm2-135m", "cpu", torch.float32, "q_proj,k_proj,v_proj,o_proj")
    generator = torch.Generator().manual_seed(0)
    data = []
    for _ in range(rows):
        ids = torch.randint(3, 49152, (prompt + answer,), generator=generator).tolist()
        data.append((ids, [IGNORE] * prompt + ids[prompt:]))
    batch = collate(data, 0)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    best = float("inf")
    with example_gradients(model, every_logit=way == "every") as compute:
        for _ in range(repeats):
            start = time.perf_counter()
            compute(batch)
            best = min(best, time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    if way == "every":
        extract.takes_logits_to_keep = lambda model: False  # type: ignore[assignment]  # sliced after the forward
    rendered = [Rendered(str(i), ids, labels, len(ids), prompt) for i, (ids, labels) in enumerate(data)]
    direction = [torch.randn(m.shape, generator=generator) for m in lora_matrices(model)]
    harms = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        token_harms(model, rendered, direction)
        harms = min(harms, time.perf_counter() - start)
    return {"seconds": best, "peak_mib": peak / 1024, "added_mib": (peak - before) / 1024, "harm_seconds": harms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--answer", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--way", choices=("kept", "every"), help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.way:
        print(json.dumps(run(args.way, args.rows, args.prompt, args.answer, args.repeats)))
        return
    found = {}
    for way in ("every", "kept"):
        child = subprocess.run([sys.executable, "-m", "benchmarks.speed.kept_logits", "--way", way,
                                *(f"--{k}={v}" for k, v in vars(args).items() if k != "way")],
                               capture_output=True, text=True, check=True)
        found[way] = json.loads(child.stdout.strip().splitlines()[-1])
    every, kept = found["every"], found["kept"]
    print(f"{args.rows} rows of {args.prompt} + {args.answer} tokens: every position {every['seconds']:.2f} s, "
          f"{every['added_mib']:.0f} MiB added; trained positions {kept['seconds']:.2f} s, "
          f"{kept['added_mib']:.0f} MiB added; time {kept['seconds'] / every['seconds']:.2f}x, "
          f"memory {kept['added_mib'] / max(every['added_mib'], 1e-9):.2f}x; token harms {every['harm_seconds']:.2f} s "
          f"and {kept['harm_seconds']:.2f} s ({kept['harm_seconds'] / every['harm_seconds']:.2f}x)")


if __name__ == "__main__":
    main()
