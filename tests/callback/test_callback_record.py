"""gradian_run.json on real TRL SFTTrainer runs: the order and learning rates it records equal what the run did,
the readers give them back, and a run replayed from the record reproduces the adapter bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from trl import SFTTrainer

from callback_runs import sft_trainer, tickets
from gradian import GradianCallback
from gradian.callback.record import fed_rows
from gradian.data.replay import RecordedOrderSampler
from gradian.data.run_record import read_run_record, row_hash
from gradian.errors import InputError

SETTINGS = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, "num_train_epochs": 2,
            "save_strategy": "epoch"}


class LoggingCollator:
    """The trainer's collator, logging the rows of every batch it is asked to build (what the run really fed)."""

    def __init__(self, inner):
        self.inner, self.batches = inner, []

    def __call__(self, features):
        self.batches.append([list(f["input_ids"]) for f in features])
        return self.inner(features)


def quiet() -> GradianCallback:
    return GradianCallback(echo=lambda _: None)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A 2-epoch run (batch 2, accumulation 2) with the callback; the batches its collator built."""
    out = tmp_path_factory.mktemp("run")
    trainer = sft_trainer(out, tickets(), callbacks=[quiet()], **SETTINGS)
    logger = LoggingCollator(trainer.data_collator)
    trainer.data_collator = logger
    trainer.train()
    trainer.save_model(str(out))
    trainer.save_state()
    return out, trainer, logger.batches


def test_order_equals_what_the_collator_fed(recorded):
    out, trainer, batches = recorded
    batches = [b for b in batches if len(b) == 2]  # preflight put all 12 rows through the collator once, first
    record = read_run_record(out)
    assert record is not None and record.data["complete"] is True
    per_epoch = len(batches) // 2
    fed = []  # batches grouped into optimizer steps: 2 micro-batches each, epoch by epoch
    for epoch in range(2):
        epoch_batches = batches[epoch * per_epoch : (epoch + 1) * per_epoch]
        fed += [sum(epoch_batches[i : i + 2], []) for i in range(0, per_epoch, 2)]
    assert len(record.steps) == len(fed) == trainer.state.global_step == 6
    dataset = trainer.train_dataset
    assert [[dataset[i]["input_ids"] for i in rows] for rows in record.order] == fed
    assert [step["hashes"] for step in record.steps] == [[row_hash(r) for r in step] for step in fed]
    assert [step["epoch"] for step in record.steps] == [0, 0, 0, 1, 1, 1]
    assert sorted(i for rows in record.order[:3] for i in rows) == list(range(12))  # each row once per epoch
    assert record.epochs == [[i for rows in record.order[:3] for i in rows], [i for rows in record.order[3:] for i in rows]]


def test_learning_rates_equal_the_logged_ones(recorded):
    out, trainer, _ = recorded
    logged = {row["step"]: row["learning_rate"] for row in trainer.state.log_history if "learning_rate" in row}
    rates = list(read_run_record(out).learning_rates.values())
    assert read_run_record(out).learning_rates == {step: logged[step] for step in range(1, 7)}
    assert rates[0] == pytest.approx(5e-3) and rates[-1] < rates[0]  # the linear schedule, step by step


def test_record_holds_collator_tokenizer_and_settings(recorded):
    out, _, _ = recorded
    data = read_run_record(out).data
    assert data["trainer"]["class"] == "trl.trainer.sft_trainer.SFTTrainer"
    assert data["trainer"]["versions"]["trl"] and data["trainer"]["versions"]["peft"]
    assert data["collator"]["class"].endswith("test_callback_record.LoggingCollator")
    assert data["tokenizer"]["eos"] == {"token": "</s>", "id": 3} and data["tokenizer"]["pad"]["id"] == 0
    assert data["rendering"]["max_length"] == 64 and data["rendering"]["truncation_mode"] == "keep_start"
    assert data["seeds"] == {"seed": 0, "data_seed": None} and data["gradient_accumulation_steps"] == 2
    assert data["dataset"] == {"rows": 12, "ids": [f"t{i}" for i in range(12)]}


def test_each_checkpoint_holds_the_steps_so_far(recorded):
    out, _, _ = recorded
    first = json.loads((out / "checkpoint-3" / "gradian_run.json").read_text())
    assert [s["step"] for s in first["steps"]] == [1, 2, 3] and first["complete"] is False
    assert read_run_record(out / "checkpoint-3").order == read_run_record(out).order[:3]


def test_collator_masking_is_recorded(tmp_path):
    trainer = sft_trainer(tmp_path, tickets(), pad_eos=True, callbacks=[GradianCallback(on_critical="warn",
                                                                                        echo=lambda _: None)])
    trainer.train()
    data = read_run_record(tmp_path).data
    assert data["collator"]["masks_pad"] is True and data["rendering"]["pad_token"] == "</s>"
    assert data["collator"]["attributes"]["inner.mlm"] is False
    assert [f["check"] for f in data["preflight"] if f["severity"] == "critical"][0] == "pad_eos_masking"


def test_without_preflight_the_record_still_names_the_collators_pad_token(tmp_path):
    trainer = sft_trainer(tmp_path, tickets(4), pad_eos=True, callbacks=[GradianCallback(preflight=False,
                                                                                         echo=lambda _: None)])
    trainer.train()
    data = read_run_record(tmp_path).data
    assert data["rendering"]["pad_token"] == "</s>" and data["preflight"] == [] and data["collator"]["masks_pad"] is None


def lora_state(trainer) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in trainer.model.named_parameters() if "lora_" in name}


def test_replayed_order_reproduces_the_adapter_bit_for_bit(recorded, tmp_path):
    out, trainer, _ = recorded
    original = lora_state(trainer)

    class ReplayTrainer(SFTTrainer):
        def _get_train_sampler(self, train_dataset=None):
            return RecordedOrderSampler.from_run(out, self.train_dataset)

    replayed = sft_trainer(tmp_path / "replay", tickets(), trainer_class=ReplayTrainer, data_seed=7, **SETTINGS)
    replayed.train()
    again = lora_state(replayed)
    assert all(torch.equal(original[name], again[name]) for name in original)
    shuffled = sft_trainer(tmp_path / "shuffled", tickets(), data_seed=7, **SETTINGS)  # the same seed, another order
    shuffled.train()
    assert not all(torch.equal(original[name], value) for name, value in lora_state(shuffled).items())


def test_replay_refuses_another_dataset(recorded):
    out, trainer, _ = recorded
    other = trainer.train_dataset.select(list(reversed(range(12))))
    with pytest.raises(InputError, match="is not the row step 1 trained on"):
        RecordedOrderSampler.from_run(out, other)


def test_readers_without_or_with_a_bad_record(tmp_path):
    assert read_run_record(tmp_path) is None
    (tmp_path / "gradian_run.json").write_text('{"format": "gradian_run", "version": 99}')
    with pytest.raises(InputError, match="gradian_run.json: is a run record of version 99"):
        read_run_record(tmp_path)


def test_an_edited_field_is_named_where_a_written_record_reads(recorded, tmp_path):
    """The schema takes every record the callback writes, and names the field an edit broke (a collator class that
    is not text crashed the line `diagnose` prints)."""
    out, _, _ = recorded
    data = json.loads((out / "gradian_run.json").read_text())
    assert read_run_record(out).data == data
    data["collator"]["class"] = True
    (tmp_path / "gradian_run.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"at collator\.class: True is not of type .*edited or damaged"):
        read_run_record(tmp_path)


def test_an_order_with_a_row_outside_the_dataset_is_not_replayed(recorded):
    out, _, _ = recorded
    record = read_run_record(out)
    record.data["steps"][4]["rows"][1] = None  # a row the dataset does not hold: replaying would shift every row
    with pytest.raises(InputError, match="step 5 fed the model a row that is not in its train dataset"):
        RecordedOrderSampler.from_record(record)  # reads record.order


def test_padding_free_batches_split_back_into_rows():
    rows = {row_hash([5, 6, 7]): 0, row_hash([8, 9]): 1, row_hash([1, 2, 3, 4]): 2}
    flat = torch.tensor([[8, 9, 1, 2, 3, 4, 5, 6, 7]])  # rows 1, 2 (a packed row: positions restart inside), 0
    positions = torch.tensor([[0, 1, 0, 1, 0, 1, 0, 1, 2]])
    split = fed_rows({"input_ids": flat, "position_ids": positions}, rows.__contains__)
    assert [rows[row_hash(r)] for r, _ in split] == [1, 2, 0]
    padded = fed_rows({"input_ids": torch.tensor([[8, 9, 0], [5, 6, 7]]),
                       "attention_mask": torch.tensor([[1, 1, 0], [1, 1, 1]])}, rows.__contains__)
    assert [r.tolist() for r, _ in padded] == [[8, 9], [5, 6, 7]]
    assert all(key == row_hash(r) for r, key in split + padded)  # each row comes with its own hash


def test_hashes_of_a_shuffled_dataset_give_its_own_indices():
    from datasets import Dataset

    from gradian.callback.record import dataset_hashes

    shuffled = Dataset.from_list([{"input_ids": [i, i + 1, 7]} for i in range(20)]).shuffle(seed=3)
    table = dataset_hashes(shuffled)
    assert all(table[row_hash(shuffled[i]["input_ids"])] == i for i in range(20)) and len(table) == 20


def test_a_resumed_run_keeps_the_steps_its_checkpoint_recorded(tmp_path):
    from types import SimpleNamespace

    from gradian.callback.callback import resumed_steps

    folder = tmp_path / "checkpoint-2"
    folder.mkdir()
    steps = [{"step": n, "epoch": 0, "learning_rate": 0.1, "rows": [n], "hashes": ["h"]} for n in (1, 2, 3)]
    (folder / "gradian_run.json").write_text(json.dumps({"format": "gradian_run", "version": 1, "steps": steps}))
    args = SimpleNamespace(output_dir=str(tmp_path))
    assert resumed_steps(args, SimpleNamespace(global_step=2)) == steps[:2]
    assert resumed_steps(args, SimpleNamespace(global_step=0)) == []
    assert resumed_steps(args, SimpleNamespace(global_step=5)) == []  # no checkpoint-5: nothing recorded before
    (folder / "gradian_run.json").write_text(json.dumps({"format": "gradian_run", "version": 99, "steps": steps}))
    with pytest.raises(InputError, match="gradian_run.json: is a run record of version 99"):
        resumed_steps(args, SimpleNamespace(global_step=2))


def test_torchrun_records_every_ranks_rows_step_by_step(tmp_path):
    """Under torchrun (2 gloo processes) each step's record holds rank 0's micro-batch then rank 1's, and the epoch
    covers the dataset once across ranks."""
    worker = Path(__file__).parent / "callback_distributed_worker.py"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(worker),
               str(tmp_path)]
    done = subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    record = read_run_record(tmp_path)
    ranks = [json.loads((tmp_path / f"batches-rank{r}.json").read_text())[1:] for r in (0, 1)]  # [0]: preflight's
    fed = [first + second for first, second in zip(*ranks, strict=True)]
    assert len(record.steps) == len(fed) == 4
    assert [step["hashes"] for step in record.steps] == [[row_hash(r) for r in step] for step in fed]
    assert sorted(i for rows in record.order for i in rows) == list(range(16))
