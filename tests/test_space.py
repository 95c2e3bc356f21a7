"""Free space: a long stage refuses up front, in one sentence, when --out's disk cannot hold what it writes, and a disk
that fills up mid-write is exit code 2 with a sentence saying the rerun resumes (and it does)."""

from __future__ import annotations

import errno
import shutil
from collections import namedtuple

import pytest

from bad_inputs.corpus import attribute_args
from bad_inputs.fixtures import assert_one_line_error, gradian, workspace  # noqa: F401
from gradian.errors import InputError
from gradian.space import IGNORE_VARIABLE, features_bytes, require_space, scores_bytes, size_text
from gradian.verify.run import retrains_bytes

Usage = namedtuple("Usage", "total used free")


def _free(monkeypatch, free: int) -> None:
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 10**12 - free, free))


def test_the_estimates_follow_the_store_and_scores_layouts():
    assert features_bytes(1000, 8192, 2) == 1000 * (8192 * 2 + 1)  # float16 features and one done byte per row
    assert features_bytes(10, 16, 4, stores=3) == 3 * 10 * 65
    assert scores_bytes(7, 1000) == 7 * 1000 * 8
    assert size_text(1_500_000_000) == "1.5 GB" and size_text(12) == "12 bytes"


def test_too_little_space_is_one_sentence_and_the_variable_lifts_it(tmp_path, monkeypatch):
    _free(monkeypatch, 10**6)
    out = tmp_path / "not-yet" / "out"  # its disk is its nearest existing parent's
    with pytest.raises(InputError) as raised:
        require_space(out, 10**9, "gradient extraction")
    message = str(raised.value)
    assert message.startswith(f"{out}: gradient extraction writes about 1.1 GB there but its disk has 1.0 MB free")
    assert IGNORE_VARIABLE in message and "\n" not in message
    require_space(out, 10**9, "gradient extraction", present=10**9)  # a resumed store already holds it
    monkeypatch.setenv(IGNORE_VARIABLE, "1")
    require_space(out, 10**9, "gradient extraction")


def test_verify_estimates_one_adapter_per_retrain(tmp_path):
    (tmp_path / "adapter_model.safetensors").write_bytes(b"x" * 1000)
    assert retrains_bytes(str(tmp_path), 5) == 5000 and retrains_bytes(None, 5) == 0


def test_attribute_refuses_before_generating_when_the_disk_is_too_small(workspace, gradian, monkeypatch, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    _free(monkeypatch, 100)  # the tiny world writes 8 × (16 × 2 + 1) bytes of features and 4 × 8 × 8 of scores
    result = gradian(attribute_args(workspace, out, extra=("--force",)))
    assert_one_line_error(result, f"{out}: gradient extraction (8 rows × 16 values, 1 store, and the scores) writes "
                                  "about 546 bytes there but its disk has 100 bytes free")
    assert IGNORE_VARIABLE in result.stderr and not (out / "generations.jsonl").exists()  # refused before generating
    monkeypatch.setenv(IGNORE_VARIABLE, "1")
    assert gradian(attribute_args(workspace, out, extra=("--force",))).exit_code == 0


def test_a_disk_full_mid_write_is_exit_2_and_the_rerun_resumes(workspace, gradian, monkeypatch, tmp_path):  # noqa: F811
    import gradian.gradients.store as store

    out = tmp_path / "out"
    calls = []

    def full(path, size):
        calls.append(path)
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(store, "preallocate", full)
    result = gradian(attribute_args(workspace, out, extra=("--force",)))
    assert calls, "the store never reserved its files"
    assert_one_line_error(result, f"the disk filled up while writing {calls[0]}")
    assert "run the same command again, it resumes from there" in result.stderr
    assert (out / "generations.jsonl").exists()  # what was finished is kept
    monkeypatch.undo()
    again = gradian(attribute_args(workspace, out, extra=("--force",)))
    assert again.exit_code == 0, again.output[-2000:]
    assert (out / "report.json").exists()


def test_extract_refuses_before_its_gradients_when_the_disk_is_too_small(workspace, gradian, monkeypatch, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    _free(monkeypatch, 100)
    result = gradian(["extract", "--base-model", workspace.model, "--adapter", workspace.adapter, "--dataset",
                      workspace.dataset, "--out", out, "--proj-dim", "16"])
    assert_one_line_error(result, f"{out}: gradient extraction (8 rows × 16 values, 1 store) writes about 277 bytes")
    assert not (out / "gradients").exists()
