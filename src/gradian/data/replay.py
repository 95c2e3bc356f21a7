"""Replay an order of rows: a `torch.utils.data.Sampler` that yields, epoch by epoch, the dataset indices a run
trained on, from the steps `gradian_run.json` recorded or from a list of rows per optimizer step (verify's own
`order.json`). With the run's batch size, accumulation and seed, every batch and optimizer step is the original's.

    class ReplayTrainer(SFTTrainer):
        def _get_train_sampler(self, train_dataset=None):
            return RecordedOrderSampler.from_run("run/", self.train_dataset)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from torch.utils.data import Sampler

from gradian.data.run_record import RunRecord, read_run_record, row_hash
from gradian.errors import InputError


class RecordedOrderSampler(Sampler[int]):
    """The rows of epoch `set_epoch(e)` in order (the Trainer calls `set_epoch` before each epoch)."""

    def __init__(self, epochs: list[list[int]]) -> None:
        self.epochs = epochs
        self.epoch = 0

    @classmethod
    def from_record(cls, record: RunRecord, dataset: Any = None) -> RecordedOrderSampler:
        """The record's order; with `dataset`, every recorded row is checked to hold the tokens the run trained on."""
        epochs = record.epochs  # refuses an order with a row outside the dataset
        if dataset is not None:
            for step in record.steps:
                _check_rows(record, step, dataset)
        return cls(epochs)

    @classmethod
    def from_run(cls, run_dir: str | Path, dataset: Any = None) -> RecordedOrderSampler:
        record = read_run_record(run_dir)
        if record is None:
            raise InputError("holds no gradian_run.json; train with GradianCallback to record the order.", run_dir)
        return cls.from_record(record, dataset)

    @classmethod
    def from_steps(cls, steps: Sequence[Sequence[int]], n_rows: int) -> RecordedOrderSampler:
        """Rows per optimizer step, cut into epochs of `n_rows` (every epoch of a one-process run feeds each row once;
        the last may stop short at `max_steps`)."""
        rows = [int(i) for step in steps for i in step]
        return cls([rows[start:start + n_rows] for start in range(0, len(rows), n_rows)] or [[]])

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        return iter(self.epochs[min(self.epoch, len(self.epochs) - 1)])

    def __len__(self) -> int:
        return len(self.epochs[min(self.epoch, len(self.epochs) - 1)])


def _check_rows(record: RunRecord, step: dict[str, Any], dataset: Any) -> None:
    for index, expected in zip(step.get("rows") or [], step.get("hashes") or [], strict=False):
        if index >= len(dataset) or row_hash(dataset[int(index)]["input_ids"]) != expected:
            raise InputError(f"row {index} of this dataset is not the row step {step.get('step')} trained on "
                             f"(its tokens differ); replay on the run's own tokenized train dataset.", record.path)
