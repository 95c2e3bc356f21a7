"""A fault of Gradian's never stops training: the callback turns itself off, says so in one line with the log holding
the traceback, and the run trains to its end. Its own answers (a critical finding, capture on packed rows) still stop
the run before step one."""

from __future__ import annotations

import pytest

from callback_runs import sft_trainer, tickets
from gradian import GradianCallback
from gradian.callback import callback as callback_module
from gradian.callback.callback import CaptureSetupError
from gradian.callback.record import RunRecorder
from gradian.data.run_record import read_run_record
from gradian.errors import InputError


def boom(*args, **kwargs):
    raise RuntimeError("boom")


def run(tmp_path, monkeypatch, **callback):
    monkeypatch.setenv("GRADIAN_LOG_DIR", str(tmp_path / "logs"))
    lines: list[str] = []
    trainer = sft_trainer(tmp_path / "run", tickets(), callbacks=[GradianCallback(echo=lines.append, **callback)],
                          num_train_epochs=2)
    trainer.train()
    return trainer, lines


def test_a_fault_in_preflight_leaves_training_to_its_end(tmp_path, monkeypatch):
    monkeypatch.setattr(callback_module, "preflight", boom)
    trainer, lines = run(tmp_path, monkeypatch)
    assert trainer.state.global_step == 6  # 12 rows, batch 4, 2 epochs: every step trained
    said = [line for line in lines if "internal error" in line]
    assert len(said) == 1 and "stopped at step 0 on an internal error (RuntimeError: boom)" in said[0]
    assert list((tmp_path / "logs").glob("gradian-crash-*.log")) and "training goes on" in said[0]
    assert read_run_record(tmp_path / "run") is None  # nothing recorded: no record that stops short


def test_a_fault_inside_the_models_forward_is_reported_and_the_record_refused(tmp_path, monkeypatch):
    seen = RunRecorder._seen
    calls = {"n": 0}

    def fails_at_the_fourth(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyError("fed rows")
        return seen(self, *args, **kwargs)

    monkeypatch.setattr(RunRecorder, "_seen", fails_at_the_fourth)
    trainer, lines = run(tmp_path, monkeypatch)
    assert trainer.state.global_step == 6
    said = [line for line in lines if "internal error" in line]
    assert len(said) == 1 and "stopped at step 3 on an internal error (KeyError" in said[0], lines
    with pytest.raises(InputError, match="says GradianCallback stopped at step 3 .*remove it from the run folder"):
        read_run_record(tmp_path / "run")


def test_its_own_answers_still_stop_the_run_before_step_one(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADIAN_LOG_DIR", str(tmp_path / "logs"))
    trainer = sft_trainer(tmp_path / "run", tickets(), callbacks=[GradianCallback(echo=lambda _: None, capture=True)],
                          packing=True)
    with pytest.raises(CaptureSetupError, match="capture=True needs one dataset row per batch row"):
        trainer.train()
    assert trainer.state.global_step == 0
