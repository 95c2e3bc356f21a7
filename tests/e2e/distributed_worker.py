"""Extraction and scoring under torch.distributed, for tests/e2e/test_distributed.py.

    python -m torch.distributed.run --nproc-per-node 2 tests/e2e/distributed_worker.py ROWS SLOW STORE

Every process extracts its files of STORE (rows and model from seeds, as tests/bad_inputs/extract_worker.py),
with each row's harmful positions along a seeded direction and its RepSim to seeded query states, sleeping SLOW seconds per batch so a test can kill
one mid-way; after a barrier rank 0 scores seeded queries into STORE/../scores.npy and writes the harms to
STORE/../harms.npy and STORE/../repsim.npy. Without a launcher it is one process.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: bad_inputs

from bad_inputs.extract_worker import lora_model  # noqa: E402
from bad_inputs.workspace import WORDS, train_rows, write_jsonl  # noqa: E402
from gradian.data.examples import read_dataset  # noqa: E402
from gradian.data.render import render_dataset  # noqa: E402
from gradian.data.setup import TrainingSetup  # noqa: E402
from gradian.gradients.distributed import join, leave  # noqa: E402
from gradian.gradients.extract import GradientSettings, extract_train_features  # noqa: E402
from gradian.gradients.hooks import lora_matrices  # noqa: E402
from gradian.gradients.sides import position_harms_of, repsim_of  # noqa: E402
from gradian.gradients.store import FeatureStore  # noqa: E402
from gradian.scenarios.tokenizer import build_tokenizer  # noqa: E402
from gradian.scores.scoring import effects_file, publish, score_features  # noqa: E402

SETTINGS = GradientSettings(proj_dim=32, batch_size=2, store_dtype="float16", shard_rows=5)


def main(rows: int, slow: float, store: Path) -> None:
    torch.set_num_threads(1)
    ranks = join()
    (store.parent / f"pid-{ranks.rank}").write_text(str(os.getpid()))
    tokenizer = build_tokenizer(WORDS)
    model = lora_model(tokenizer)
    dataset = write_jsonl(store.parent / f"rows-{rows}-{ranks.rank}.jsonl", train_rows(rows))
    rendered = render_dataset(read_dataset(dataset), tokenizer, TrainingSetup())

    def pace(batches):
        for batch in batches:
            yield batch
            time.sleep(slow)

    generator = torch.Generator().manual_seed(4)
    direction = [torch.randn(m.shape, generator=generator) for m in lora_matrices(model)]
    states = np.random.default_rng(5).normal(size=(3, model.config.hidden_size))  # (Q, d)
    extract_train_features(model, rendered, store, settings=SETTINGS, shard=ranks.shard,
                           progress=pace if slow else None, direction=direction, representations=states)
    ranks.barrier()
    if ranks.is_main:
        features = FeatureStore(store)
        queries = np.random.default_rng(0).normal(size=(3, features.dim))
        effects = effects_file(store.parent / "scores.npy", 3, features.n_rows)
        score_features(features, queries, unit_norm_train=True, out=effects, chunk_rows=7)
        publish(effects, store.parent / "scores.npy")
        np.save(store.parent / "harms.npy", position_harms_of(features, direction))
        np.save(store.parent / "repsim.npy", repsim_of(features, states))
    leave(ranks)


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]), Path(sys.argv[3]))
