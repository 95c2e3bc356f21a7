"""Plug-in code is contained: a plug-in that exits, raises or prints never makes a run exit 0 with nothing checked,
never breaks `--json`, and is named in one sentence (exit code 2)."""

from __future__ import annotations

import json
import textwrap
from importlib.metadata import EntryPoint

import pytest

from bad_inputs.fixtures import assert_one_line_error, gradian, workspace  # noqa: F401
from gradian.errors import InputError

SCRIPT = """
import sys

def score(output, reference):
    return 1.0

def main():
    print("scored nothing")
    return 0

sys.exit(main())
"""


def _plugin(tmp_path, text: str, name: str = "yes_no.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return f"{path}:score"


def _diagnose(ws, capability: str, *extra: str) -> list:
    return ["diagnose", "--dataset", ws.dataset, "--base-model", ws.model, "--capability", capability, *extra]


def test_a_plugin_script_that_exits_at_import_is_bad_input(workspace, gradian, tmp_path):  # noqa: F811
    result = gradian(_diagnose(workspace, _plugin(tmp_path, SCRIPT), "--json"))
    assert_one_line_error(result, "yes_no.py")
    assert 'if __name__ == "__main__":' in result.stderr and "sys.exit(0)" in result.stderr
    assert result.stdout == ""  # its print went to stderr


@pytest.mark.parametrize("body,words", [
    ("def score(output, reference):\n    raise SystemExit(0)\n", "called sys.exit(0) while scoring"),
    ("def score(output, reference):\n    raise GeneratorExit('done')\n", "GeneratorExit"),
    ("class Stop(BaseException):\n    pass\n\nraise Stop('at import')\n", "Stop: at import"),
], ids=["exit-while-scoring", "base-exception-while-scoring", "base-exception-at-import"])
def test_a_plugin_that_raises_any_base_exception_is_bad_input(body, words, workspace, gradian, tmp_path):  # noqa: F811
    result = gradian(_diagnose(workspace, _plugin(tmp_path, body)))
    assert_one_line_error(result, "yes_no.py")
    assert words in result.stderr, result.stderr


def test_a_plugin_that_prints_keeps_json_valid(workspace, gradian, tmp_path):  # noqa: F811
    plugin = _plugin(tmp_path, """
        print("loading my plug-in")

        def score(output, reference):
            print("scoring", output[:10])
            return 1.0
    """)
    result = gradian(_diagnose(workspace, plugin, "--json"))
    assert result.exit_code in (0, 1), result.output
    payload = json.loads(result.stdout)
    assert payload["findings"] is not None
    assert "loading my plug-in" in result.stderr and "scoring" in result.stderr


def test_an_installed_plugin_that_exits_at_import_is_bad_input(tmp_path, monkeypatch, capsys):
    from gradian import plugins
    from gradian.capabilities import get_capability

    (tmp_path / "exiting_plugin_for_gradian.py").write_text(SCRIPT)
    monkeypatch.syspath_prepend(str(tmp_path))
    point = EntryPoint(name="exiting", value="exiting_plugin_for_gradian:score", group=plugins.CAPABILITIES)
    monkeypatch.setattr(plugins, "entry_points", lambda group: [point] if group == plugins.CAPABILITIES else [])
    with pytest.raises(InputError, match=r"'exiting'.*exits while it is imported.*__name__ == \"__main__\""):
        get_capability("json_formatting")
    assert "scored nothing" in capsys.readouterr().err


def test_an_installed_capability_is_called_as_plugin_code(tmp_path, monkeypatch, capsys):
    from gradian import plugins
    from gradian.capabilities import get_capability

    (tmp_path / "noisy_plugin_for_gradian.py").write_text(textwrap.dedent("""
        from gradian.capabilities import Capability

        class Noisy(Capability):
            name = "noisy"

            def __init__(self, argument=None):
                pass

            def score(self, output, reference):
                print("noise on stdout")
                if output == "exit":
                    raise SystemExit(3)
                return 1.0
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    point = EntryPoint(name="noisy", value="noisy_plugin_for_gradian:Noisy", group=plugins.CAPABILITIES)
    monkeypatch.setattr(plugins, "entry_points", lambda group: [point] if group == plugins.CAPABILITIES else [])
    capability = get_capability("noisy")
    assert capability.score("fine", None) == 1.0 and capability.name == "noisy"
    out = capsys.readouterr()
    assert out.out == "" and "noise on stdout" in out.err
    with pytest.raises(InputError, match=r"'noisy'.*called sys.exit\(3\) while scoring"):
        capability.score("exit", None)


def test_a_plugin_check_that_exits_is_bad_input(workspace, gradian):  # noqa: F811
    from gradian.audit.registry import check, unregister_check

    def exits(ctx):
        print("checking")
        raise SystemExit(0)

    exits.__module__ = "team_checks"
    check("team_exits", category="per-row")(exits)
    try:
        result = gradian(["diagnose", "--dataset", workspace.dataset, "--base-model", workspace.model, "--json"])
    finally:
        unregister_check("team_exits")
    assert_one_line_error(result, "'team_exits'")
    assert result.stdout == "" and "checking" in result.stderr
