"""Gradian never hands axolotl a dataset `type` that would make axolotl import code from outside its own prompt
strategies (`data.axolotl_code._runs_code`), pinned against axolotl's own loader where axolotl is installed."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import pytest

from gradian.data.axolotl_code import _runs_code

# type -> whether axolotl's loader imports a package outside axolotl.prompt_strategies for it
TYPES = {
    "alpaca": False, "chat_template": False, "alpaca_chat.load_qa": False, "alpaca_w_system.load_open_orca": False,
    "completion": False, "user_defined.load": False, "a.b.load_x": False, "mypkg.strategy": True,
    "mypkg.sub.strategy": True, "mypkg.loader": True, "mypkg.strategy:chatml": True,
}


@pytest.mark.parametrize(("kind", "runs"), TYPES.items(), ids=list(TYPES))
def test_the_rule(kind, runs):
    assert _runs_code({"type": kind}) is runs
    assert not _runs_code({"type": {"field_instruction": "q", "format": "{instruction}"}})  # format strings: none


@pytest.mark.skipif(importlib.util.find_spec("axolotl") is None, reason="axolotl is not installed (a venv of its own)")
@pytest.mark.parametrize("kind", list(TYPES))
def test_the_rule_is_axolotls_loader(kind, monkeypatch):
    """What axolotl's `prompt_strategies.load` itself imports for the type, recorded (a package outside axolotl is
    never imported here: it is reported as not found)."""
    from axolotl import prompt_strategies

    imported: list[str] = []
    real = importlib.import_module

    def record(name, package=None):
        if sys._getframe(1).f_code is not prompt_strategies.load.__code__:  # an import of the strategy's own
            return real(name, package)
        absolute = importlib.util.resolve_name(name, package) if name.startswith(".") else name
        imported.append(absolute)
        if not absolute.startswith("axolotl."):
            raise ModuleNotFoundError(absolute)  # what a user's package would be: never imported here
        return real(name, package)

    monkeypatch.setattr(prompt_strategies.importlib, "import_module", record)
    try:
        prompt_strategies.load(kind.partition(":")[0], None, None, {})
    except Exception:  # noqa: BLE001 - a strategy given no tokenizer fails after its import: only the import counts
        pass
    outside = any(not name.startswith("axolotl.") for name in imported)
    assert outside is _runs_code({"type": kind}), imported
