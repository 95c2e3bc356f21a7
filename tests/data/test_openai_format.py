"""OpenAI fine-tuning JSONL: a `weight` on assistant turns. Read with no run as OpenAI's service trains it (loss on
the assistant turns whose weight is not 0, nothing else); under TRL, which ignores the key, the audit says those
turns were trained."""

from __future__ import annotations

import json

import pytest

from conftest import make_tiny_model
from gradian.audit.diagnosis import diagnose
from gradian.cli.main import cli, register_commands
from gradian.data.examples import read_dataset
from gradian.data.openai_format import openai_setup
from gradian.data.render import IGNORE, render_dataset
from gradian.data.setup import TrainingSetup, preparation
from gradian.data.trl_prepare import Preparation

WHOLE, CUT = '{"order": "late"}', '{"order": '


def chat(first: str, second: str, first_weight: int | None, second_weight: int | None) -> dict:
    turns = [{"role": "system", "content": "help"}, {"role": "user", "content": "my order is late"},
             {"role": "assistant", "content": first}, {"role": "user", "content": "refund my invoice"},
             {"role": "assistant", "content": second}]
    for turn, weight in ((turns[2], first_weight), (turns[4], second_weight)):
        if weight is not None:
            turn["weight"] = weight
    return {"messages": turns}


ROWS = [
    chat(CUT, WHOLE, 0, 1),  # a cut turn OpenAI never trains
    chat(WHOLE, CUT, 1, 1),  # a cut turn it trains
    chat("the invoice amount", "please help", None, 0),
    chat("hello", "the order was late", 1, None),
]


@pytest.fixture
def rows_file(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return path


@pytest.fixture(scope="module")
def base(tmp_path_factory, tiny_tokenizer):
    folder = tmp_path_factory.mktemp("base")
    make_tiny_model(tiny_tokenizer).config.save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    return folder


def trained_text(tokenizer, ids, labels) -> str:
    return tokenizer.decode([t for t, label in zip(ids, labels, strict=True) if label != IGNORE])


def test_loss_falls_on_the_weighted_assistant_turns_only(rows_file, tiny_tokenizer):
    examples = read_dataset(rows_file)
    tally = Preparation()
    rendered = render_dataset(examples, tiny_tokenizer, openai_setup(TrainingSetup(assumed=["max_length"])), tally)
    for row, rendered_row in zip(ROWS, rendered, strict=True):
        full = tiny_tokenizer.apply_chat_template(row["messages"], tokenize=False)
        assert tiny_tokenizer.decode(rendered_row.input_ids) == tiny_tokenizer.decode(
            tiny_tokenizer(full, add_special_tokens=False)["input_ids"])
        text = trained_text(tiny_tokenizer, rendered_row.input_ids, rendered_row.labels)
        # the naive reference: each assistant turn's content is trained exactly when its weight is not 0
        wanted = [t["content"] for t in row["messages"] if t["role"] == "assistant" and t.get("weight", 1) != 0]
        assert [w for w in wanted if w in text] == wanted
        for turn in row["messages"]:
            if turn["role"] != "assistant" or turn.get("weight", 1) == 0:
                assert turn["content"] not in text.replace("".join(wanted), "")
        assert rendered_row.over_limit == "" and not rendered_row.dropped  # no truncation is known for the service
    assert tally.port_rows == len(ROWS) and tally.trainer_rows == 0 and "OpenAI" in tally.why[0]


def test_no_run_reads_the_file_as_openai_trains_it(rows_file, base):
    result = diagnose(rows_file, base_model=str(base))
    checks = {f.check: f for f in result.findings}
    assert result.setup.framework == "openai" and result.setup.max_length is None
    assert "prompt_loss" not in checks and "weight_ignored" not in checks
    assert checks["cut_in_data"].example_ids == ["2"]  # row 1's cut turn carries weight 0: never trained
    prepared = preparation(result.setup)
    assert prepared["code"] == "gradian-port" and "OpenAI fine-tuning" in prepared["text"]
    assert "assumed" in result.to_dict() and "assistant_only_loss" not in result.setup.assumed


def test_under_trl_the_weight_is_ignored_and_said(rows_file, base, tmp_path):
    config = tmp_path / "sft.yaml"
    config.write_text("max_length: 512\n")
    result = diagnose(rows_file, base_model=str(base), config=config)
    checks = {f.check: f for f in result.findings}
    assert result.setup.framework == "trl"
    assert checks["weight_ignored"].example_ids == ["1", "3"]
    assert checks["weight_ignored"].values == {"rows": 2, "turns": 2}
    assert checks["cut_in_data"].example_ids == ["1", "2"]  # TRL trains both cut turns


def test_every_turn_weight_zero_is_no_loss_with_its_own_fix(tmp_path, base):
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(chat("hello", "please help", 0, 0)) + "\n" + json.dumps(ROWS[3]) + "\n")
    register_commands()
    from click.testing import CliRunner

    result = CliRunner().invoke(cli, ["diagnose", "--dataset", str(path), "--base-model", str(base), "--json"])
    assert result.exit_code == 1, result.output
    (finding,) = [f for f in json.loads(result.output)["findings"] if f["check"] == "no_loss"]
    assert finding["example_ids"] == ["1"] and "weight 0" in finding["fix"]
