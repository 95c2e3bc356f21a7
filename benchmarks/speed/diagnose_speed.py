"""Speed of `gradian diagnose` on many rows vs the floor: one batched fast-tokenizer call over the same rows.

Writes N synthetic support-ticket rows (prompt/completion, JSON answers, a few planted faults), a base folder
(the scenario world's word-level tokenizer + a Llama config), then times, in one process:

- raw: `tokenizer([prompt + completion + eos, ...])`, one batched call: the cost of seeing every token once;
- diagnose: `gradian.audit.diagnose(...)` end to end (read JSONL, load tokenizer, render, every check),
  with the time of its stages and of each check.

Prints a markdown table of CPU seconds (process time, so a busy machine does not skew the ratio); the ratio
diagnose / raw is the number to watch (goal: within 2x).

    python -m benchmarks.speed.diagnose_speed --rows 100000
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from transformers import LlamaConfig

from gradian.audit.context import AuditContext
from gradian.audit.registry import load_built_in
from gradian.data.base_model import load_config, load_tokenizer, resolve_base_model
from gradian.data.examples import read_dataset
from gradian.data.render import render_dataset
from gradian.data.run_folder import read_run
from gradian.scenarios.tokenizer import build_tokenizer

WORDS = ("refund order invoice currency amount shipping account please my the is was late hello help need a for "
         "customer package address delivery payment card charge twice status tracking number email").split()
INTENTS = ["order", "refund", "invoice", "shipping", "account"]


def synthetic_rows(count: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        intent = INTENTS[i % len(INTENTS)]
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(12, 40)))
        number = rng.randint(1000, 99999)
        completion = json.dumps({"intent": intent, "id": number, "note": " ".join(rng.sample(WORDS, 6))})
        if i % 50 == 0:
            completion = completion[: len(completion) // 2]  # a planted cut
        rows.append({"prompt": f"{intent} {number}: {words}", "completion": " " + completion})
    return rows


def build_inputs(folder: Path, count: int) -> tuple[Path, Path]:
    tokenizer = build_tokenizer(WORDS + INTENTS + ["intent", "id", "note"])
    base = folder / "base"
    tokenizer.save_pretrained(base)
    LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id).save_pretrained(base)
    dataset = folder / "train.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in synthetic_rows(count)), encoding="utf-8")
    return base, dataset


def timed(function, *args, **kwargs):
    """(value, CPU seconds of this process, all threads). CPU time, not wall time: the ratio must not depend on
    what else the machine runs (the tokenizer's own thread pool is counted on both sides)."""
    start = time.process_time()
    value = function(*args, **kwargs)
    return value, time.process_time() - start


def measure(base: Path, dataset: Path) -> dict[str, float]:
    """Stage by stage, exactly what `diagnose` does, so the stages add up to the total."""
    times: dict[str, float] = {}
    examples, times["read JSONL"] = timed(read_dataset, dataset)
    ref = resolve_base_model(base)
    (tokenizer, config), times["load tokenizer + config"] = timed(lambda: (load_tokenizer(ref), load_config(ref)))
    run, _ = timed(read_run, None)
    rendered, times["render (as TRL tokenizes)"] = timed(render_dataset, examples, tokenizer, run.setup)
    ctx = AuditContext(examples, rendered, tokenizer, run.setup, run, None, ref, config)
    for name, check in load_built_in().items():
        _, times[f"check {name}"] = timed(check, ctx)
    texts = [e.fields["prompt"] + e.fields["completion"] + tokenizer.eos_token for e in examples]
    times["raw"] = min(timed(tokenizer, texts)[1] for _ in range(2))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        base, dataset = build_inputs(Path(folder), args.rows)
        times = measure(base, dataset)
    raw = times.pop("raw")
    total = sum(times.values())
    checks = sum(value for key, value in times.items() if key.startswith("check "))
    print(f"## diagnose speed: {args.rows} rows\n")
    print("| stage | CPU seconds | × raw tokenization |")
    print("|---|---:|---:|")
    print(f"| raw batched fast-tokenizer call (floor) | {raw:.2f} | 1.00 |")
    for key in ("read JSONL", "load tokenizer + config", "render (as TRL tokenizes)"):
        print(f"| {key} | {times[key]:.2f} | {times[key] / raw:.2f} |")
    print(f"| all checks | {checks:.2f} | {checks / raw:.2f} |")
    print(f"| **diagnose total** | **{total:.2f}** | **{total / raw:.2f}** |")
    slowest = sorted(((v, k) for k, v in times.items() if k.startswith("check ")), reverse=True)[:4]
    print("\nslowest checks: " + ", ".join(f"{k[6:]} {v:.2f}s" for v, k in slowest))


if __name__ == "__main__":
    main()
