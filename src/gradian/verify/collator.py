"""The collator a run used, when it was not TRL's own: rebuilt so a retrain supervises exactly what the run did."""

from __future__ import annotations

from typing import Any

import torch
from transformers import DataCollatorForLanguageModeling


class PadMaskingCollator:
    """transformers' `DataCollatorForLanguageModeling(mlm=False)` on TRL's tokenized rows, completion only.

    Like TRL < 0.17's `DataCollatorForCompletionOnlyLM` (a subclass of it), it hides the prompt
    and every label equal to the pad id, so when pad == eos the EOS each row ends with is never
    supervised: the model never learns to stop.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.inner = DataCollatorForLanguageModeling(tokenizer, mlm=False)

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = self.inner([{"input_ids": feature["input_ids"]} for feature in features])  # labels: pad → -100
        if all("completion_mask" in feature for feature in features):
            width = batch["input_ids"].shape[1]
            masks = [f["completion_mask"] + [0] * (width - len(f["completion_mask"])) for f in features]
            batch["labels"][torch.tensor(masks) == 0] = -100  # (B, T): the prompt carries no loss
        return batch
