"""Each failing answer gets the symptom built for it, in the documented order, read by where it departs from the
reference for any capability; counts, shares and examples add up."""

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
    departure,
    open_structure,
    unwrapped,
    words_of,
)

JSON = get_capability("json_formatting")
KEYS = get_capability("json_formatting:keys")
EXACT = get_capability("exact_match")
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
    ("{\"intent\": \"refund\", 'order': '6911', 'priority': 'normal'}", True, EXACT, "other"),  # quotes, not values
    ('{"intent": "refund"}}', True, JSON, "never-stops"),  # a stray brace after a valid answer: it went on
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
    assert symptoms.counts == {"stops-early": 6, "never-stops": 3, "wrapped": 0, "wrong-fields": 0, "substitution": 0,
                               "other": 0}
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


def test_never_stops_is_said_as_the_answers_show_it_to_the_limit_or_stopped_after_more_text():
    """An answer closed by another template's end marker (`</s>` as text) stops, after a complete answer: the
    sentence must not say it ran to the token limit."""
    from gradian.verdict.wording import symptom_sentence

    marked = [row(i, REFERENCE + "</s>") for i in range(4)]
    limit = [row(10 + i, REFERENCE + " and more", stopped=False) for i in range(2)]
    assert classify_failures(marked, JSON).ran_to_limit == 0
    assert "each writes more text after a complete answer, then stops" in symptom_sentence(
        classify_failures(marked, JSON))
    assert "never stop (they run on to the token limit)" in symptom_sentence(classify_failures(limit, JSON))
    both = classify_failures(marked + limit, JSON)
    assert both.ran_to_limit == 2 and both.to_dict()["ran_to_limit"] == 2
    assert "(2 run on to the token limit, 4 write more text after a complete answer, then stop)" in \
        symptom_sentence(both)


RUN_ON = " The customer asks for a refund of order 6911. The customer asks for a refund of order 6911. The"


@pytest.mark.parametrize("stopped", [False, True])
def test_a_valid_object_then_run_on_text_never_stops_and_is_not_wrapped(stopped):
    """What a model that never saw an EOS label writes (pad == eos masked): a valid answer, then more text. Ended at
    the token limit or by a late EOS, the text only follows the answer, so the answer did not stop: never `wrapped`."""
    for capability in (JSON, KEYS):
        assert classify_answer(REFERENCE + RUN_ON, stopped, REFERENCE, capability) == "never-stops"
        assert classify_answer(REFERENCE + "\n" + REFERENCE, stopped, REFERENCE, capability) == "never-stops"
    other = '{"intent": "exchange", "order": "12", "priority": "high"}'  # another valid answer than the reference's
    assert classify_answer(other + RUN_ON, stopped, REFERENCE, JSON) == "never-stops"


def test_text_before_a_valid_answer_is_wrapped_and_after_it_only_is_not():
    before_and_after = f"Sure, here is the answer: {REFERENCE} Hope this helps!"
    assert classify_answer(before_and_after, True, REFERENCE, JSON) == "wrapped"
    assert classify_answer(f"Sure, here is the answer: {REFERENCE}", True, REFERENCE, JSON) == "wrapped"
    assert classify_answer(f"{REFERENCE} Hope this helps!", True, REFERENCE, JSON) == "never-stops"


DATE = get_capability(r"regex:^\d{4}-\d{2}-\d{2}$")
CAPITAL = "The capital of France is Paris."


@pytest.mark.parametrize(("text", "capability", "reference", "expected"), [
    ("The capital of France is", EXACT, CAPITAL, "stops-early"),  # EOS before the reference ends
    ("The capital of Fr", EXACT, CAPITAL, "stops-early"),  # mid-word
    (CAPITAL + " It is also its largest city, and the capital of France is Paris.", EXACT, CAPITAL, "never-stops"),
    ("Answer: " + CAPITAL + " Anything else?", EXACT, CAPITAL, "wrapped"),
    ("The capital of France is Lyon.", EXACT, CAPITAL, "substitution"),  # a value swapped
    ("The capital of Spain is Madrid.", EXACT, CAPITAL, "substitution"),  # two values, the shape kept
    ("I do not know.", EXACT, CAPITAL, "other"),
    ("The capital of France is 'Paris'.", EXACT, CAPITAL, "other"),  # punctuation added: a format, not a value
    ("69112", EXACT, "6911", "other"),  # the reference's last word written on is not a complete answer, then more
    ("2024-03", DATE, "2024-03-05", "stops-early"),
    ("2024-03-05 is the date the order shipped, and", DATE, "2024-03-05", "never-stops"),
    ("2024-03-07 is the date the order shipped", DATE, "2024-03-05", "never-stops"),  # a date, then more: it went on
    ("shipped on 2024-03-05", DATE, "2024-03-05", "wrapped"),
])
def test_a_capability_without_json_is_read_against_its_reference(text, capability, reference, expected):
    assert not capability.passes(text, reference)
    assert classify_answer(text, True, reference, capability) == expected


