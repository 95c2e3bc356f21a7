"""The audit reads the tokenizer the run saved (what training used), the base model's only as a fallback."""

from __future__ import annotations

import json
import shutil

import pytest

from gradian.audit import diagnose
from gradian.cli.main import cli, register_commands

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def recorded_only_in_the_tokenizer(source, folder, field: str):
    """A copy of a scenario run whose `field` is recorded only in the tokenizer it saved: no config line, no
    training_args.bin (as a plain `Trainer` run leaves it)."""
    shutil.copytree(source, folder)
    for args in folder.glob("run/**/training_args.bin"):
        args.unlink()
    config = folder / "run" / "sft_config.yaml"
    config.write_text("".join(line for line in config.read_text().splitlines(keepends=True)
                              if not line.startswith(f"{field}:")))
    return folder


@pytest.fixture
def trainer_pad_eos(scenario, tmp_path):
    """The `pad-eos` run as a plain `Trainer` run leaves it: pad == eos only in the tokenizer the run saved.

    The base model's tokenizer has its own `<pad>`; the config names the pad-masking collator but no pad_token,
    and there is no training_args.bin (a `TrainingArguments` has no pad_token field to record it in).
    """
    return recorded_only_in_the_tokenizer(scenario("pad-eos"), tmp_path / "pad-eos", "pad_token")


def audit(folder, **kwargs):
    return diagnose(folder / "train.jsonl", base_model=folder / "base", run=folder / "run", **kwargs)


def test_pad_eos_found_in_the_runs_saved_tokenizer(trainer_pad_eos):
    from transformers import AutoTokenizer

    base = AutoTokenizer.from_pretrained(trainer_pad_eos / "base")
    assert base.pad_token != base.eos_token  # the fault is visible only in the run's tokenizer
    result = audit(trainer_pad_eos)
    assert result.tokenizer_source.kind == "run"
    assert result.tokenizer_source.path == str(trainer_pad_eos / "run")
    assert result.tokenizer_source.differs_from_base["pad_token"] == [base.pad_token, base.eos_token]
    (finding,) = [f for f in result.findings if f.check == "pad_eos_masking"]
    assert finding.severity == "critical" and finding.values["collator_masks_pad"] is True
    assert finding.example_ids == [e.id for e in result.examples]  # every row ends with a masked EOS
    assert "pad_token" not in result.setup.assumed and result.setup.pad_token == base.eos_token


def test_base_tokenizer_is_the_fallback_and_says_so(trainer_pad_eos):
    for folder in [trainer_pad_eos / "run", *(trainer_pad_eos / "run").glob("checkpoint-*")]:
        for name in TOKENIZER_FILES:
            (folder / name).unlink(missing_ok=True)
    result = audit(trainer_pad_eos)
    assert result.tokenizer_source.kind == "base_model"
    assert not [f for f in result.findings if f.check == "pad_eos_masking"]  # the base's pad is distinct
    assert "pad_token" in result.setup.assumed


def test_newest_checkpoint_tokenizer_when_the_root_has_none(trainer_pad_eos):
    run = trainer_pad_eos / "run"
    for name in TOKENIZER_FILES:
        (run / name).unlink(missing_ok=True)
    result = audit(trainer_pad_eos)
    newest = max(run.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert result.tokenizer_source.path == str(newest)
    assert any(f.check == "pad_eos_masking" for f in result.findings)


def test_saved_tokenizer_that_does_not_load_is_noted_and_the_base_is_read(trainer_pad_eos):
    run = trainer_pad_eos / "run"
    for folder in [run, *run.glob("checkpoint-*")]:
        (folder / "tokenizer.json").write_text("{ not json")
    result = audit(trainer_pad_eos)
    assert result.tokenizer_source.kind == "base_model"
    assert any("tokenizer" in line and "base model's tokenizer was read instead" in line
               for line in result.run.unreadable)


def test_cli_shows_the_tokenizer_source(trainer_pad_eos, cli_runner, tmp_path):
    register_commands()
    out = tmp_path / "out"
    args = ["diagnose", "--dataset", str(trainer_pad_eos / "train.jsonl"), "--base-model",
            str(trainer_pad_eos / "base"), "--run", str(trainer_pad_eos / "run")]
    result = cli_runner.invoke(cli, [*args, "--json", "--out", str(out)])
    assert result.exit_code == 1, result.output
    payload = json.loads(result.output)
    assert payload["tokenizer_source"]["kind"] == "run"
    assert any(f["check"] == "pad_eos_masking" for f in payload["findings"])
    markdown = (out / "findings.md").read_text()
    assert "Tokenizer read: the run's saved tokenizer" in markdown and "pad_token '<pad>' → '</s>'" in markdown
    table = cli_runner.invoke(cli, args)
    assert "Tokenizer: the run's saved tokenizer" in table.output


def test_eos_the_trainer_replaced_is_the_runs_setting(scenario, tmp_path):
    """`no-eos` trained with eos_token='\\n': with that recorded only in the saved tokenizer (no config field, no
    training_args.bin), the model's real EOS is still reported as never supervised."""
    folder = recorded_only_in_the_tokenizer(scenario("no-eos"), tmp_path / "no-eos", "eos_token")
    result = audit(folder)
    assert result.tokenizer_source.differs_from_base["eos_token"] == ["</s>", "\n"]
    assert result.setup.eos_token == "\n" and "eos_token" not in result.setup.assumed
    (finding,) = [f for f in result.findings if f.check == "missing_eos"]
    assert finding.severity == "critical" and len(finding.example_ids) == len(result.examples)
