"""GradianCallback(capture=True) on a real TRL SFTTrainer run in float64: each step's stored features equal a naive
per-row `torch.autograd.grad` of the row's summed token NLL at that step's weights, times the step's learning rate
and Adam's 1/(√v̂ + ε); a store cut short (by hand, or by a real SIGKILL inside a write) refuses in one sentence, and
a SIGKILL between stores leaves the steps before it.

SFTConfig turns bf16 autocast on by default (on a CPU too): the run here turns it off so the step is float64."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import TrainerCallback

from callback_runs import sft_trainer, tickets
from gradian import GradianCallback
from gradian.callback.capture import CAPTURE_DIR, captured_store, captured_stores, step_slices, tracin_features
from gradian.data.run_record import read_run_record
from gradian.errors import InputError
from gradian.gradients.distributed import Ranks
from gradian.gradients.extract import make_projector, summed_nll
from gradian.gradients.hooks import lora_matrices
from gradian.gradients.settings import GradientSettings
from gradian.stages import captured_extraction


class Snapshots(TrainerCallback):
    """The LoRA weights each step starts from, and Adam's state and rate right after its update."""

    def __init__(self):
        self.weights, self.adam = {}, {}

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        self.weights[state.global_step + 1] = [m.module.weight.detach().clone() for m in lora_matrices(model)]

    def on_optimizer_step(self, args, state, control, model=None, optimizer=None, **kwargs):
        inner = getattr(optimizer, "optimizer", optimizer)
        group = inner.param_groups[0]
        states = [inner.state[m.module.weight] for m in lora_matrices(model)]
        self.adam[state.global_step + 1] = (group["lr"], group["betas"][1], group["eps"],
                                            [(s["exp_avg_sq"].clone(), float(s["step"])) for s in states])


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    out = tmp_path_factory.mktemp("capture")
    snapshots = Snapshots()
    exact = GradientSettings(proj_dim=None, store_dtype="float32")
    trainer = sft_trainer(out, tickets(8), dtype=torch.float64, bf16=False, per_device_train_batch_size=2,
                          gradient_accumulation_steps=2, callbacks=[snapshots, GradianCallback(
                              capture=True, capture_settings=exact, echo=lambda _: None)])
    trainer.train()
    return out, trainer, snapshots


def naive_features(trainer, snapshots, step, rows) -> np.ndarray:
    """Row by row: autograd of the summed token NLL at the step's weights, scaled as Adam's update scales it."""
    model = trainer.model
    matrices = lora_matrices(model)
    saved = [m.module.weight.detach().clone() for m in matrices]
    lr, beta2, eps, states = snapshots.adam[step]
    out = []
    with torch.no_grad():
        for matrix, weight in zip(matrices, snapshots.weights[step], strict=True):
            matrix.module.weight.copy_(weight)
    for index in rows:
        row = trainer.train_dataset[index]
        ids, labels = torch.tensor([row["input_ids"]]), torch.tensor([row["labels"]])
        loss = summed_nll(model(input_ids=ids).logits, labels)
        grads = torch.autograd.grad(loss, [m.module.weight for m in matrices])
        scaled = [g * lr / ((v / (1 - beta2**t)).sqrt() + eps) for g, (v, t) in zip(grads, states, strict=True)]
        out.append(torch.cat([s.flatten() for s in scaled]).detach().numpy())
    with torch.no_grad():
        for matrix, weight in zip(matrices, saved, strict=True):
            matrix.module.weight.copy_(weight)
    return np.stack(out)


def test_captured_features_equal_a_float64_reference(captured):
    out, trainer, snapshots = captured
    (store,) = captured_stores(out)  # both steps kept, written as one store at the end of training
    assert trainer.state.global_step == 2 and store.meta["scale"] == "adam"
    assert [(step, part.stop - part.start) for step, part in step_slices(store)] == [(1, 4), (2, 4)]
    for step, part in step_slices(store):
        rows = [int(i) for i in list(store.ids)[part]]
        reference = naive_features(trainer, snapshots, step, rows)
        features = store.rows(part.start, part.stop)
        assert np.abs(reference).max() > 0
        np.testing.assert_allclose(features, reference, rtol=1e-5, atol=1e-7 * np.abs(reference).max())


