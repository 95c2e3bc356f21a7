"""The correct answer closest to the failure: where the fine-tuned model departs from the base model.

A regression is a change from the base model. For a failing answer y⁻, the decision to explain is the first
token where the fine-tuned model chose differently from what the base model would choose after the same
prefix. The minimal-edit correct answer keeps y⁻ up to that token and continues as the base model does:

    j  = first j with argmax p_base(· | x, y⁻_<j) ≠ y⁻_j
    y⁺ = y⁻_<j + greedy_base(x, y⁻_<j)

y⁺ and y⁻ then share everything before j, so the contrast at j is exactly the decision the fine-tune
changed, whatever the content around it (another order number, another amount) — which a reference
answer, or a repair of the output, cannot guarantee. Used only when y⁺ passes the capability.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from gradian.capabilities import Capability
from gradian.regression.generation import GENERATION_BATCH, generate
from gradian.regression.measure import RegressionRow


@torch.no_grad()
def departure_point(model: Any, prompt_ids: list[int], answer_ids: list[int]) -> int | None:
    """First position of `answer_ids` where the model (as called) would pick another token; None if it never does."""
    if not answer_ids:
        return None
    device = next(model.parameters()).device
    ids = torch.tensor([prompt_ids + answer_ids], device=device)  # (1, T)
    logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1]  # (A, V): prediction of each answer token
    choices = logits.argmax(-1).tolist()
    return next((j for j, (chosen, said) in enumerate(zip(choices, answer_ids, strict=True)) if chosen != said), None)


def departure_answers(
    model: Any, tokenizer: Any, rows: Sequence[RegressionRow], capability: Capability, *, max_new_tokens: int,
    batch_size: int = GENERATION_BATCH,
) -> list[list[int] | None]:
    """For each failing row, y⁺ as token ids (y⁻ up to the departure, then the base model's greedy continuation).

    None where the base model would say the same as the fine-tuned one, or where its continuation still fails.
    """
    with model.disable_adapter():
        points = [departure_point(model, row.prompt_ids, list(row.finetuned.ids)) for row in rows]
        todo = [i for i, j in enumerate(points) if j is not None]
        prefixes = [rows[i].prompt_ids + list(rows[i].finetuned.ids[: points[i]]) for i in todo]
        continued = generate(model, tokenizer, prefixes, max_new_tokens=max_new_tokens, batch_size=batch_size)
    answers: list[list[int] | None] = [None] * len(rows)
    for i, generation in zip(todo, continued, strict=True):
        answer = list(rows[i].finetuned.ids[: points[i]]) + list(generation.ids)
        text = tokenizer.decode(answer, skip_special_tokens=True)
        if capability.passes(text, rows[i].reference):
            answers[i] = answer
    return answers
