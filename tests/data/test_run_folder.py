"""Run folders and training configs: read what the trainer left, never run code from training_args.bin."""

from __future__ import annotations

import json
import os
import pickle

import pytest
import torch
import yaml
from datasets import Dataset
from peft import LoraConfig
from trl import SFTConfig, SFTTrainer

from conftest import make_tiny_model
from gradian.data.run_folder import read_run
from gradian.data.training_args import read_training_args
from gradian.errors import InputError


class Hostile:
    """Pickles to `os.system("touch <marker>")`: executing the pickle would create the file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class HostileEval:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (eval, (f"open({str(self.marker)!r}, 'w').write('x')",))


@pytest.mark.parametrize("payload", [Hostile, HostileEval])
@pytest.mark.parametrize("as_torch_zip", [False, True])
def test_hostile_training_args_never_run(tmp_path, payload, as_torch_zip):
    marker = tmp_path / "pwned"
    path = tmp_path / "training_args.bin"
    evil = {"learning_rate": 1e-4, "attack": payload(marker)}
    if as_torch_zip:
        torch.save(evil, path)
    else:
        path.write_bytes(pickle.dumps(evil))
    fields = read_training_args(path)
    assert not marker.exists()
    assert fields["learning_rate"] == 1e-4
    assert isinstance(fields["attack"], str)  # inert data: the callable was never imported nor called


def test_training_args_of_a_real_sft_config(tmp_path):
    args = SFTConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, max_length=77, learning_rate=3e-4,
                     eval_strategy="steps")
    torch.save(args, tmp_path / "training_args.bin")
    fields = read_training_args(tmp_path / "training_args.bin")
    assert fields["max_length"] == 77 and fields["learning_rate"] == 3e-4
    assert fields["eval_strategy"] == "steps"  # an enum member becomes its value
    assert fields["__class__"].endswith("SFTConfig")


def test_garbage_training_args_is_reported_not_raised(tmp_path):
    run = _fake_run(tmp_path)
    (run / "checkpoint-4" / "training_args.bin").write_bytes(b"\x80\x04not a pickle")
    info = read_run(run)
    assert info.training_args == {} and "training_args.bin" in info.unreadable[0]


def _fake_run(tmp_path, log_history=None):
    run = tmp_path / "run"
    for step in (2, 4, 10):
        checkpoint = run / f"checkpoint-{step}"
        checkpoint.mkdir(parents=True)
        (checkpoint / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16, "step": step}))
        (checkpoint / "adapter_model.safetensors").write_bytes(b"")
        state = {"global_step": step, "num_train_epochs": 3, "log_history": log_history or [{"loss": 1.0, "step": 1}]}
        (checkpoint / "trainer_state.json").write_text(json.dumps(state))
    (run / "checkpoint-10" / "optimizer.pt").write_bytes(b"")
    return run


def test_checkpoints_sorted_by_step_and_newest_used(tmp_path):
    info = read_run(_fake_run(tmp_path))
    assert [c.name for c in info.checkpoints] == ["checkpoint-2", "checkpoint-4", "checkpoint-10"]
    assert info.adapter_dir.name == "checkpoint-10" and info.adapter_config["step"] == 10
    assert info.optimizer_path.name == "optimizer.pt" and info.optimizer_path.parent.name == "checkpoint-10"
    assert info.setup.num_train_epochs == 3.0
    assert "max_length" in info.setup.assumed and info.setup.max_length == 1024


@pytest.mark.parametrize(("key", "value"), [("max_seq_length", 300), ("max_length", 300)])
def test_trl_config_old_and_new_names(tmp_path, key, value):
    run = _fake_run(tmp_path)
    (run / "sft_config.yaml").write_text(yaml.safe_dump({key: value, "completion_only_loss": False}))
    setup = read_run(run).setup
    assert setup.max_length == 300 and setup.completion_only_loss is False
    assert "max_length" not in setup.assumed and "truncation_mode" in setup.assumed


def test_axolotl_config_and_its_defaults(tmp_path):
    config = tmp_path / "axolotl.yml"
    config.write_text(yaml.safe_dump({"base_model": "x", "train_on_inputs": True, "num_epochs": 4,
                                      "datasets": [{"path": "d", "type": "alpaca"}]}))
    setup = read_run(None, config).setup
    assert setup.framework == "axolotl" and setup.max_length == 512 and setup.drop_overlong is True
    assert setup.completion_only_loss is False and setup.num_train_epochs == 4.0
    assert "max_length" in setup.assumed


@pytest.mark.parametrize(("collator", "masks"), [("transformers.DataCollatorForLanguageModeling", True),
                                                 ("trl.trainer.sft_trainer.DataCollatorForLanguageModeling", False),
                                                 ("my.CustomCollator", None)])
def test_data_collator_key(tmp_path, collator, masks):
    config = tmp_path / "training_config.json"
    config.write_text(json.dumps({"data_collator": collator}))
    assert read_run(None, config).setup.collator_masks_pad is masks


def test_flags_override_config(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("max_length: 100\n")
    assert read_run(None, config, {"max_length": 50}).setup.max_length == 50


@pytest.mark.parametrize("damage", ["missing", "file", "empty", "bad_adapter_json", "bad_yaml"])
def test_bad_run_folders_name_the_file(tmp_path, damage):
    run, config = _fake_run(tmp_path), None
    if damage == "missing":
        run = tmp_path / "nope"
    elif damage == "file":
        run = run / "checkpoint-10" / "optimizer.pt"
    elif damage == "empty":
        run = tmp_path / "empty"
        run.mkdir()
    elif damage == "bad_adapter_json":
        (run / "checkpoint-10" / "adapter_config.json").write_text('{"r": 8,\n oops}')
    else:
        config = run / "config.yaml"
        config.write_text("max_length: [1, 2\n")
    with pytest.raises(InputError) as error:
        read_run(run, config)
    assert str(error.value).startswith(str(config or run if damage != "bad_adapter_json"
                                           else run / "checkpoint-10" / "adapter_config.json"))


@pytest.fixture(scope="module")
def trl_run(tmp_path_factory, tiny_tokenizer):
    """A real TRL SFTTrainer + PEFT LoRA run of 4 steps on a tiny model, with checkpoints and optimizer state."""
    torch.set_num_threads(2)
    root = tmp_path_factory.mktemp("trl_run")
    base = root / "base"
    make_tiny_model(tiny_tokenizer).save_pretrained(base)
    tiny_tokenizer.save_pretrained(base)
    rows = [{"prompt": f"my order {i} is late", "completion": ' {"order": "late"}'} for i in range(8)]
    dataset = root / "train.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = SFTConfig(output_dir=str(root / "run"), report_to=[], use_cpu=True, max_steps=4, save_steps=2,
                     per_device_train_batch_size=4, learning_rate=2e-4, max_length=64, logging_steps=1,
                     gradient_checkpointing=False, bf16=False, seed=0)
    from transformers import AutoModelForCausalLM

    trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(base), args=args,
                         train_dataset=Dataset.from_list(rows), processing_class=tiny_tokenizer,
                         peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    trainer.train()
    trainer.save_model()
    return {"base": base, "run": root / "run", "dataset": dataset}


def test_read_real_trl_run(trl_run):
    info = read_run(trl_run["run"])
    assert info.adapter_dir == trl_run["run"].resolve()
    assert [c.name for c in info.checkpoints] == ["checkpoint-2", "checkpoint-4"]
    assert info.optimizer_path == info.checkpoints[-1] / "optimizer.pt"
    assert len([row for row in info.log_history if "loss" in row]) == 4
    assert info.setup.max_length == 64 and info.setup.learning_rate == 2e-4
    assert info.setup.source == "training_args.bin" and info.unreadable == []
    assert info.setup.assumed == []  # the version is known, so is its collator: labels padded by position
    import trl

    assert info.setup.framework_version == trl.__version__ and info.setup.collator_masks_pad is False
    assert info.setup.version_source == "recorded in README.md (TRL's model card)"
    assert info.adapter_config["r"] == 4


def test_diagnose_reads_real_run_without_flags(trl_run, cli_runner):
    from gradian.cli.main import cli, register_commands

    register_commands()
    result = cli_runner.invoke(cli, ["diagnose", "--dataset", str(trl_run["dataset"]), "--run", str(trl_run["run"]),
                                     "--base-model", str(trl_run["base"]), "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload["findings"] == [] and payload["rows"] == 8
    assert payload["setup"]["max_length"] == 64 and payload["unreadable"] == []


def test_a_checkpoint_folder_is_a_run_and_finds_the_config_above_it(tmp_path):
    run = _fake_run(tmp_path)
    (run / "sft_config.yaml").write_text("max_length: 99\n")
    info = read_run(run / "checkpoint-4")
    assert info.adapter_config["step"] == 4 and info.checkpoints == [(run / "checkpoint-4").resolve()]
    assert info.setup.max_length == 99


def test_axolotl_truncate_strategy_and_chat_datasets(tmp_path):
    config = tmp_path / "axolotl.yaml"
    config.write_text(yaml.safe_dump({"sequence_len": 2048, "excess_length_strategy": "truncate",
                                      "sample_packing": True, "special_tokens": {"pad_token": "<pad>"},
                                      "datasets": [{"path": "d", "type": "chat_template"}]}))
    setup = read_run(None, config).setup
    assert (setup.max_length, setup.drop_overlong, setup.packing) == (2048, False, True)
    assert setup.assistant_only_loss is True and setup.pad_token == "<pad>" and setup.collator_masks_pad is False


def test_unknown_override_is_bad_input():
    with pytest.raises(InputError, match="unknown setting"):
        read_run(None, None, {"max_len": 3})


@pytest.mark.parametrize(("given", "read"), [("wrapped", "wrapped"), ("bfd-requeue", "bfd_split"), ("bfd", "bfd")])
def test_packing_strategy_is_read_from_the_config(given, read):
    from gradian.data.config_fields import setup_fields

    assert setup_fields({"packing": True, "packing_strategy": given}, "trl")["packing_strategy"] == read


def test_an_unknown_packing_strategy_is_refused():
    from gradian.data.config_fields import setup_fields

    with pytest.raises(InputError, match="packing_strategy 'ffd-x' is not bfd, bfd_split or wrapped"):
        setup_fields({"packing_strategy": "ffd-x"}, "trl")