def test_a_checkpoint_writes_the_steps_before_it(tmp_path):
    """A run resumed from a checkpoint recomputes only the steps after it, so those before are on disk."""
    trainer = sft_trainer(tmp_path, tickets(12), save_strategy="steps", save_steps=2, callbacks=[GradianCallback(
        capture=True, capture_settings=GradientSettings(proj_dim=64), echo=lambda _: None)])
    trainer.train()
    stores = captured_stores(tmp_path)
    assert [[step for step, _ in step_slices(store)] for store in stores] == [[1, 2], [3]]
    assert [store.root.name for store in stores] == ["step-000001", "step-000003"]


def test_kept_steps_are_written_every_chunk(tmp_path, monkeypatch):
    monkeypatch.setattr("gradian.callback.capture.CHUNK_STEPS", 2)
    trainer = sft_trainer(tmp_path, tickets(12), callbacks=[GradianCallback(
        capture=True, capture_settings=GradientSettings(proj_dim=64), echo=lambda _: None)])
    trainer.train()
    assert [[step for step, _ in step_slices(s)] for s in captured_stores(tmp_path)] == [[1, 2], [3]]


def test_tracin_features_sum_each_rows_steps(captured):
    out, _, _ = captured
    total = tracin_features(out, 8)
    expected = np.zeros_like(total)
    for store in captured_stores(out):
        for position, index in enumerate(store.ids):
            expected[int(index)] += store.rows(position, position + 1)[0]
    np.testing.assert_allclose(total, expected)
    assert (np.abs(total).sum(1) > 0).all()  # one epoch: every row trained once, so every row has a feature


def test_a_store_cut_short_refuses_in_one_sentence(captured, tmp_path):
    out, _, _ = captured
    copy = tmp_path / "run"
    import shutil

    shutil.copytree(out / CAPTURE_DIR, copy / CAPTURE_DIR)
    (done,) = (copy / CAPTURE_DIR / "step-000001").glob("*.done.npy")
    flags = np.load(done, mmap_mode="r+")
    flags[5:] = False  # what a kill between the features and their flags leaves
    flags.flush()
    with pytest.raises(InputError, match=r"step-000001: was cut short by a kill \(5 of 8 rows written\); resume"):
        captured_stores(copy)


