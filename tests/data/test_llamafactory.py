"""LLaMA-Factory runs are never read as TRL: its config (passed or in the run folder), its training_args.bin and
the files it writes into output_dir are refused with one sentence; its dataset_info.json given as a dataset is
named as the registry it is, with the data files it lists."""

from __future__ import annotations

import json
import pickle
import sys
import types

import pytest
import yaml

from bad_inputs.corpus import diagnose_args
from bad_inputs.fixtures import assert_one_line_error, error_line, gradian, workspace  # noqa: F401
from gradian.data.run_folder import read_run
from gradian.errors import InputError

# examples/train_lora/llama3_lora_sft.yaml as LLaMA-Factory ships it (trimmed)
LLAMAFACTORY_SFT = {
    "model_name_or_path": "meta-llama/Meta-Llama-3-8B-Instruct", "stage": "sft", "do_train": True,
    "finetuning_type": "lora", "lora_rank": 8, "lora_target": "all", "dataset": "identity,alpaca_en_demo",
    "template": "llama3", "cutoff_len": 2048, "max_samples": 1000, "output_dir": "saves/llama3-8b/lora/sft",
    "per_device_train_batch_size": 1, "gradient_accumulation_steps": 8, "learning_rate": 1.0e-4,
    "num_train_epochs": 3.0,
}
REFUSAL = ("; Gradian does not yet prepare rows as LLaMA-Factory does (its template, cutoff_len and "
           "train_on_prompt), so it would audit rows the run never saw: add GradianCallback to the run to audit the "
           "rows it trains on, or train with TRL's SFTTrainer or axolotl to attribute it.")
REGISTRY = {
    "identity": {"file_name": "identity.json"},
    "alpaca_en_demo": {"file_name": "alpaca_en_demo.json"},
    "tickets": {"file_name": "tickets.jsonl", "formatting": "sharegpt",
                "columns": {"messages": "conversations"}, "tags": {"role_tag": "from", "content_tag": "value"}},
}


def test_llamafactory_config_passed_as_config_is_refused(workspace, gradian, tmp_path):  # noqa: F811
    config = tmp_path / "llama3_lora_sft.yaml"
    config.write_text(yaml.safe_dump(LLAMAFACTORY_SFT), encoding="utf-8")
    result = gradian(diagnose_args(workspace, workspace.dataset, "--run", workspace.run, "--config", config))
    assert_one_line_error(result, "llama3_lora_sft.yaml")
    assert error_line(result) == f"Error: {config}: this is a LLaMA-Factory config{REFUSAL}"


@pytest.mark.parametrize("keys", [{"stage": "sft", "template": "qwen", "dataset": "mine"}, {"cutoff_len": 1024},
                                  {"finetuning_type": "lora"}, {"train_on_prompt": True}],
                         ids=["stage-template", "cutoff_len", "finetuning_type", "train_on_prompt"])
def test_llamafactory_config_in_the_run_folder_is_refused(keys, workspace, tmp_path):  # noqa: F811
    run = tmp_path / "run"
    run.mkdir()
    (run / "adapter_config.json").write_text(json.dumps({"r": 2}), encoding="utf-8")
    (run / "config.yaml").write_text(yaml.safe_dump(keys), encoding="utf-8")
    with pytest.raises(InputError, match="this is a LLaMA-Factory config; Gradian does not yet prepare rows"):
        read_run(run)


def fake_run(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoint-4").mkdir(parents=True)
    for folder in (run, run / "checkpoint-4"):
        (folder / "adapter_config.json").write_text(json.dumps({"r": 2}), encoding="utf-8")
    return run


def test_web_ui_training_args_yaml_is_refused(tmp_path):
    run = fake_run(tmp_path)
    (run / "training_args.yaml").write_text(yaml.safe_dump(LLAMAFACTORY_SFT), encoding="utf-8")
    with pytest.raises(InputError) as refused:
        read_run(run / "checkpoint-4")  # a checkpoint folder: LLaMA-Factory's files sit above it
    assert str(refused.value) == (f"{run.resolve() / 'training_args.yaml'}: LLaMA-Factory wrote this file, so this "
                                  f"is a LLaMA-Factory run{REFUSAL}")


def test_its_trainer_log_is_recognised(tmp_path):
    run = fake_run(tmp_path)
    line = {"current_steps": 1, "total_steps": 4, "loss": 1.2, "learning_rate": 1e-4, "epoch": 0.25}
    (run / "trainer_log.jsonl").write_text(json.dumps(line) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match="trainer_log.jsonl: LLaMA-Factory wrote this file"):
        read_run(run)


def test_its_training_args_bin_is_recognised(tmp_path, monkeypatch):
    """LLaMA-Factory's trainer pickles its own TrainingArguments (read without importing anything)."""
    module = types.ModuleType("llamafactory.hparams.training_args")
    holder = type("TrainingArguments", (), {"__module__": module.__name__})
    module.TrainingArguments = holder
    for name in ("llamafactory", "llamafactory.hparams"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    args = holder()
    args.__dict__.update({"learning_rate": 1e-4, "output_dir": "saves/x"})
    run = fake_run(tmp_path)
    (run / "training_args.bin").write_bytes(pickle.dumps(args))
    with pytest.raises(InputError, match="training_args.bin holds LLaMA-Factory's TrainingArguments"):
        read_run(run)


def test_a_trl_run_is_still_read(tmp_path):
    run = fake_run(tmp_path)
    (run / "sft_config.yaml").write_text(yaml.safe_dump({"max_length": 300, "dataset_text_field": "text"}))
    (run / "trainer_log.jsonl").write_text('{"step": 1, "loss": 1.0}\n')  # not LLaMA-Factory's log
    assert read_run(run).setup.max_length == 300


@pytest.mark.parametrize("indent", [2, None], ids=["pretty", "one-line"])
@pytest.mark.parametrize("flag", ["--dataset", "--eval-dataset"])
def test_dataset_info_json_is_named_as_the_registry(indent, flag, workspace, gradian, tmp_path):  # noqa: F811
    registry = tmp_path / "dataset_info.json"
    registry.write_text(json.dumps(REGISTRY, indent=indent) + "\n", encoding="utf-8")
    args = diagnose_args(workspace, registry) if flag == "--dataset" else diagnose_args(
        workspace, workspace.dataset, "--eval-dataset", registry)
    result = gradian(args)
    assert_one_line_error(result, "dataset_info.json")
    assert error_line(result) == (
        f"Error: {registry}: this is LLaMA-Factory's dataset registry (dataset_info.json), not rows; pass the data "
        "file it lists for the run's dataset instead (it lists identity.json, alpaca_en_demo.json, tickets.jsonl, "
        "file names relative to its folder).")
