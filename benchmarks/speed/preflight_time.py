"""Time of GradianCallback's preflight inside a real TRL `SFTTrainer`, measured where it runs (`on_train_begin`).

Two runs on the tiny scenario model, one process: the 12-row run the tests train, and a 2,000-row pre-tokenized
dataset (input_ids + completion_mask, a third of the rows cut at 40 tokens with EOS after the cut). Each trains
one step with `GradianCallback(on_critical="warn")`; the number is `callback.result.seconds` (wall time of the
whole preflight: every row through the run's collator, the rows rebuilt, every check), beside the wall time of
that one training step for scale. Prints a markdown table and writes benchmarks/results/preflight_time.json.

    PYTHONPATH=src:tests python -m benchmarks.speed.preflight_time
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from callback_runs import pretokenized, sft_trainer, ticket, tickets
from conftest import WORDS
from gradian import GradianCallback
from gradian.scenarios.tokenizer import build_tokenizer

RESULTS = Path(__file__).resolve().parents[1] / "results" / "preflight_time.json"


def timed_run(rows: list[dict], **settings: object) -> dict[str, float]:
    callback = GradianCallback(on_critical="warn", echo=lambda _: None)
    with tempfile.TemporaryDirectory() as out:
        trainer = sft_trainer(Path(out), rows, callbacks=[callback], max_steps=1, **settings)
        start = time.perf_counter()
        trainer.train()
        total = time.perf_counter() - start
    assert callback.result is not None
    return {"rows": len(callback.result.rows.rendered), "preflight_s": round(callback.result.seconds, 3),
            "train_call_s": round(total, 3), "findings": [f.check for f in callback.result.findings]}


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # no options: --help only
    tokenizer = build_tokenizer(WORDS)
    big = pretokenized([ticket(i, long=i % 3 == 0) for i in range(2000)], tokenizer, cut=40, keep_text=False)
    results = {"tiny_run": timed_run(tickets()), "tokenized_2000": timed_run(big, max_length=256)}
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print("| run | rows | preflight (s) | train() with one step (s) |\n|---|---|---|---|")
    for name, row in results.items():
        print(f"| {name} | {row['rows']} | {row['preflight_s']} | {row['train_call_s']} |")


if __name__ == "__main__":
    main()
