"""bergson, the plainest peer, as a baseline row: its own code on the same run, rows and failing answers.

bergson (EleutherAI, `pip install bergson`) needs transformers, peft and torch versions of its own, so it runs in a
venv of its own, never in Gradian's:

    python -m venv .venv-bergson && .venv-bergson/bin/pip install torch==2.13.0 \
        transformers peft accelerate datasets jaxtyping torchopt petname simple-parsing natsort ml_dtypes pyarrow \
        pyyaml scipy jinja2 && .venv-bergson/bin/pip install --no-deps bergson==2.5.1

(`--no-deps`: its declared torchvision, torchaudio and bitsandbytes are not imported by the paths used here, and
their wheels do not install beside torch 2.13 on a CPU.) `GRADIAN_BERGSON_PYTHON` names another interpreter.

What runs there (`python -m benchmarks.harness.bergson_baseline WORK`), as the issue's peer measured it: full
per-example gradients of the adapter's LoRA weights (no projection, float32, per-document summed loss), the failing
eval answers' gradients averaged into one query (`aggregation="mean"`), each training row scored by its dot product
with it (`score="individual"`). The rows are Gradian's rows as trained (`input_ids`, `labels`), so the two differ
only in how they rank. Each step is bergson's own `build` and `score_dataset`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
VERSION = "2.5.1"


def interpreter() -> Path | None:
    """The bergson venv's Python, or None where there is none (the tables then show no bergson row)."""
    found = Path(os.environ.get("GRADIAN_BERGSON_PYTHON") or ROOT / ".venv-bergson" / "bin" / "python")
    return found if found.exists() else None


def bergson_scores(adapter: Path, tokenizer: Path, context: int, train: list[tuple[list[int], list[int]]],
                   queries: list[tuple[list[int], list[int]]], work: Path) -> tuple[np.ndarray, float] | None:
    """(N,) bergson's score of each training row (higher: its gradient agrees more with the failing answers'
    mean gradient, so the row pushed the model towards them) and its wall seconds; None without bergson.
    `train` and `queries` are (input_ids, labels) pairs, labels -100 where no loss falls; `tokenizer` a folder
    with the run's tokenizer, `context` the model's longest sequence (bergson's token batch is no longer)."""
    from datasets import Dataset

    python = interpreter()
    if python is None:
        return None
    scores = work / "scores.npy"
    if not scores.exists():
        work.mkdir(parents=True, exist_ok=True)
        for name, rows in (("train", train), ("query", queries)):
            Dataset.from_dict({"input_ids": [list(ids) for ids, _ in rows],
                               "labels": [list(labels) for _, labels in rows]}).save_to_disk(str(work / name))
        (work / "spec.json").write_text(json.dumps({"adapter": str(adapter), "tokenizer": str(tokenizer),
                                                    "token_batch_size": min(2048, context)}))
        started = time.perf_counter()
        env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
        subprocess.run([str(python), "-m", "benchmarks.harness.bergson_baseline", str(work)], check=True, env=env,
                       cwd=ROOT, stdout=subprocess.DEVNULL)
        (work / "seconds.json").write_text(json.dumps({"seconds": time.perf_counter() - started}))
    return np.load(scores), json.loads((work / "seconds.json").read_text())["seconds"]


def _run(work: Path) -> None:
    """In bergson's venv: its build of the mean query gradient, then its scoring of every training row."""
    import shutil

    from bergson.build import build
    from bergson.config.config import DataConfig, IndexConfig, PreprocessConfig, ScoreConfig
    from bergson.data import load_scores
    from bergson.score.score import score_dataset

    spec = json.loads((work / "spec.json").read_text())

    def index(run: str, data: str) -> Any:
        shutil.rmtree(work / run, ignore_errors=True)
        return IndexConfig(run_path=str(work / run), model=spec["adapter"], tokenizer=spec["tokenizer"],
                           precision="fp32", projection_dim=0, token_batch_size=spec["token_batch_size"],
                           data=DataConfig(dataset=str(work / data)))

    build(index("query-index", "query"), PreprocessConfig(aggregation="mean"))
    score_dataset(index("scores-run", "train"), ScoreConfig(query_path=str(work / "query-index"), score="individual"),
                  PreprocessConfig())
    store = load_scores(work / "scores-run").mmap  # (N,) records (score_0, written_0): the one mean query
    assert store["written_0"].all(), "bergson left rows unscored"
    np.save(work / "scores.npy", np.asarray(store["score_0"], dtype=np.float64))


if __name__ == "__main__":
    import bergson

    assert bergson.__version__ == VERSION, f"bergson {bergson.__version__}, expected {VERSION}"
    _run(Path(sys.argv[1]))
