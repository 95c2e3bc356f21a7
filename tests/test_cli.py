"""The CLI as a whole: every command answers --help, and docs/cli.md is what --help says."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradian.cli.main import _register, cli
from gradian.cli.reference import cli_reference

_register()
DOCS = Path(__file__).resolve().parents[1] / "docs" / "cli.md"


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
