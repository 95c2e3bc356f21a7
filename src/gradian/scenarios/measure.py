"""JSON validity, measured by greedy generation: the capability every scenario breaks or keeps.

An answer is valid when the text generated before EOS parses with `json.loads` as an object.
A generation that never emits EOS within `max_new_tokens` "ran on": the symptom of a model
that never learned to stop.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gradian.capabilities import get_capability
from gradian.regression.generation import generate as greedy

MAX_NEW_TOKENS = 64
BATCH = 64


JSON = get_capability("json_formatting")


@dataclass
class Generation:
    text: str
    ran_on: bool

    @property
    def valid(self) -> bool:
        return JSON.score(self.text, None) == 1.0


def generate_answers(model: Any, tokenizer: Any, prompts: Sequence[str], max_new_tokens: int = MAX_NEW_TOKENS) -> list[Generation]:
    """Greedy completions of `prompts` through the generation `gradian attribute` measures with."""
    model.eval()
    answers = greedy(model, tokenizer, [tokenizer(prompt)["input_ids"] for prompt in prompts],
                     max_new_tokens=max_new_tokens, batch_size=BATCH)
    return [Generation(answer.text, ran_on=not answer.stopped) for answer in answers]


def summarize_generations(generations: Sequence[Generation], categories: Sequence[str],
              references: Sequence[str] | None = None) -> dict[str, Any]:
    """Valid / ran-on counts and rates, overall and per category. With `references`, also `same_keys`:
    valid answers with the reference's keys in its order (did the fine-tune learn its purpose, the new field?)."""
    groups: dict[str, list[tuple[Generation, str | None]]] = defaultdict(list)
    pairs = list(zip(generations, references if references is not None else [None] * len(generations), strict=True))
    for pair, category in zip(pairs, categories, strict=True):
        groups[category].append(pair)
    return {"overall": _counts(pairs), "by_category": {c: _counts(g) for c, g in sorted(groups.items())}}


def _counts(pairs: list[tuple[Generation, str | None]]) -> dict[str, Any]:
    total = len(pairs)
    valid = sum(g.valid for g, _ in pairs)
    ran_on = sum(g.ran_on for g, _ in pairs)
    counts = {"total": total, "valid": valid, "validity": valid / max(total, 1), "ran_on": ran_on,
              "ran_on_rate": ran_on / max(total, 1)}
    if pairs and pairs[0][1] is not None:
        counts["same_keys"] = sum(g.valid and list(json.loads(g.text)) == list(json.loads(ref)) for g, ref in pairs)
    return counts


def compare_runs(base: dict[str, Any], finetuned: dict[str, Any], affected: str | None) -> dict[str, Any]:
    """`measured.json`: both models' counts and the drop in validity points (base minus fine-tuned)."""
    def drop(pick: str) -> float | None:
        if pick == "overall":
            return 100 * (base["overall"]["validity"] - finetuned["overall"]["validity"])
        if pick not in base["by_category"]:
            return None
        return 100 * (base["by_category"][pick]["validity"] - finetuned["by_category"][pick]["validity"])

    return {
        "capability": "json_validity",
        "max_new_tokens": MAX_NEW_TOKENS,
        "affected_category": affected,
        "base": base,
        "finetuned": finetuned,
        "drop_points": {"overall": drop("overall"), "affected": drop(affected) if affected else None,
                        "by_category": {c: drop(c) for c in base["by_category"]}},
    }
