"""The suite builder keeps a finished run only while today's code would make it again: a change to a family's recipe,
its rows or its base's tokenizer makes it rebuild the run instead of measuring a stale one."""

from __future__ import annotations

import json

from benchmarks.harness.suite_build import current
from gradian.scenarios import base
from gradian.scenarios.builder import write_jsonl
from gradian.scenarios.causes import CAUSES, PlantedCause
from gradian.scenarios.family import make_family_data
from gradian.scenarios.suite import FAMILIES

NAME = "home-cut-half"  # a fused-tokenizer family: its vocabulary takes the causes' words


def finished_build(folder, seed: int = 0):
    """A run folder as `build` leaves it, less the weights `current` does not read."""
    tokenizer = base.make_tokenizer(FAMILIES[NAME].domain, FAMILIES[NAME].tokenizer)
    tokenizer.save_pretrained(folder / "base")
    train, eval_rows, truth = make_family_data(FAMILIES[NAME], seed, tokenizer)
    write_jsonl(folder / "train.jsonl", train)
    write_jsonl(folder / "eval.jsonl", eval_rows)
    (folder / "truth.json").write_text(json.dumps(truth))
    (folder / "measured.json").write_text("{}")
    return folder


def test_a_build_of_todays_code_is_kept(tmp_path):
    assert current(finished_build(tmp_path / "run"), NAME, 0)
    assert not current(tmp_path / "run", NAME, 1)  # another seed's run


def test_a_build_whose_recipe_or_rows_changed_since_is_rebuilt(tmp_path):
    folder = finished_build(tmp_path / "run")
    truth = json.loads((folder / "truth.json").read_text())
    (folder / "truth.json").write_text(json.dumps({**truth, "recipe": {**truth["recipe"], "epochs": 1}}))
    assert not current(folder, NAME, 0)
    folder = finished_build(tmp_path / "rows")
    (folder / "train.jsonl").write_text("".join((folder / "train.jsonl").read_text().splitlines(True)[1:]))
    assert not current(folder, NAME, 0)


def test_a_build_on_a_base_with_another_vocabulary_is_rebuilt(tmp_path, monkeypatch):
    folder = finished_build(tmp_path / "run")
    added = PlantedCause("added-later", "json_formatting:keys", lambda answer, key, rng: "", ("zqword",))
    monkeypatch.setitem(CAUSES, added.name, added)
    assert not current(folder, NAME, 0)
