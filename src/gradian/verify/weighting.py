"""Removal by zero loss weight inside TRL's own loop: every batch and step stays the original's, only some rows'
loss is gone.

How TRL's `SFTTrainer` (1.x, on transformers 5) computes the loss of one optimizer step: the step's micro-batches are
pulled together (`Trainer.get_batch_samples`), `num_items_in_batch` counts their supervised tokens (labels ≠ −100,
shifted), and each micro-batch's loss is its summed token NLL divided by that count. Here:

- every training row carries its index (`gradian_row`) through the collator into the batch, so the rows of each
  step are known exactly (and recorded: `order.json`, one list of row indices per optimizer step);
- after the step's token count is taken from the *original* labels, the removed rows' labels are set to −100. So a
  removed row contributes nothing to the gradient, and every kept row's gradient is exactly what it was in the
  original run: the normaliser still counts the removed rows' tokens. This is the convention of EleutherAI
  bergson's `validate` (`weighted_causal_lm_ce`, reduction "mean": Σ wᵢ·NLL over the batch's valid tokens, all of
  them counted), and it keeps a removal linear in the rows removed (what an attribution predicts). Renormalising
  over the kept tokens instead would also rescale every other row in those batches.
- an explicit order (a list of row-index lists, one per optimizer step, e.g. a run record's) is replayed by
  `data.replay.RecordedOrderSampler`, each epoch its slice of it; rows, RNG and step count are otherwise the recipe's.

A retrain with nothing removed is the original run step for step (the tests check the adapter bit for bit).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from trl import SFTTrainer

from gradian.data.replay import RecordedOrderSampler

ROW = "gradian_row"  # the dataset column (and batch key) holding each row's index in the training file


class RowCollator:
    """The run's collator, plus each row's index as `batch[ROW]` (B,), so the trainer knows which rows it holds."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        rows = [int(feature[ROW]) for feature in features]
        batch = self.inner([{k: v for k, v in feature.items() if k != ROW} for feature in features])
        batch[ROW] = torch.tensor(rows, dtype=torch.long)  # (B,)
        return batch


class ZeroWeightTrainer(SFTTrainer):
    """TRL's `SFTTrainer` that gives the rows in `zero_rows` zero loss weight and records the rows of every step."""

    def __init__(self, *args: Any, zero_rows: frozenset[int] = frozenset(),
                 order: Sequence[Sequence[int]] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.zero_rows = zero_rows
        self.replay = order
        self.steps_seen: list[list[int]] = []  # per optimizer step, the row indices it trained on
        rows: Any = self.train_dataset  # a datasets.Dataset: TRL's tokenized rows, one per training row, in file order
        self.train_dataset = rows.add_column(ROW, list(range(len(rows))))
        self.data_collator = RowCollator(self.data_collator)

    def _set_signature_columns_if_needed(self) -> None:
        super()._set_signature_columns_if_needed()
        if self._signature_columns is not None and ROW not in self._signature_columns:
            self._signature_columns = [*self._signature_columns, ROW]  # kept through remove_unused_columns

    def _get_train_sampler(self, train_dataset: Any = None) -> Any:
        if self.replay is None:
            return super()._get_train_sampler(train_dataset)
        rows: Any = train_dataset if train_dataset is not None else self.train_dataset
        return RecordedOrderSampler.from_steps(self.replay, len(rows))

    def get_batch_samples(self, epoch_iterator: Iterator, num_batches: int, device: torch.device
                          ) -> tuple[list, torch.Tensor | int | None]:
        batches, num_items = super().get_batch_samples(epoch_iterator, num_batches, device)  # counts every row's tokens
        step: list[int] = []
        for batch in batches:
            rows = batch.pop(ROW)  # (B,): the model never sees it
            step += rows.tolist()
            if self.zero_rows:
                removed = torch.tensor([r in self.zero_rows for r in rows.tolist()], device=rows.device)  # (B,)
                for key in ("labels", "shift_labels"):
                    if key in batch:
                        batch[key] = batch[key].masked_fill(removed[:, None].to(batch[key].device), -100)
        if step:
            self.steps_seen.append(step)
        return batches, num_items
