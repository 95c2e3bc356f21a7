"""Fixtures the bad-input test modules share: the valid tiny world and a CLI invoker (import them by name)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from gradian.cli.main import cli, register_commands


@pytest.fixture(scope="session")
def workspace(tmp_path_factory):
    from bad_inputs.workspace import build_workspace

    return build_workspace(tmp_path_factory.mktemp("world"))


@pytest.fixture(scope="session")
def gradian():
    """Invoke the CLI as a user would; returns click's Result (stdout and stderr kept apart)."""
    if not cli.commands:
        register_commands()
    runner = CliRunner()
    return lambda args: runner.invoke(cli, [str(arg) for arg in args])


def error_line(result) -> str:
    """The last line on stderr: for exit code 2 it must be the whole error, `Error: <one sentence>`."""
    return result.stderr.rstrip("\n").split("\n")[-1]


def assert_no_traceback(result) -> None:
    assert "Traceback" not in result.output, result.output[-3000:]
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)


def assert_one_line_error(result, names: str) -> None:
    """Exit code 2 and exactly one `Error:` line, the last on stderr, naming `names`."""
    assert_no_traceback(result)
    assert result.exit_code == 2, (result.exit_code, result.output[-2000:])
    line = error_line(result)
    assert line.startswith("Error: "), result.stderr[-2000:]
    assert result.stderr.count("Error: ") == 1, result.stderr[-2000:]
    assert names in line, line


def snapshot(*roots, skip: tuple[str, ...] = ("out",)) -> dict[str, tuple[str, int, int, int]]:
    """path → (sha256, size, mtime_ns, mode) of every file under `roots`, skipping folders named in `skip`."""
    import hashlib
    from pathlib import Path

    files: dict[str, tuple[str, int, int, int]] = {}
    for root in map(Path, roots):
        for path in [root] if root.is_file() else sorted(root.rglob("*")):
            if any(part in skip for part in path.relative_to(root.parent).parts) or not path.is_file():
                continue
            stat = path.stat()
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            files[str(path)] = (digest, stat.st_size, stat.st_mtime_ns, stat.st_mode)
    return files
