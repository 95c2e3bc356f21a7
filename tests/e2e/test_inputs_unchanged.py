"""The user's inputs are never modified: every input file's hash, size, mtime and mode are equal before and after.

`diagnose` and `attribute` run end to end (attribute with --force, so every stage runs: regression,
gradients, scores, clusters, report) on the tiny world, with a run folder holding a config, a
training_args.bin and an optimizer.pt; no file appears in, or disappears from, an input folder.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from bad_inputs.corpus import attribute_args
from bad_inputs.fixtures import assert_no_traceback, gradian, snapshot, workspace  # noqa: F401


@pytest.fixture
def inputs(workspace, tmp_path):  # noqa: F811
    """A private copy of every input (so a change cannot leak into other tests), with a fuller run folder."""
    root = tmp_path / "inputs"
    for name in ("base", "adapter", "run", "train.jsonl", "eval.jsonl"):
        source = workspace.root / name
        (shutil.copytree if source.is_dir() else shutil.copy2)(source, root / name)
    run = root / "run"
    (run / "sft_config.yaml").write_text("max_length: 256\nlearning_rate: 0.0002\nnum_train_epochs: 2\n")
    torch.save({"learning_rate": 2e-4, "max_length": 256}, run / "training_args.bin")
    (run / "optimizer.pt").write_bytes(b"not read unless --preconditioner adam")
    return root


def test_diagnose_leaves_inputs_unchanged(inputs, gradian, tmp_path):  # noqa: F811
    before = snapshot(inputs)
    result = gradian(["diagnose", "--dataset", inputs / "train.jsonl", "--eval-dataset", inputs / "eval.jsonl",
                      "--run", inputs / "run", "--base-model", inputs / "base", "--json", "--out", tmp_path / "out"])
    assert_no_traceback(result)
    assert result.exit_code in (0, 1), result.output[-2000:]
    assert json.loads(result.stdout)["setup"]["source"].endswith("sft_config.yaml")  # the run folder was read
    assert snapshot(inputs) == before


def test_attribute_leaves_inputs_unchanged(inputs, gradian, tmp_path):  # noqa: F811
    before = snapshot(inputs)
    out = tmp_path / "out"
    args = attribute_args(workspace_like(inputs), out, extra=("--run", str(inputs / "run"), "--force"))
    result = gradian(args)
    assert_no_traceback(result)
    assert result.exit_code == 0, result.output[-3000:]
    assert (out / "report.json").is_file() and (out / "scores.npy").is_file()  # every stage ran
    assert snapshot(inputs) == before


def workspace_like(root):
    from bad_inputs.workspace import Workspace

    return Workspace(root, root / "base", root / "adapter", root / "run", root / "train.jsonl", root / "eval.jsonl")
