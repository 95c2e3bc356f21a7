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


def test_the_stage_clock_times_each_stage_inside_and_puts_it_back(monkeypatch):
    import types

    from benchmarks.speed import attribute_cost

    calls: list[int] = []
    stage = types.ModuleType("stage")
    stage.step = lambda n: calls.append(n) or n  # type: ignore[attr-defined]
    original = stage.step  # type: ignore[attr-defined]
    monkeypatch.setattr(attribute_cost, "STAGES", {stage: ("step",)})
    with attribute_cost.stage_clock() as seconds:
        assert stage.step(1) == 1 and stage.step(2) == 2 and stage.step is not original  # type: ignore[attr-defined]
    assert calls == [1, 2] and set(seconds) == {"step"} and seconds["step"] >= 0
    assert stage.step is original  # type: ignore[attr-defined]