def killed_run(tmp_path: Path, when: str) -> Path:
    """A captured 4-step run SIGKILLed by tests/callback/callback_kill_worker.py at `when`."""
    out = tmp_path / when
    worker = Path(__file__).parent / "callback_kill_worker.py"
    done = subprocess.run([sys.executable, str(worker), str(out), when], env={**os.environ, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == -9, done.stderr[-3000:]
    return out


def test_a_kill_inside_a_store_write_refuses_in_one_sentence(tmp_path):
    out = killed_run(tmp_path, "mid-write")
    with pytest.raises(InputError, match=r"step-000003: was cut short by a kill \(2 of 4 rows written\); resume"):
        tracin_features(out, 16)


def test_a_kill_between_stores_leaves_the_steps_before_it(tmp_path):
    out = killed_run(tmp_path, "between-stores")
    stores = captured_stores(out)
    assert [[step for step, _ in step_slices(store)] for store in stores] == [[1], [2]]
    trained = np.abs(tracin_features(out, 16)).sum(1) > 0
    assert trained.sum() == 8  # the 8 rows of steps 1 and 2, each once


def test_the_captured_store_is_the_files_rows_by_id(captured, tmp_path):
    """`attribute --checkpoints captured` scores this store: row i of the training file holds the captured
    features of the trainer's row with its id, whatever order the file lists them in."""
    out, _, _ = captured
    ids = [f"t{i}" for i in (5, 0, 7, 2, 1, 6, 3, 4)]
    store = captured_store(out, ids, tmp_path / "store", read_run_record(out))
    by_index = tracin_features(out, 8)
    np.testing.assert_allclose(store.rows(0, 8), by_index[[int(i[1:]) for i in ids]], rtol=1e-6)
    assert list(store.ids) == ids and store.meta["captured"] == {"steps": 2}
    with pytest.raises(InputError, match="trained on a row with id 't7' that the dataset does not hold"):
        captured_store(out, ids[:2] + ids[3:], tmp_path / "short", read_run_record(out))
    with pytest.raises(InputError, match="trained on 8 rows but the dataset holds 7"):
        captured_store(out, ids[:7], tmp_path / "unrecorded", None)


def test_captured_extraction_projects_queries_as_the_capture_did(captured, tmp_path):
    """The queries are projected with the capture's own projection, so qᵀ(Σ features) is TracIn in one space."""
    out, trainer, _ = captured

    audit = SimpleNamespace(examples=[SimpleNamespace(id=f"t{i}") for i in range(8)],
                            run=SimpleNamespace(path=out, record=read_run_record(out)))
    extraction = captured_extraction(SimpleNamespace(out_dir=tmp_path, adapter=str(out)), audit, Ranks())
    assert extraction.captured_steps == 2 and extraction.tracin["captured_steps"] == 2
    assert make_projector(trainer.model, extraction.gradient).to_dict() == extraction.store.meta["projection"]


def test_a_run_under_bf16_autocast_is_captured(tmp_path):
    """SFTConfig turns bf16 autocast on by default, on a CPU too: its per-example gradients come out in bf16 and are
    projected and stored in float32."""
    trainer = sft_trainer(tmp_path, tickets(4), bf16=True, max_steps=1, callbacks=[GradianCallback(
        capture=True, capture_settings=GradientSettings(proj_dim=64), echo=lambda _: None)])
    trainer.train()
    (store,) = captured_stores(tmp_path)
    features = store.rows(0, store.n_rows)
    assert features.shape == (4, store.dim) and np.isfinite(features).all() and np.abs(features).sum() > 0


def rows_by_step(stores) -> dict[int, list[int]]:
    """step -> the dataset indices it trained on, over every store (every rank's)."""
    out: dict[int, list[int]] = {}
    for store in stores:
        ids = list(store.ids)
        for step, part in step_slices(store):
            out.setdefault(step, []).extend(int(i) for i in ids[part])
    return {step: sorted(rows) for step, rows in out.items()}


def test_torchrun_capture_writes_a_store_per_rank_equal_to_one_process(tmp_path):
    """Under torchrun (2 gloo processes, 2 rows each a step) each rank writes its own rows' store, and together they
    hold what one process training the same 4 rows a step captures: every row once, at the same step, with the
    same features (float64 runs: the two runs' weights differ only by the order DDP adds the gradients in)."""
    worker = Path(__file__).parent / "callback_distributed_worker.py"
    two = tmp_path / "two"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(worker),
               str(two), "capture"]
    done = subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    exact = GradientSettings(proj_dim=None, store_dtype="float32")
    one = sft_trainer(tmp_path / "one", tickets(16), dtype=torch.float64, bf16=False, per_device_train_batch_size=4,
                      callbacks=[GradianCallback(capture=True, capture_settings=exact, echo=lambda _: None)])
    one.train()

    stores = captured_stores(two)
    assert [store.root.name for store in stores] == ["step-000001", "step-000001-rank-1"]
    assert [[(step, part.stop - part.start) for step, part in step_slices(s)] for s in stores] == [
        [(step, 2) for step in (1, 2, 3, 4)]] * 2
    (alone,) = captured_stores(tmp_path / "one")
    assert rows_by_step(stores) == rows_by_step([alone])  # the same 4 rows at each step
    assert sorted(i for rows in rows_by_step(stores).values() for i in rows) == list(range(16))  # every row once

    shared, single = tracin_features(two, 16), tracin_features(tmp_path / "one", 16)
    assert np.abs(single).sum(1).min() > 0
    np.testing.assert_allclose(shared, single, rtol=1e-6, atol=1e-9 * np.abs(single).max())
