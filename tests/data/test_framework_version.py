"""The TRL version a run trained with, recorded or inferred from its config, and the collator that follows it."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from trl import SFTConfig

from fixtures.smollm2_like import build_smollm2_like, save_smollm2_like
from gradian.data.run_folder import read_run

CLEAN_ROWS = [
    {"prompt": [{"role": "user", "content": f"my order {i} is late, please help"}],
     "completion": [{"role": "assistant", "content": '{"intent": "refund", "order": 1234}'}]}
    for i in range(6)
] + [{"prompt": "Give three tips for staying healthy.", "completion": " Eat a balanced diet."}]


@pytest.mark.parametrize(("config", "version", "masks"), [
    ({"max_length": 512, "completion_only_loss": True}, ">=0.17", False),
    ({"max_length": 512, "assistant_only_loss": True}, ">=0.19", False),
    ({"max_seq_length": 512, "dataset_text_field": "text"}, "<0.20", None),  # 0.12 masks pad ids, 0.19 does not
    ({"max_seq_length": 512, "completion_only_loss": True}, ">=0.17,<0.20", False),
    ({"max_length": 512, "padding_free": True}, ">=0.16", False),  # flattened: no pad token at all
    ({"max_length": 512}, ">=0.16", None),  # 0.16 still used transformers' collator
    ({"learning_rate": 1e-4}, None, None),  # nothing of SFTConfig's own
    ({"trl_version": "0.15.2", "max_seq_length": 512}, "0.15.2", True),
    ({"max_length": 512, "completion_only_loss": True, "data_collator": "transformers.DataCollatorForLanguageModeling"},
     ">=0.17", True),  # a collator the config names wins over the version's default
])
def test_version_inferred_from_fields(tmp_path, config, version, masks):
    path = tmp_path / "sft_config.yaml"
    path.write_text(yaml.safe_dump(config))
    setup = read_run(None, path).setup
    assert setup.framework_version == version and setup.collator_masks_pad is masks
    if version is not None:
        assert setup.version_source and ("inferred from sft_config.yaml" in setup.version_source
                                         or "recorded" in setup.version_source)
    assert ("collator_masks_pad" in setup.assumed) is (masks is None)


def test_training_args_bin_bounds_from_absent_fields_too(tmp_path):
    """A pickled SFTConfig holds every field: TRL 1.x's has no max_seq_length, so it is at least 0.20."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "adapter_config.json").write_text(json.dumps({"r": 4}))
    torch.save(SFTConfig(output_dir=str(run), report_to=[], use_cpu=True), run / "training_args.bin")
    setup = read_run(run).setup
    assert setup.framework_version == ">=0.20" and setup.collator_masks_pad is False
    assert "training_args.bin" in setup.version_source and "no max_seq_length" in setup.version_source


def test_model_card_version_is_recorded(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "adapter_config.json").write_text(json.dumps({"r": 4}))
    (run / "README.md").write_text("### Framework versions\n\n- PEFT 0.13.0\n- TRL: 0.12.1\n- Transformers: 4.46\n")
    setup = read_run(run).setup
    assert setup.framework_version == "0.12.1" and setup.collator_masks_pad is True
    assert setup.version_source == "recorded in README.md (TRL's model card)"


def test_clean_smollm2_tokenizer_with_trl_020_config_diagnoses_clean(tmp_path, cli_runner):
    """pad == eos == <|im_end|>, but TRL >= 0.17's collator pads labels by position: EOS is trained, exit 0."""
    from gradian.cli.main import cli, register_commands

    tokenizer = build_smollm2_like()
    assert tokenizer.pad_token == tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token_id == 2
    base = save_smollm2_like(tmp_path / "smollm2")
    dataset = tmp_path / "train.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in CLEAN_ROWS))
    config = tmp_path / "sft_config.yaml"
    config.write_text(yaml.safe_dump({"max_length": 512, "completion_only_loss": True, "num_train_epochs": 1,
                                      "learning_rate": 2e-4}))
    register_commands()
    args = ["diagnose", "--dataset", str(dataset), "--config", str(config), "--base-model", str(base), "--json"]
    result = cli_runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert [f["check"] for f in payload["findings"] if f["severity"] != "info"] == []
    assert payload["setup"]["framework_version"] == ">=0.17" and payload["setup"]["collator_masks_pad"] is False
    # the same rows and tokenizer under a config of TRL < 0.17 (transformers' collator masks pad ids) do fail
    config.write_text(yaml.safe_dump({"trl_version": "0.16.1", "max_length": 512, "num_train_epochs": 1}))
    result = cli_runner.invoke(cli, args)
    assert result.exit_code == 1 and "pad_eos_masking" in result.output


def test_axolotl_version_from_its_model_card(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "adapter_config.json").write_text(json.dumps({"r": 4}))
    (run / "axolotl.yml").write_text(yaml.safe_dump({"sequence_len": 512, "datasets": [{"path": "d", "type": "alpaca"}]}))
    (run / "README.md").write_text("<details><summary>See axolotl config</summary>\n\naxolotl version: `0.8.1`\n")
    setup = read_run(run).setup
    assert setup.framework == "axolotl" and setup.framework_version == "0.8.1"
    assert setup.version_source == "recorded in README.md (axolotl's model card)"


def test_dataset_text_field_names_the_text_column(tmp_path, cli_runner):
    from gradian.cli.main import cli, register_commands

    base = save_smollm2_like(tmp_path / "smollm2")
    dataset = tmp_path / "train.jsonl"
    dataset.write_text(json.dumps({"content": "my order is late, please help"}) + "\n")
    config = tmp_path / "sft_config.yaml"
    config.write_text(yaml.safe_dump({"max_seq_length": 512, "dataset_text_field": "content"}))
    register_commands()
    result = cli_runner.invoke(cli, ["diagnose", "--dataset", str(dataset), "--config", str(config),
                                     "--base-model", str(base), "--json"])
    assert result.exit_code in (0, 1), result.output  # read, not refused as a row of no known shape
    assert json.loads(result.output)["rows"] == 1
