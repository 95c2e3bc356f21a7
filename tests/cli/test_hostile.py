"""Hostile files: pickles in a run folder that would create a file if Gradian ever executed them.

`training_args.bin` is read by `diagnose` with a code-free unpickler; `optimizer.pt` is read by
`attribute --preconditioner adam` with `torch.load(weights_only=True)`; `adapter_model.bin` with the same.
Each test asserts the marker file never appears and that Gradian says what it could and could not read.
"""

from __future__ import annotations

import builtins
import json
import os
import pickle
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from bad_inputs.corpus import attribute_args
from bad_inputs.fixtures import assert_no_traceback, assert_one_line_error, gradian, workspace  # noqa: F401


class Payload:
    """Unpickling this calls `call(*args)`: what an attacker's file does on a naive `pickle.load`."""

    def __init__(self, call, *args) -> None:
        self.call, self.args = call, args

    def __reduce__(self):
        return self.call, self.args


def payloads(marker: Path) -> dict[str, Payload]:
    return {
        "os-system": Payload(os.system, f"touch {marker}"),
        "open-for-writing": Payload(builtins.open, str(marker), "w"),
        "exec": Payload(builtins.exec, f"open({str(marker)!r}, 'w').close()"),
        "subprocess": Payload(subprocess.call, ["touch", str(marker)]),
    }


def write_pickle(path: Path, value: object, fmt: str) -> None:
    if fmt == "torch-save":
        torch.save(value, path)
    else:
        path.write_bytes(pickle.dumps(value, protocol=2 if fmt == "pickle-2" else 4))


FORMATS = ("torch-save", "pickle-4", "pickle-2")
CALLS = ("os-system", "open-for-writing", "exec", "subprocess")


def _run_copy(ws, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(ws.run, run)
    return run


@pytest.mark.parametrize(("call", "fmt"), [(c, f) for c in CALLS for f in FORMATS],
                         ids=[f"hostile-training-args-{c}-{f}" for c in CALLS for f in FORMATS])
def test_training_args_payload_never_runs(call, fmt, workspace, gradian, tmp_path):  # noqa: F811
    """The whole file is the payload: nothing can be read from it, and diagnose says so, exit code unchanged."""
    marker = tmp_path / "pwned"
    run = _run_copy(workspace, tmp_path)
    write_pickle(run / "training_args.bin", payloads(marker)[call], fmt)
    result = gradian(["diagnose", "--dataset", str(workspace.dataset), "--base-model", str(workspace.model),
                      "--run", str(run), "--json"])
    assert not marker.exists(), "unpickling training_args.bin ran code"
    assert_no_traceback(result)
    assert result.exit_code == 0, result.output
    unreadable = json.loads(result.stdout)["unreadable"]
    assert len(unreadable) == 1 and "training_args.bin" in unreadable[0], unreadable


@pytest.mark.parametrize("call", CALLS, ids=[f"hostile-training-args-field-{c}" for c in CALLS])
def test_training_args_fields_read_around_payload(call, workspace, gradian, tmp_path):  # noqa: F811
    """A payload hidden in one field: the other fields are read (max_length 333 shows up), the payload is inert."""
    marker = tmp_path / "pwned"
    run = _run_copy(workspace, tmp_path)
    write_pickle(run / "training_args.bin", {"max_length": 333, "learning_rate": 3e-4, "hook": payloads(marker)[call]},
                 "torch-save")
    result = gradian(["diagnose", "--dataset", str(workspace.dataset), "--base-model", str(workspace.model),
                      "--run", str(run), "--json"])
    assert not marker.exists(), "unpickling training_args.bin ran code"
    assert_no_traceback(result)
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["unreadable"] == []
    assert payload["setup"]["max_length"] == 333 and payload["setup"]["learning_rate"] == 3e-4
    assert "max_length" not in payload["assumed"]


def _hostile_optimizer(workspace, gradian, tmp_path: Path, call: str):  # noqa: F811
    marker = tmp_path / "pwned"
    run = _run_copy(workspace, tmp_path)
    state = {"state": {0: {"exp_avg_sq": torch.ones(2, 32), "step": torch.tensor(4.0)}},
             "param_groups": [{"params": [0], "betas": (0.9, 0.999), "eps": 1e-8}], "hook": payloads(marker)[call]}
    torch.save(state, run / "optimizer.pt")
    args = attribute_args(workspace, tmp_path / "out", extra=("--run", str(run), "--preconditioner", "adam", "--force"))
    return marker, gradian(args)


@pytest.mark.parametrize("call", ("os-system", "open-for-writing"), ids=lambda c: f"hostile-optimizer-{c}")
def test_optimizer_payload_never_runs(call, workspace, gradian, tmp_path):  # noqa: F811
    """attribute --preconditioner adam reads optimizer.pt with weights_only=True: refused, exit 2, nothing runs."""
    marker, result = _hostile_optimizer(workspace, gradian, tmp_path, call)
    assert not marker.exists(), "loading optimizer.pt ran code"
    assert_no_traceback(result)
    assert result.exit_code == 2 and "optimizer.pt: cannot read optimizer state" in result.stderr, result.stderr


def test_optimizer_refusal_is_one_sentence(workspace, gradian, tmp_path):  # noqa: F811
    marker, result = _hostile_optimizer(workspace, gradian, tmp_path, "os-system")
    assert not marker.exists()
    assert_one_line_error(result, "optimizer.pt")


@pytest.mark.parametrize("call", ("os-system", "exec"), ids=lambda c: f"hostile-adapter-bin-{c}")
def test_adapter_bin_payload_never_runs(call, workspace, gradian, tmp_path):  # noqa: F811
    """An adapter saved as a pickle (adapter_model.bin) that carries a payload: refused, nothing runs."""
    marker = tmp_path / "pwned"
    adapter = tmp_path / "adapter"
    shutil.copytree(workspace.adapter, adapter)
    (adapter / "adapter_model.safetensors").unlink()
    torch.save({"base_model.model.x.lora_A.weight": torch.zeros(2, 2), "hook": payloads(marker)[call]},
               adapter / "adapter_model.bin")
    result = gradian(attribute_args(workspace, tmp_path / "out", adapter=adapter, extra=("--force",)))
    assert not marker.exists(), "loading adapter_model.bin ran code"
    assert_one_line_error(result, "adapter_model.bin")


def test_payloads_would_run(tmp_path):
    """Guard against a vacuous test: a naive pickle.load of each payload does create the marker."""
    for name, payload in payloads(tmp_path / "pwned").items():
        marker = tmp_path / "pwned"
        marker.unlink(missing_ok=True)
        pickle.loads(pickle.dumps(payload))
        assert marker.exists(), name
