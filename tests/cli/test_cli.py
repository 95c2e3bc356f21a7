"""The CLI as a whole: every command answers --help, and docs/cli.md is what --help says."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gradian.cli.main import cli, register_commands
from gradian.cli.reference import cli_reference
from gradian.scenarios import built_before

register_commands()
DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def _commands() -> list[list[str]]:
    paths = [[]]
    for name, command in cli.commands.items():
        paths.append([name])
        paths += [[name, sub] for sub in getattr(command, "commands", {})]
    return paths


@pytest.mark.parametrize("path", _commands(), ids=lambda p: " ".join(p) or "gradian")
def test_every_command_answers_help(cli_runner, path):
    result = cli_runner.invoke(cli, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


def test_expected_commands_are_registered():
    assert {"diagnose", "attribute", "demo", "scenario"} <= set(cli.commands)


def test_cli_reference_is_current():
    assert DOCS.read_text() == cli_reference(), "regenerate it: python -m gradian.cli.reference > docs/cli.md"


def test_unknown_option_is_a_usage_error(cli_runner):
    result = cli_runner.invoke(cli, ["attribute", "--no-such-flag"])
    assert result.exit_code == 2
    assert "Traceback" not in result.output


@pytest.mark.parametrize("command", [["demo"], ["scenario", "build", "truncated-cluster"]])
def test_a_seed_numpy_cannot_take_is_a_usage_error(cli_runner, command, tmp_path):
    """A scenario's seed past numpy's range was exit 3 once the build began (found by an option sweep)."""
    result = cli_runner.invoke(cli, [*command, "--seed", "-5", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "'--seed': -5 is not in the range" in result.output, result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("missing", ["--dataset", "--base-model", "--adapter", "--eval-dataset", "--capability"])
def test_a_missing_required_option_is_a_usage_error_before_any_work(cli_runner, missing, tmp_path):
    """Every required setting is asked for up front (click >= 8.3 read an explicit `default=None` as a value, so
    `attribute` without --capability generated answers and then failed with an internal error)."""
    given = {"--dataset": "train.jsonl", "--base-model": "base", "--adapter": "run", "--eval-dataset": "eval.jsonl",
             "--capability": "json_formatting"}
    args = [part for flag, value in given.items() if flag != missing for part in (flag, value)]
    result = cli_runner.invoke(cli, ["attribute", *args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and f"Missing option '{missing}'" in result.output, result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_demo_reuses_the_scenario_it_built_and_runs_twice(cli_runner, scenario, tmp_path):
    """A second `gradian demo --out` the same folder runs again instead of refusing the folder it wrote."""
    out = tmp_path / "demo"
    shutil.copytree(scenario("truncated-cluster", 0), out / "scenario")  # what a first demo run leaves there
    for _ in range(2):
        result = cli_runner.invoke(cli, ["demo", "--out", str(out)])
        assert result.exit_code == 0, result.output
        assert "built before" in result.output and "building the" not in result.output
    assert json.loads((out / "report" / "report.json").read_text())["verdict"]["kind"] == "data-cluster"


def test_a_scenario_folder_of_another_seed_is_not_reused(tmp_path):
    (tmp_path / "truth.json").write_text(json.dumps({"scenario": "truncated-cluster", "seed": 1}))
    (tmp_path / "measured.json").write_text("{}")
    assert built_before(tmp_path, "truncated-cluster", 1)
    assert not built_before(tmp_path, "truncated-cluster", 0)
    assert not built_before(tmp_path, "format-cluster", 1)
    (tmp_path / "measured.json").unlink()  # a build stopped before its end
    assert not built_before(tmp_path, "truncated-cluster", 1)


@pytest.mark.parametrize("how", ["positions", "tokens"])
@pytest.mark.parametrize("other", [["--checkpoints", "on"], ["--checkpoints", "auto"], ["--checkpoints", "captured"],
                                   ["--preconditioner", "adam"], ["--unit-norm-train"]])
def test_row_harm_with_what_it_cannot_read_is_one_sentence(cli_runner, tmp_path, other, how):
    """--row-harm positions or tokens reads the final adapter's raw gradients, identity preconditioner: any other is
    refused."""
    required = [f"--{name}" for name in ("base-model", "adapter", "dataset", "eval-dataset", "out")]
    args = [x for flag in required for x in (flag, str(tmp_path / flag[2:]))] + ["--capability", "json_formatting"]
    result = cli_runner.invoke(cli, ["attribute", *args, "--row-harm", how, *other])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"row_harm {how} reads the final adapter's raw gradients" in result.output


@pytest.mark.parametrize("checkpoints", ["on", "captured"])
def test_tracin_with_another_preconditioner_is_one_sentence(cli_runner, tmp_path, checkpoints):
    required = [f"--{name}" for name in ("base-model", "adapter", "dataset", "eval-dataset", "out")]
    args = [x for flag in required for x in (flag, str(tmp_path / flag[2:]))] + ["--capability", "json_formatting"]
    result = cli_runner.invoke(cli, ["attribute", *args, "--checkpoints", checkpoints, "--preconditioner", "kfac"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"checkpoints {checkpoints} (TracIn) uses the identity preconditioner" in result.output


def test_library_warnings_and_loading_bars_stay_off_the_terminal(tmp_path):
    """What the CLI sets up before any library loads: a model load and a library FutureWarning print nothing."""
    import subprocess
    import sys

    code = (
        "from gradian.cli.main import quiet_libraries\n"
        "quiet_libraries()\n"
        "import warnings\n"
        "from transformers import LlamaConfig, LlamaForCausalLM\n"
        "config = LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,"
        " num_attention_heads=2, num_key_value_heads=2)\n"
        f"LlamaForCausalLM(config).save_pretrained({str(tmp_path)!r})\n"
        f"LlamaForCausalLM.from_pretrained({str(tmp_path)!r})\n"
        "warnings.warn('deprecated in a library', FutureWarning)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "Loading weights" not in done.stderr and "FutureWarning" not in done.stderr, done.stderr
