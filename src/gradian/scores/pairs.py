"""Queries from the regression: per failing eval row, the correct answer y⁺ and what the fine-tuned model said y⁻."""

from __future__ import annotations

from typing import Any

from gradian.capabilities import Capability, passed
from gradian.data.examples import Example
from gradian.data.render import render_with_answer
from gradian.data.setup import TrainingSetup
from gradian.regression.measure import RegressionResult, RegressionRow
from gradian.scores.departure import departure_answers
from gradian.scores.queries import QueryPair


def query_pairs(
    regression: RegressionResult,
    capability: Capability,
    eval_examples: list[Example],
    tokenizer: Any,
    setup: TrainingSetup,
    kind: str,
    model: Any = None,
) -> list[QueryPair]:
    """One pair per failing eval row: y⁺ (the kind's correct answer) and y⁻ (what the fine-tuned model said).

    `departure*` kinds take y⁺ from the base model at the first token where the fine-tune departs from it
    (needs `model`); `repaired*` kinds repair the failing output; the others use the reference, else a
    passing base answer. A row without a correct answer of that kind falls back to the reference.
    """
    by_id = {example.id: example for example in eval_examples}
    failing = regression.failures()
    departures: list[list[int] | None] = [None] * len(failing)
    if answer_source(kind) == "departure":
        budget = max((len(row.finetuned.ids) for row in failing), default=1) + 8
        departures = departure_answers(model, tokenizer, failing, capability, max_new_tokens=budget)
    pairs = []
    for row, departure in zip(failing, departures, strict=True):
        if departure is not None:
            pairs.append(QueryPair(row.id, row.prompt_ids, departure, list(row.finetuned.ids)))
            continue
        positive = _positive_text(row, capability, kind)
        if positive is None:
            continue
        prompt_ids, positive_ids = answer_tokens(by_id[row.id], positive, tokenizer, setup)
        negative = list(row.finetuned.ids) if prompt_ids == row.prompt_ids else \
            answer_tokens(by_id[row.id], row.finetuned.text, tokenizer, setup)[1]  # the template renders differently
        pairs.append(QueryPair(row.id, prompt_ids, positive_ids, negative))
    return pairs


def _positive_text(row: RegressionRow, capability: Capability, kind: str) -> str | None:
    correct = row.reference if row.reference is not None else (row.base.text if passed(row.base_score) else None)
    if correct is None:
        return None
    if answer_source(kind) == "repaired":
        repair = getattr(capability, "repair", None)
        repaired = repair(row.finetuned.text, correct) if repair is not None else None
        return repaired if repaired is not None else correct
    return correct


def answer_tokens(example: Example, answer: str, tokenizer: Any, setup: TrainingSetup) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids) of `answer` rendered after the prompt exactly as training renders completions."""
    return render_with_answer(example, answer, tokenizer, setup)


def answer_source(query: str) -> str:
    """Where a query kind's correct answer y⁺ comes from: the reference (else a passing base answer), its repair
    (`repaired*`), or the base model where the fine-tune departs from it (`departure*`). One of the kind's two
    axes; `base_kind` is the other."""
    return next((source for source in ("departure", "repaired") if query.startswith(source)), "reference")


def base_kind(query: str) -> str:
    """How a query kind contrasts y⁺ with the failing answer (`scores.queries.KINDS`): `repaired*` and
    `departure*` are the contrastive kinds with another y⁺."""
    source = answer_source(query)
    return query if source == "reference" else query.replace(source, "contrastive", 1)
