"""The exit-code contract: 0 clean, 1 findings, 2 bad input, 3 internal error with a log file, 130 interrupted;
a crash is never exit code 1, never a traceback, and a stray sys.exit never ends a run with nothing checked."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import pytest
import torch

from bad_inputs.corpus import attribute_args
from bad_inputs.fixtures import assert_one_line_error, gradian, workspace  # noqa: F401
from gradian.cli import diagnose as diagnose_cli
from gradian.cli.exit_codes import EPILOG
from gradian.cli.main import cli, register_commands

register_commands()
ARGS = ["diagnose", "--dataset", "train.jsonl", "--base-model", "base"]


def _crash(error: BaseException):
    def diagnose(*args, **kwargs):
        raise error

    return diagnose


def _log_of(stderr: str) -> Path:
    line = stderr.strip().splitlines()[-1]
    return Path(line.split("the traceback is in ", 1)[1].split("; please report", 1)[0])


def test_an_unexpected_error_is_exit_3_with_a_log_holding_the_traceback(cli_runner, monkeypatch, tmp_path):
    monkeypatch.setenv("GRADIAN_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setattr(diagnose_cli, "diagnose", _crash(ZeroDivisionError("division by zero")))
    result = cli_runner.invoke(cli, ARGS)
    assert result.exit_code == 3, result.output
    assert "Traceback" not in result.output and result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1
    assert "internal error (ZeroDivisionError: division by zero)" in result.stderr
    log = _log_of(result.stderr)
    assert log.parent == tmp_path / "logs"
    text = log.read_text()
    assert "Traceback" in text and "ZeroDivisionError" in text and "_crash" not in result.stderr


def test_a_stray_sys_exit_never_ends_a_run_with_exit_0(cli_runner, monkeypatch, tmp_path):
    monkeypatch.setenv("GRADIAN_LOG_DIR", str(tmp_path))
    monkeypatch.setattr(diagnose_cli, "diagnose", _crash(SystemExit(0)))
    result = cli_runner.invoke(cli, ARGS)
    assert result.exit_code == 3 and "something called sys.exit(0)" in result.stderr, result.output
    assert _log_of(result.stderr).is_file()


def test_ctrl_c_is_130_not_1(cli_runner, monkeypatch):
    monkeypatch.setattr(diagnose_cli, "diagnose", _crash(KeyboardInterrupt()))
    result = cli_runner.invoke(cli, ARGS)
    assert result.exit_code == 130 and "interrupted" in result.stderr and "Traceback" not in result.output


def test_an_unwritable_log_folder_falls_back_to_the_temporary_folder(cli_runner, monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("GRADIAN_LOG_DIR", str(blocker / "logs"))
    monkeypatch.setattr(diagnose_cli, "diagnose", _crash(RuntimeError("boom")))
    result = cli_runner.invoke(cli, ARGS)
    assert result.exit_code == 3 and _log_of(result.stderr).is_file(), result.stderr


def _commands(group: click.Group, prefix: list[str]):
    for name, command in group.commands.items():
        yield [*prefix, name]
        if isinstance(command, click.Group):
            yield from _commands(command, [*prefix, name])


@pytest.mark.parametrize("path", [[], *_commands(cli, [])], ids=lambda p: " ".join(p) or "gradian")
def test_every_help_ends_with_the_exit_codes(cli_runner, path):
    result = cli_runner.invoke(cli, [*path, "--help"])
    assert result.exit_code == 0
    table = [line.strip() for line in EPILOG.splitlines()[1:]]
    assert [line.strip() for line in result.output.rstrip().splitlines()[-len(table):]] == table


def test_main_exits_with_the_command_s_code(monkeypatch, tmp_path):
    from gradian.cli import main

    monkeypatch.setattr(sys, "argv", ["gradian", "diagnose", "--dataset", str(tmp_path / "none.jsonl"),
                                      "--base-model", str(tmp_path)])
    with pytest.raises(SystemExit) as exited:
        main.main()
    assert exited.value.code == 2


def test_a_character_the_terminal_cannot_show_is_replaced_not_a_crash(workspace, tmp_path):  # noqa: F811
    """Under LC_ALL=C PYTHONUTF8=0 stdout is ASCII: the findings table's dash prints as `?`, diagnose still answers."""
    import os
    import subprocess

    config = tmp_path / "sft_config.yaml"
    config.write_text("learning_rate: 1.0\nnum_train_epochs: 40\n")  # run-wide findings: no rows, a dash in the table
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    env.pop("PYTHONIOENCODING", None)
    result = subprocess.run([sys.executable, "-c", "from gradian.cli.main import main; main()", "diagnose",
                             "--dataset", str(workspace.dataset), "--base-model", str(workspace.model),
                             "--config", str(config)], capture_output=True, env=env, timeout=300)
    assert result.returncode == 1, result.stderr.decode()[-2000:]
    assert b"learning_rate" in result.stdout and b"?" in result.stdout and b"Error" not in result.stderr


def test_a_device_out_of_memory_at_one_prompt_a_batch_is_exit_2_naming_what_to_lower(workspace, gradian, monkeypatch,  # noqa: F811
                                                                                       tmp_path):
    import gradian.regression.generation as generation

    sizes = []

    def no_memory(model, tokenizer, prompts, *args):
        sizes.append(len(prompts))
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(generation, "_generate_batch", no_memory)
    result = gradian(attribute_args(workspace, tmp_path / "out", extra=("--generation-batch-size", "4")))
    assert_one_line_error(result, "the device ran out of memory (CUDA out of memory. Tried to allocate 2.00 GiB); "
                                  "lower --batch-size or --generation-batch-size")
    assert sizes == [4, 2, 1]  # halved down to one prompt a batch before it gave up


def test_a_runtime_error_that_is_not_memory_stays_internal(cli_runner, monkeypatch, tmp_path):
    monkeypatch.setenv("GRADIAN_LOG_DIR", str(tmp_path))
    monkeypatch.setattr(diagnose_cli, "diagnose", _crash(RuntimeError("shape mismatch")))
    result = cli_runner.invoke(cli, ARGS)
    assert result.exit_code == 3 and "internal error (RuntimeError: shape mismatch)" in result.stderr, result.output
    monkeypatch.setattr(diagnose_cli, "diagnose", _crash(MemoryError()))
    result = cli_runner.invoke(cli, ARGS)
    assert result.exit_code == 2 and "use a machine with more memory" in result.stderr, result.output
