"""Each failing answer gets the symptom built for it, in the documented order; counts, shares and examples add up."""

from __future__ import annotations

import pytest

from gradian.capabilities import get_capability
from gradian.regression.generation import GeneratedAnswer
from gradian.regression.measure import RegressionRow
from gradian.regression.symptoms import (
    EXAMPLES_PER_SYMPTOM,
    SYMPTOMS,
    classify_answer,
    classify_failures,
    open_structure,
    unwrapped,
)

JSON = get_capability("json_formatting")
KEYS = get_capability("json_formatting:keys")
REFERENCE = '{"intent": "refund", "order": "6911", "priority": "normal"}'


@pytest.mark.parametrize(("text", "stopped", "capability", "expected"), [
    ('{"intent": "refund", "order": "6911", "priority": "norm', False, JSON, "never-stops"),  # ran to the limit
    ('{"intent": "refund"}}}}}}}}}}', False, JSON, "never-stops"),  # balanced-or-not does not matter: it ran on
    ('```json\n{"intent": "refund", "order": "6911", "priority": "normal"}\n```', True, JSON, "wrapped"),
    ('Here is the answer: {"intent": "refund", "order": "6911", "priority": "normal"} Thanks!', True, JSON, "wrapped"),
    ('{"intent": "refund", "order": "6911"}', True, KEYS, "wrong-fields"),  # a field missing
    ('{"intent": "refund", "order_id": "6911", "priority": "normal"}', True, KEYS, "wrong-fields"),  # renamed
    ('```json\n{"intent": "refund"}\n```', True, KEYS, "wrong-fields"),  # fenced, and a field missing inside
    ('{"intent": "refund", "order": "6911", ', True, JSON, "stops-early"),  # EOS inside the object
    ('{"intent": "refund", "order": "69', True, JSON, "stops-early"),  # EOS inside a string
    ('[{"intent": "refund"}', True, JSON, "stops-early"),
    ("", True, JSON, "stops-early"),  # EOS before the structure began
    ("{\"intent\": \"refund\", 'order': '6911'}", True, JSON, "other"),  # single quotes: balanced, not JSON
    ('{"intent": "refund"}}', True, JSON, "wrapped"),  # a stray brace after a valid answer is text around it
    ("I cannot help with that.", True, JSON, "other"),
])
def test_each_answer_gets_its_symptom(text, stopped, capability, expected):
    assert capability.score(text, REFERENCE) < 0.5  # every case is a failing answer
    assert classify_answer(text, stopped, REFERENCE, capability) == expected


def test_decoded_keys_with_spaces_are_the_reference_keys():
    """A word-level tokenizer decodes `" intent "`: the same field, so not wrong-fields (KEYS fails it, it is other)."""
    spaced = '{ " intent " : " refund " , " Order " : " 6911 " , " priority " : " normal " }'
    assert classify_answer(spaced, True, REFERENCE, KEYS) == "other"
    missing = '{ " intent " : " refund " }'
    assert classify_answer(missing, True, REFERENCE, KEYS) == "wrong-fields"


def test_unwrapped_and_open_structure():
    assert unwrapped('{"a": 1}') is None  # nothing around it
    assert unwrapped('x {"a": 1} y') == '{"a": 1}'
    assert unwrapped("```\nhello\n```") == "hello"
    assert unwrapped('{"a": 1') is None
    assert open_structure('{"a": "b\\"') and open_structure('{"a": [1, 2') and not open_structure('{"a": "}"}')
    assert not open_structure("plain text {")


def row(i: int, text: str, stopped: bool = True, score: float = 0.0) -> RegressionRow:
    return RegressionRow(f"e{i}", "prompt", [1], REFERENCE, GeneratedAnswer([1], REFERENCE, True),
                         GeneratedAnswer([2], text, stopped), 1.0, score)


def test_counts_shares_examples_and_dominant():
    rows = [row(i, '{"intent": "refund", ') for i in range(6)]
    rows += [row(10 + i, '{"intent": "re', stopped=False) for i in range(3)]
    rows += [row(20, REFERENCE, score=1.0)]  # passes: not a failing answer
    symptoms = classify_failures(rows, JSON)
    assert symptoms.n_failing == 9
    assert symptoms.counts == {"stops-early": 6, "never-stops": 3, "wrapped": 0, "wrong-fields": 0, "other": 0}
    assert symptoms.shares["stops-early"] == pytest.approx(6 / 9) and sum(symptoms.shares.values()) == pytest.approx(1)
    assert set(symptoms.examples) == {"stops-early", "never-stops"}
    assert len(symptoms.examples["stops-early"]) == EXAMPLES_PER_SYMPTOM
    assert symptoms.examples["never-stops"][0] == {"id": "e10", "answer": '{"intent": "re'}
    assert symptoms.dominant == "stops-early" and symptoms.by_id["e10"] == "never-stops" and "e20" not in symptoms.by_id
    data = symptoms.to_dict()
    assert data["dominant"] == "stops-early" and set(data["counts"]) == set(SYMPTOMS)


def test_no_dominant_symptom_below_half_and_nothing_failing():
    rows = [row(0, '{"a": '), row(1, '{"a": ', stopped=False), row(2, "nope")]
    assert classify_failures(rows, JSON).dominant is None  # a third each
    empty = classify_failures([row(0, REFERENCE, score=1.0)], JSON)
    assert empty.n_failing == 0 and empty.dominant is None and empty.examples == {}
