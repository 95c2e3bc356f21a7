"""Symptoms: how the fine-tuned model's failing answers fail, classified so the verdict can join them with findings.

Each failing answer (the fine-tuned model fails the capability) gets one class, tested in this order:

1. `never-stops`: it ran to the token limit without EOS (the model did not learn where to stop);
2. `wrapped`: fences or prose around an answer that passes the capability once they are taken away;
3. `wrong-fields`: a valid JSON object whose keys (compared without case or surrounding whitespace, so a tokenizer
   that decodes `" intent "` still matches `intent`) differ from the reference's: missing, extra or renamed;
4. `stops-early`: it ended with EOS inside the structure: an unclosed bracket, an open string, or nothing at all;
5. `other`: anything else (single quotes, a stray brace, prose instead of an answer...).

Order matters: a run-on answer is usually also unbalanced, but ran out of tokens rather than stopped; a fenced
answer is also not bare JSON, but its content is right.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from gradian.capabilities import Capability
from gradian.capabilities.json_text import json_depth
from gradian.regression.measure import RegressionRow

SYMPTOMS = ("stops-early", "never-stops", "wrapped", "wrong-fields", "other")
# Example answers kept per symptom: enough to see the pattern in the report.
EXAMPLES_PER_SYMPTOM = 3
EXAMPLE_CHARS = 300
# The most common symptom is `dominant` when it covers at least half of the failing answers: below that no single
# way of failing describes the regression, and no rule keyed on a symptom applies.
DOMINANT_SHARE = 0.5

_FENCE = re.compile(r"```[\w-]*[ \t]*\n?(.*?)\n?[ \t]*```", re.S)
_DECODER = json.JSONDecoder()


@dataclass
class Symptoms:
    """Counts, shares and example answers per symptom over the failing answers (`n_failing`)."""

    n_failing: int
    counts: dict[str, int]
    shares: dict[str, float]
    examples: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    by_id: dict[str, str] = field(default_factory=dict)

    @property
    def dominant(self) -> str | None:
        """The most common symptom when it covers at least DOMINANT_SHARE of the failing answers, else None."""
        if not self.n_failing:
            return None
        top = max(SYMPTOMS, key=lambda s: (self.counts[s], -SYMPTOMS.index(s)))
        return top if self.shares[top] >= DOMINANT_SHARE else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "dominant": self.dominant}


def classify_answer(text: str, stopped: bool, reference: str | None, capability: Capability) -> str:
    """The symptom of one failing answer (see the module docstring for the order of the tests)."""
    if not stopped:
        return "never-stops"
    body = text.strip()
    inner = unwrapped(body)
    if inner is not None and capability.passes(inner, reference):
        return "wrapped"
    value = _loads(body if inner is None else inner)
    wanted = _loads(reference) if reference is not None else None
    if isinstance(value, dict) and isinstance(wanted, dict) and _keys(value) != _keys(wanted):
        return "wrong-fields"
    if not body or open_structure(body if inner is None else inner):
        return "stops-early"
    return "other"


def classify_failures(rows: Sequence[RegressionRow], capability: Capability) -> Symptoms:
    """Symptoms of every row the fine-tuned model fails (the same rows attribution queries)."""
    failing = [row for row in rows if row.finetuned_score < 0.5]
    by_id = {row.id: classify_answer(row.finetuned.text, row.finetuned.stopped, row.reference, capability)
             for row in failing}
    counts = {symptom: 0 for symptom in SYMPTOMS}
    examples: dict[str, list[dict[str, str]]] = {symptom: [] for symptom in SYMPTOMS}
    for row in failing:
        symptom = by_id[row.id]
        counts[symptom] += 1
        if len(examples[symptom]) < EXAMPLES_PER_SYMPTOM:
            examples[symptom].append({"id": row.id, "answer": _clip(row.finetuned.text)})
    n = len(failing)
    shares = {symptom: counts[symptom] / n if n else 0.0 for symptom in SYMPTOMS}
    return Symptoms(n, counts, shares, {s: e for s, e in examples.items() if e}, by_id)


def unwrapped(text: str) -> str | None:
    """The answer inside fences or prose: a fenced block's content, else the first JSON object or array in the
    text when something surrounds it; None when nothing is wrapped around the text."""
    fenced = _FENCE.search(text)
    if fenced:
        return fenced.group(1).strip()
    for start, char in enumerate(text):
        if char in "{[":
            try:
                _, end = _DECODER.raw_decode(text, start)
            except json.JSONDecodeError:
                return None
            return text[start:end] if (start, end) != (0, len(text)) else None
    return None


def open_structure(text: str) -> bool:
    """The text opens a JSON object or array and ends before closing it (an unclosed bracket or an open string)."""
    body = text.strip()
    if not body.startswith(("{", "[")):
        return False
    depth, in_string = json_depth(body)
    return in_string or depth > 0


def _keys(value: dict[str, Any]) -> set[str]:
    return {str(key).strip().lower() for key in value}


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None


def _clip(text: str) -> str:
    return text if len(text) <= EXAMPLE_CHARS else text[:EXAMPLE_CHARS] + " \u2026"
