"""The real-model suite's builder keeps a run only while it has the rows its family draws today."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from benchmarks.harness.smollm2_build import current
from gradian.scenarios import base
from gradian.scenarios.smollm2_suite import SMOL_FAMILIES, family_rows


def _write(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


@pytest.mark.parametrize("name", ["smol-travel-drop-seat", "smol-kitchen-fence"])  # messages rows; prompt rows
def test_a_run_whose_rows_are_not_those_its_family_draws_now_is_built_again(tmp_path, name):
    seed, smol = 0, SMOL_FAMILIES[name]
    folder = tmp_path / f"{name}-seed{seed}"
    folder.mkdir()
    (folder / "base").symlink_to(base.base_model(0, tmp_path / "bases", None, smol.family.domain, "bpe"),
                                 target_is_directory=True)
    train, eval_rows, _ = family_rows(smol, seed, AutoTokenizer.from_pretrained(folder / "base"))
    assert (smol.rows == "prompt") == ("prompt" in train[0])
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
    _write(folder / "train.jsonl", train[1:] + train[:1])  # as many rows, drawn in another order
    assert not current(folder, name, seed)
    _write(folder / "train.jsonl", train)
    assert current(folder, name, seed)