def test_a_value_or_field_swapped_in_a_json_answer_is_substitution():
    swapped = '{"intent": "refund", "order": "6912", "priority": "normal"}'
    assert classify_answer(swapped, True, REFERENCE, EXACT) == "substitution"
    reordered = '{"order": "6911", "intent": "refund", "priority": "normal"}'  # same object, other spelling
    assert classify_answer(reordered, True, REFERENCE, EXACT) == "other"
    renamed = '{"intent": "refund", "order_id": "6911", "priority": "normal"}'
    assert classify_answer(renamed, True, REFERENCE, EXACT) == "wrong-fields"


def test_the_base_answer_stands_in_for_a_missing_reference():
    """A capability that needs no reference (a regex) on eval rows without one: the base model's answer, when it
    passes, is the answer the fine-tuned one departs from; a failing base answer is no such answer."""
    paris = get_capability("regex:Paris")
    short = GeneratedAnswer([2], "The capital of France", True)
    rows = [RegressionRow("e1", "prompt", [1], None, GeneratedAnswer([1], CAPITAL, True), short, 1.0, 0.0),
            RegressionRow("e2", "prompt", [1], None, GeneratedAnswer([1], "Lyon.", True), short, 0.0, 0.0)]
    assert classify_failures(rows, paris).by_id == {"e1": "stops-early", "e2": "other"}
    assert classify_answer("The capital of France", True, None, paris) == "other"
    assert classify_answer("The capital of France", True, None, paris, base=CAPITAL) == "stops-early"


REFERENCE_WORDS = [w for w in "".join(c if c.isalnum() or c == "_" else f" {c} " for c in REFERENCE).split()]


@pytest.mark.parametrize(("text", "stopped", "before", "written"), [
    ('{"intent": "return", "order": "6911", "priority": "normal"}', True,  # a value swapped
     ("{", '"', "intent", '"', ":", '"')[-4:], ("return", '"')),
    ('{"intent": "refund", "order": "6911", "', True,  # stopped inside the object: it wrote nothing there
     ('6911', '"', ",", '"'), ()),
    ('{"intent": "refund", "order": "6911", "priority": "normal"} ok ok', True,  # went on past the answer
     ('priority', '"', ":", '"', "normal", '"', "}")[-4:], ("ok", "ok")),
    ('```json\n' + REFERENCE, True, (), ("`", "`")),  # a fence in front: it departs at once
])
def test_a_failing_answer_departs_where_its_words_first_differ(text, stopped, before, written):
    found = departure(text, REFERENCE, stopped)
    words = [w for w in "".join(c if c.isalnum() or c == "_" else f" {c} " for c in text).split()]
    at = next(i for i, (a, b) in enumerate(zip(words + [None], REFERENCE_WORDS + [None], strict=False)) if a != b)
    assert found is not None and (found.before, found.written) == (before, written)
    assert tuple(words[max(0, at - 4):at]) == before  # the naive reference: characters split into words
    assert found.written_in(words_of(text)) and not found.written_in(words_of(REFERENCE))



def test_no_departure_where_the_words_are_the_same_or_the_answer_ran_to_the_limit_first():
    assert departure(REFERENCE.replace(" ", ""), REFERENCE) is None  # whitespace aside, the same words
    assert departure('{"intent": "refund", "order": "69', REFERENCE, stopped=False) is None  # cut by the limit
    assert departure('{"intent": "refund", "order": "69', REFERENCE, stopped=True) is not None  # it chose to stop


def test_a_row_writes_a_stopping_departure_only_where_it_ends_there():
    found = departure('{"intent": "refund", "order": "6911", "', REFERENCE)
    assert found is not None and found.shown() == '6911 " , " [end]'
    assert found.written_in(words_of('{"intent": "cancel", "order": "6911", "'))  # a row cut at the same place
    assert not found.written_in(words_of(REFERENCE))  # a whole row goes on


def test_failing_answers_keep_their_departures():
    rows = [RegressionRow("e0", "p", [1], REFERENCE, GeneratedAnswer([1], REFERENCE, True),
                          GeneratedAnswer([2], REFERENCE.replace("refund", "return"), True), 1.0, 0.0),
            RegressionRow("e1", "p", [1], REFERENCE, GeneratedAnswer([1], REFERENCE, True),
                          GeneratedAnswer([2], REFERENCE, True), 1.0, 1.0)]
    symptoms = classify_failures(rows, EXACT)
    assert list(symptoms.departures) == ["e0"] and symptoms.to_dict()["departures"] == {"e0": 'intent " : " [return "]'}
