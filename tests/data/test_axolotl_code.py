"""Gradian never hands axolotl a dataset `type` that would make axolotl import code from outside its own prompt
strategies (`data.axolotl_code._runs_code`), pinned against axolotl's own loader where axolotl is installed."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import pytest

from bad_inputs.fixtures import workspace  # noqa: F401
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


@pytest.mark.skipif(importlib.util.find_spec("axolotl") is None, reason="axolotl is not installed (a venv of its own)")
@pytest.mark.parametrize("shape", ["alpaca", "chat_template chatml, ShareGPT"])
def test_eval_prompts_and_answers_by_its_own_strategy(shape, workspace, tmp_path):  # noqa: F811
    """An eval row in its entry's format is tokenized by the entry's own strategy: the prompt is the port's, and the
    answer is what axolotl trains (the port's, less an untrained tail)."""
    from benchmarks.harness.axolotl_conformance import write_shape
    from gradian.data.axolotl import axolotl_answer
    from gradian.data.base_model import load_tokenizer, resolve_base_model
    from gradian.data.examples import read_dataset
    from gradian.data.render import axolotl_options, render_prompt, render_with_answer
    from gradian.data.run_folder import read_run

    tokenizer_dir = workspace.model
    config = write_shape(tmp_path, shape, tokenizer_dir)
    setup, tokenizer = read_run(None, config).setup, load_tokenizer(resolve_base_model(str(tokenizer_dir)))
    rows = read_dataset(config.parent / "train.jsonl", eval_set=True)[:4]
    for row in rows:
        port_prompt, port_answer = axolotl_answer(row, "the answer", tokenizer, axolotl_options(setup))
        prompt, answer = render_with_answer(row, "the answer", tokenizer, setup)
        assert render_prompt(row, tokenizer, setup) == prompt == port_prompt
        assert answer and port_answer[: len(answer)] == answer
