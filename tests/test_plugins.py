"""Plug-ins a team ships: the example package installed into a throwaway venv, found there with no flag."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "gradian-example-checks"

PROBE = """
import json
from gradian.audit import AuditContext
from gradian.audit.registry import run_checks
from gradian.data.examples import Example
from gradian.data.render import render_dataset
from gradian.data.setup import TrainingSetup
from gradian.capabilities import available_capabilities, get_capability
from gradian.scenarios.tokenizer import build_tokenizer

tokenizer = build_tokenizer(["yes", "no", "todo", "my", "order"])
rows = [Example("a", 1, {"prompt": "my order", "completion": " yes"}),
        Example("b", 2, {"prompt": "my order", "completion": " TODO"})]
ctx = AuditContext(rows, render_dataset(rows, tokenizer, TrainingSetup()), tokenizer, TrainingSetup())
found = [f.to_dict() for f in run_checks(ctx) if f.check == "todo_in_answer"]
capability = get_capability("yes_no:strict")
print(json.dumps({"capabilities": available_capabilities(), "findings": found,
                  "scores": [capability.score("Yes.", "yes"), capability.score("maybe", "yes")]}))
"""


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A venv over the running one's packages (a .pth file: `--system-site-packages` of a venv would reach only the
    base interpreter's), with the example installed the way a team installs its package."""
    folder = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    (Path(purelib) / "shared.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", str(EXAMPLE)], check=True, env={**os.environ, "PIP_NO_CACHE_DIR": "1"},
                   capture_output=True)
    return python


def test_installed_plugins_are_found_with_no_flag(venv):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([str(venv), "-c", PROBE], check=True, capture_output=True, text=True, env=env, cwd=ROOT)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert "yes_no" in result["capabilities"] and "json_formatting" in result["capabilities"]
    assert result["scores"] == [1.0, 0.0]
    (finding,) = result["findings"]
    assert finding["example_ids"] == ["b"] and finding["category"] == "per-row"


def test_without_the_package_neither_is_there():
    from gradian.capabilities import available_capabilities

    assert "yes_no" not in available_capabilities()


def test_a_check_must_declare_its_category():
    from gradian import check

    with pytest.raises(ValueError, match="category"):
        check("no_category_given")


def test_a_plugin_that_fails_to_load_is_bad_input(monkeypatch):
    from importlib.metadata import EntryPoint

    from gradian import plugins
    from gradian.audit.registry import load_built_in
    from gradian.errors import InputError

    broken = EntryPoint(name="broken", value="no_such_module_for_gradian:check", group=plugins.CHECKS)
    monkeypatch.setattr(plugins, "entry_points", lambda group: [broken] if group == plugins.CHECKS else [])
    with pytest.raises(InputError, match="'broken'.*failed to load.*no_such_module_for_gradian"):
        load_built_in()
