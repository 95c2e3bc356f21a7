"""`gradian diagnose` through the CLI: table, --json, --out, exit codes, and bad input as one sentence."""

from __future__ import annotations

import json

import pytest

from conftest import make_tiny_model
from gradian.cli.main import cli, register_commands

CLEAN = [{"prompt": f"my order {i} is late", "completion": ' {"order": "late"}'} for i in range(6)]


@pytest.fixture(scope="module")
def base(tmp_path_factory, tiny_tokenizer):
    folder = tmp_path_factory.mktemp("base")
    make_tiny_model(tiny_tokenizer).config.save_pretrained(folder)  # diagnose needs tokenizer + config only
    tiny_tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(autouse=True)
def commands():
    register_commands()


def write(tmp_path, rows, name="train.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def invoke(runner, *args):
    return runner.invoke(cli, ["diagnose", *args])


def test_clean_dataset_exits_0(cli_runner, base, tmp_path):
    result = invoke(cli_runner, "--dataset", write(tmp_path, CLEAN), "--base-model", base)
    assert result.exit_code == 0, result.output
    assert "No mechanical faults found in 6 rows" in result.output


def test_findings_exit_1_json_and_out(cli_runner, base, tmp_path):
    rows = CLEAN + [dict(CLEAN[0])]
    out = tmp_path / "out"
    result = invoke(cli_runner, "--dataset", write(tmp_path, rows), "--base-model", base, "--json", "--out", str(out))
    assert result.exit_code == 1
    payload = json.loads(result.output)
    (finding,) = payload["findings"]
    assert {"check", "severity", "title", "example_ids", "fix", "values"} <= set(finding)
    assert finding["check"] == "duplicate" and finding["example_ids"] == ["7"]
    assert json.loads((out / "findings.json").read_text()) == payload
    assert "`duplicate`" in (out / "findings.md").read_text()


def test_fail_on_critical_lets_warnings_pass(cli_runner, base, tmp_path):
    rows = CLEAN + [dict(CLEAN[0])]
    result = invoke(cli_runner, "--dataset", write(tmp_path, rows), "--base-model", base, "--fail-on", "critical")
    assert result.exit_code == 0 and "duplicate" in result.output


def test_table_lists_most_severe_first(cli_runner, base, tmp_path):
    rows = CLEAN + [dict(CLEAN[0])]
    config = tmp_path / "sft_config.yaml"
    config.write_text("completion_only_loss: false\n")
    result = invoke(cli_runner, "--dataset", write(tmp_path, rows), "--base-model", base, "--config", str(config))
    assert result.exit_code == 1
    assert result.output.index("prompt_loss") < result.output.index("duplicate")


def test_eval_overlap_and_max_length_flag(cli_runner, base, tmp_path):
    # the prompts are 10 tokens: a limit of 14 cuts every answer and leaves each row trained tokens (at 10 or less a
    # row trains nothing, so it teaches no eval answer and no overlap is named)
    eval_path = write(tmp_path, [{"prompt": CLEAN[2]["prompt"]}], "eval.jsonl")
    result = invoke(cli_runner, "--dataset", write(tmp_path, CLEAN), "--eval-dataset", eval_path,
                    "--base-model", base, "--max-length", "14", "--json")
    checks = {f["check"] for f in json.loads(result.output)["findings"]}
    assert result.exit_code == 1 and {"train_eval_overlap", "truncated_completion"} <= checks


BAD = {
    "malformed_line": (b'{"prompt": "a", "completion": "b"}\n{"prompt": \n', ":2: not valid JSON"),
    "missing_fields": (b'{"prompt": "a", "completion": "b"}\n{"question": "a"}\n', ":2: no known fields"),
    "non_utf8": (b'{"prompt": "a", "completion": "\xff"}\n', ":1: not UTF-8"),
    "empty": (b"", ": the dataset is empty"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_dataset_is_one_sentence_exit_2(cli_runner, base, tmp_path, case):
    content, expected = BAD[case]
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    result = invoke(cli_runner, "--dataset", str(path), "--base-model", base)
    assert result.exit_code == 2
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"Error: {path}{expected}") and line.endswith(".")
    assert "Traceback" not in result.output


def test_path_that_does_not_exist(cli_runner, base, tmp_path):
    result = invoke(cli_runner, "--dataset", str(tmp_path / "nope.jsonl"), "--base-model", base)
    assert result.exit_code == 2 and result.output.startswith(f"Error: {tmp_path / 'nope.jsonl'}: no such file")
    assert len(result.output.strip().splitlines()) == 1


def test_run_folder_it_cannot_read(cli_runner, base, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "adapter_config.json").write_text("{not json")
    result = invoke(cli_runner, "--dataset", write(tmp_path, CLEAN), "--base-model", base, "--run", str(run))
    assert result.exit_code == 2
    assert result.output.startswith(f"Error: {run / 'adapter_config.json'}:1: is not valid JSON")
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output


def test_base_model_that_does_not_exist(cli_runner, tmp_path):
    result = invoke(cli_runner, "--dataset", write(tmp_path, CLEAN), "--base-model", str(tmp_path / "nomodel"))
    assert result.exit_code == 2 and "no such model folder" in result.output


def test_usage_error_is_exit_2(cli_runner):
    assert invoke(cli_runner, "--dataset", "x.jsonl").exit_code == 2  # --base-model missing


def test_help(cli_runner):
    result = invoke(cli_runner, "--help")
    assert result.exit_code == 0 and "--fail-on" in result.output


def test_messages_without_a_chat_template_is_bad_input(cli_runner, tmp_path, tiny_tokenizer):
    import copy

    folder = tmp_path / "no_template"
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = None
    tokenizer.save_pretrained(folder)
    make_tiny_model(tiny_tokenizer).config.save_pretrained(folder)
    rows = [{"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "help"}]}]
    dataset = write(tmp_path, rows)
    result = invoke(cli_runner, "--dataset", dataset, "--base-model", str(folder))
    assert result.exit_code == 2 and result.output.startswith(f"Error: {dataset}:1: the chat template cannot render")
    assert len(result.output.strip().splitlines()) == 1


def test_out_that_cannot_be_written_is_bad_input(cli_runner, base, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = invoke(cli_runner, "--dataset", write(tmp_path, CLEAN), "--base-model", base, "--out", str(blocker / "sub"))
    assert result.exit_code == 2 and result.output.startswith(f"Error: {blocker / 'sub'}: cannot write")
