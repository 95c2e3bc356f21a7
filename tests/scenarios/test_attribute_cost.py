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


def test_retimed_epoch_trains_one_epoch_of_the_recorded_recipe(tmp_path, monkeypatch):
    """sft_config.yaml's fields go back to train_lora as the build passed them: SFTConfig fields (one epoch), the LoRA
    settings, the collator and the seed; the epoch is the new run's train_runtime per epoch."""
    import yaml

    from benchmarks.speed import attribute_cost

    folder = tmp_path / "scenario"
    (folder / "run").mkdir(parents=True)
    (folder / "run" / "sft_config.yaml").write_text(yaml.safe_dump({
        "learning_rate": 0.001, "num_train_epochs": 2, "use_peft": True, "lora_r": 16, "lora_alpha": 32,
        "lora_dropout": 0.0, "lora_target_modules": "all-linear", "data_collator": "a.Collator"}))
    (folder / "train.jsonl").write_text('{"id": "a", "prompt": "p", "completion": "c"}\n')
    (folder / "truth.json").write_text('{"seed": 3}')
    seen = {}

    def train_lora(base, rows, run_dir, sft, lora, collator, seed):
        seen.update(base=base, rows=rows, sft=sft, lora=lora, collator=collator, seed=seed)
        run_dir.mkdir(parents=True)
        (run_dir / "trainer_state.json").write_text(json.dumps({"log_history": [{"train_runtime": 12.0, "epoch": 1.0}]}))

    monkeypatch.setattr(attribute_cost, "train_lora", train_lora)
    assert attribute_cost.retimed_epoch(folder) == 12.0
    assert seen["sft"] == {"learning_rate": 0.001, "num_train_epochs": 1}
    assert seen["lora"] == {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0, "target_modules": "all-linear"}
    assert (seen["collator"], seen["seed"], seen["base"]) == ("a.Collator", 3, folder / "base")
    assert seen["rows"] == [{"id": "a", "prompt": "p", "completion": "c"}]


def test_recorded_recipe_reads_back_what_the_build_wrote(tmp_path):
    from gradian.scenarios.finetune import _write_config, recorded_recipe

    sft = {"learning_rate": 0.001, "num_train_epochs": 2, "max_length": 256, "seed": 4, "output_dir": "x"}
    lora = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.05, "target_modules": ["q_proj", "v_proj"]}
    _write_config(tmp_path, sft, lora, "transformers.DataCollatorForLanguageModeling")
    assert recorded_recipe(tmp_path) == ({"learning_rate": 0.001, "num_train_epochs": 2, "max_length": 256}, lora,
                                         "transformers.DataCollatorForLanguageModeling")
