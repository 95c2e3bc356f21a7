"""Rows as OpenAI's fine-tuning trains them: `{"messages": [...]}` whose assistant turns may carry `weight` (0 or 1).

OpenAI's service trains every assistant turn whose `weight` is not 0 and nothing else: system, user and tool turns
are context. Its tokenizer and template are not public, so Gradian renders the turns with the chat template it has
(the run's, else the base model's) and says so: the loss positions follow OpenAI's rule, the tokens are Gradian's
reading. A data file that carries the key and comes with no run folder or config is read this way
(`openai_setup`). Under TRL the key means nothing (TRL trains what its settings say): `audit/masking.py` names the
rows whose weight-0 turns were trained.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from gradian.data.columns import ExampleColumns
from gradian.data.examples import Example
from gradian.data.setup import TrainingSetup
from gradian.data.tokens import common_prefix
from gradian.data.trl_prepare import IGNORE, template_kwargs

WEIGHT = "weight"
FRAMEWORK = "openai"
WHY = ("OpenAI's fine-tuning prepares rows with its own code, which is not public: loss on the assistant turns "
       "whose weight is not 0, tokens by the chat template Gradian has")


def turn_weights(example: Example) -> list[Any] | None:
    """Each assistant turn's `weight` (None where a turn has none), or None when the row is not a messages row or
    no turn carries the key."""
    if example.shape != "messages":
        return None
    weights = [m.get(WEIGHT) for m in example.fields["messages"] if m.get("role") == "assistant"]
    return weights if any(w is not None for w in weights) else None


def untrained_turns(example: Example) -> int:
    """How many of the row's assistant turns carry `weight: 0`."""
    return sum(w == 0 for w in turn_weights(example) or [])


def weighted_rows(examples: Iterable[Example]) -> Iterator[Example]:
    """The rows that carry `weight` on an assistant turn; columns are searched for the key before any row is read."""
    candidates = examples.holding(f'"{WEIGHT}"') if isinstance(examples, ExampleColumns) else examples
    return (example for example in candidates if turn_weights(example) is not None)


def carries_weights(examples: Iterable[Example]) -> bool:
    return next(weighted_rows(examples), None) is not None


def openai_setup(setup: TrainingSetup) -> TrainingSetup:
    """`setup` (read from no run: every rendering field assumed) as OpenAI's fine-tuning trains: loss on assistant
    turns only, no truncation known (OpenAI's context length is the model's) unless a flag set max_length."""
    values = setup.to_dict()
    values.update(framework=FRAMEWORK, assistant_only_loss=True, completion_only_loss=None, packing=False)
    if "max_length" in setup.assumed:
        values["max_length"] = None
    out = TrainingSetup(**values)
    out.assumed = [name for name in setup.assumed
                   if name not in ("max_length", "assistant_only_loss", "completion_only_loss", "packing")]
    return out


def openai_rows(examples: Sequence[Example], tokenizer: Any,
                setup: TrainingSetup) -> tuple[list[tuple[list[int], list[int], int]], int]:
    """(input_ids, labels, 0) of each messages row, and how many rows the template renders differently once later
    turns follow (their turn bounds are where the renderings agree). An assistant turn spans from the end of the
    rendered turns before it with the generation prompt to the end of the rendered turns up to it, end-of-turn
    token included."""
    out, unstable = [], 0
    for example in examples:
        ids, labels, stable = _openai_row(example, tokenizer, setup)
        unstable += not stable
        out.append((ids, labels, 0))
    return out, unstable


def _openai_row(example: Example, tokenizer: Any, setup: TrainingSetup) -> tuple[list[int], list[int], bool]:
    """(input_ids, labels, whether every turn's rendering is a prefix of the whole row's)."""
    messages = example.fields["messages"]
    raw = example.raw or example.fields
    kwargs = {**template_kwargs({key: raw[key] for key in ("tools", "chat_template_kwargs") if raw.get(key)}),
              "chat_template": setup.chat_template, "tokenize": True, "return_dict": True}

    def ids_of(turns: list[dict[str, Any]], generation: bool = False) -> list[int]:
        return list(tokenizer.apply_chat_template(turns, add_generation_prompt=generation, **kwargs)["input_ids"])

    ids = ids_of(messages)
    labels = [IGNORE] * len(ids)
    stable = True
    for k, message in enumerate(messages):
        if message.get("role") != "assistant" or message.get(WEIGHT) == 0:
            continue
        before = ids_of(messages[:k], generation=True) if k else []
        upto = ids_of(messages[: k + 1])
        start, end = common_prefix(before, ids), common_prefix(upto, ids)
        stable &= start == len(before) and end == len(upto)
        labels[start:end] = ids[start:end]
    return ids, labels, stable
