"""The real-model suite's builder keeps a run only while it has the rows its family draws today."""

from __future__ import annotations

import json

from transformers import AutoTokenizer

from benchmarks.harness.smollm2_build import current
from gradian.scenarios import base
from gradian.scenarios.family import make_family_data
from gradian.scenarios.smollm2_suite import SMOL_FAMILIES


def _write(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_a_run_with_fewer_eval_prompts_than_its_family_draws_now_is_built_again(tmp_path):
    name, seed = "smol-travel-drop-seat", 0
    folder = tmp_path / f"{name}-seed{seed}"
    folder.mkdir()
    (folder / "base").symlink_to(base.base_model(0, tmp_path / "bases", None, "travel", "bpe"),
                                 target_is_directory=True)
    smol = SMOL_FAMILIES[name]
    train, eval_rows, _ = make_family_data(smol.family, seed, AutoTokenizer.from_pretrained(folder / "base"),
                                           smol.train_rows, smol.eval_per_category)
    _write(folder / "train.jsonl", train)
    _write(folder / "eval.jsonl", eval_rows)
    assert not current(folder, name, seed)  # unfinished: no truth.json or measured.json yet
    (folder / "truth.json").write_text(json.dumps({"scenario": name, "seed": seed}))
    (folder / "measured.json").write_text("{}")
    assert current(folder, name, seed)
    _write(folder / "eval.jsonl", eval_rows[: len(eval_rows) // 3])  # built before the family took more prompts
    assert not current(folder, name, seed)
    _write(folder / "eval.jsonl", eval_rows)
    _write(folder / "train.jsonl", train[:-1])
    assert not current(folder, name, seed)
