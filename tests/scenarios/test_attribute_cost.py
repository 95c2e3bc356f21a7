"""The cost benchmark's scaled run: each training row K times, ids distinct, every other file the original's."""

from __future__ import annotations

import json

from benchmarks.speed.attribute_cost import copied


def test_copies_repeat_every_row_with_distinct_ids_and_link_the_rest(tmp_path):
    source = tmp_path / "run-folder"
    (source / "run").mkdir(parents=True)
    (source / "run" / "trainer_state.json").write_text("{}")
    (source / "eval.jsonl").write_text('{"id": "e1"}\n')
    rows = [{"id": "a", "prompt": "p1", "completion": "c1"}, {"id": "b", "prompt": "p2", "completion": "c2"}]
    (source / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    folder = copied(source, 3, tmp_path / "scaled")
    written = [json.loads(line) for line in (folder / "train.jsonl").read_text().splitlines()]
    assert [row["id"] for row in written] == ["a", "b", "a~1", "b~1", "a~2", "b~2"]
    assert [(row["prompt"], row["completion"]) for row in written] == [(r["prompt"], r["completion"]) for r in rows] * 3
    assert (folder / "run").resolve() == (source / "run").resolve() and (folder / "eval.jsonl").is_symlink()
    assert (source / "train.jsonl").read_text().count("\n") == 2  # the original is untouched
