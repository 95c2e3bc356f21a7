"""Gradient extraction over the tiny world in a process of its own, for the kill -9 fault test.

    python extract_worker.py ROWS SLOW STORE [STORE ...]

Extracts per-example features of ROWS training rows into each STORE in turn (resuming what is there),
sleeping SLOW seconds per batch so the test can kill it mid-way. Model, adapter and rows come from seeds:
every invocation computes the same features. GRADIAN_TEST_DEVICE=cuda runs it on the GPU (a device check).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: conftest and bad_inputs

from bad_inputs.workspace import WORDS, tiny_model, train_rows, write_jsonl  # noqa: E402
from gradian.data.examples import read_dataset  # noqa: E402
from gradian.data.render import render_dataset  # noqa: E402
from gradian.data.setup import TrainingSetup  # noqa: E402
from gradian.gradients.extract import GradientSettings, extract_train_features  # noqa: E402
from gradian.scenarios.tokenizer import build_tokenizer  # noqa: E402

SETTINGS = GradientSettings(proj_dim=32, batch_size=2, store_dtype="float32")


def lora_model(tokenizer):
    from peft import LoraConfig, get_peft_model

    model = tiny_model(tokenizer, seed=0)
    torch.manual_seed(1)
    return get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"],
                                            init_lora_weights=False))


def main(rows: int, slow: float, stores: list[Path]) -> None:
    torch.set_num_threads(1)
    tokenizer = build_tokenizer(WORDS)
    model = lora_model(tokenizer).to(os.environ.get("GRADIAN_TEST_DEVICE", "cpu"))
    dataset = write_jsonl(stores[0].parent / f"rows-{rows}.jsonl", train_rows(rows))
    rendered = render_dataset(read_dataset(dataset), tokenizer, TrainingSetup())

    def pace(batches):
        for batch in batches:
            yield batch
            time.sleep(slow)

    for store in stores:
        extract_train_features(model, rendered, store, settings=SETTINGS, progress=pace if slow else None)


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]), [Path(p) for p in sys.argv[3:]])
