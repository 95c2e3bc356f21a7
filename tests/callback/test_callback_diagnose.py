"""`gradian diagnose --run DIR` reads gradian_run.json first: a pad == eos run trained with transformers' pad-masking
collator is found without --config and without a `data_collator:` line; without the record, today's inference."""

from __future__ import annotations

import json

import pytest

from callback_runs import sft_trainer, tickets
from conftest import WORDS, make_tiny_model
from gradian import GradianCallback
from gradian.cli.main import cli, register_commands
from gradian.scenarios.tokenizer import build_tokenizer


@pytest.fixture(autouse=True)
def commands():
    register_commands()


@pytest.fixture(scope="module")
def pad_eos_run(tmp_path_factory):
    """A finished pad == eos run (preflight only warned), its base model folder and its training rows."""
    root = tmp_path_factory.mktemp("pad-eos")
    tokenizer = build_tokenizer(WORDS)
    base = root / "base"
    make_tiny_model(tokenizer).config.save_pretrained(base)
    tokenizer.save_pretrained(base)
    run = root / "run"
    trainer = sft_trainer(run, tickets(), pad_eos=True,
                          callbacks=[GradianCallback(on_critical="warn", echo=lambda _: None)])
    trainer.train()
    trainer.save_model(str(run))
    trainer.save_state()
    rows = root / "train.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in tickets()))
    return run, base, rows


def diagnose(runner, run, base, rows):
    return runner.invoke(cli, ["diagnose", "--dataset", str(rows), "--run", str(run), "--base-model", str(base),
                               "--json"])


def test_record_names_the_collator_without_config(cli_runner, pad_eos_run):
    run, base, rows = pad_eos_run
    assert not list(run.glob("*.yaml"))  # no config file, no data_collator: line
    result = diagnose(cli_runner, run, base, rows)
    assert result.exit_code == 1, result.output
    payload = json.loads(result.output)
    (masking,) = [f for f in payload["findings"] if f["check"] == "pad_eos_masking"]
    assert masking["severity"] == "critical" and masking["values"]["collator_masks_pad"] is True
    assert payload["setup"]["record"] == str((run / "gradian_run.json").resolve())
    assert payload["setup"]["version_source"] == "recorded in gradian_run.json by GradianCallback"
    assert "collator_masks_pad" not in payload["assumed"] and "pad_token" not in payload["assumed"]


def test_table_says_it_read_the_record(cli_runner, pad_eos_run):
    run, base, rows = pad_eos_run
    result = cli_runner.invoke(cli, ["diagnose", "--dataset", str(rows), "--run", str(run), "--base-model", str(base)])
    text = " ".join(result.output.split())
    assert "Run record: read" in text and "(recorded by GradianCallback): collator PadMaskingCollator (masks pad ids)" \
        in text


def test_without_the_record_inference_is_unchanged(cli_runner, pad_eos_run, tmp_path):
    run, base, rows = pad_eos_run
    bare = tmp_path / "bare"
    bare.mkdir()
    for path in run.iterdir():
        if path.is_file() and path.name != "gradian_run.json":
            (bare / path.name).write_bytes(path.read_bytes())
    payload = json.loads(diagnose(cli_runner, bare, base, rows).output)
    assert payload["setup"]["record"] is None
    assert not [f for f in payload["findings"] if f["check"] == "pad_eos_masking" and f["severity"] == "critical"]
