"""Capabilities: every built-in, plug-ins from a module and from a file, the registry, minimal-edit repair."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradian import Capability, get_capability, register_capability, unregister_capability
from gradian.capabilities import available_capabilities
from gradian.capabilities.repair import parse_object
from gradian.errors import InputError

REFERENCE = '{"order_id": "B7", "amount": 30, "currency": "EUR"}'


def test_json_formatting_needs_one_json_object():
    capability = get_capability("json_formatting")
    assert capability.binary and not capability.needs_reference
    assert capability.score('{"a": [1, 2]}', None) == 1.0
    assert capability.score('  {"a": 1}\n', None) == 1.0
    for bad in ['{"a": 1', '```json\n{"a": 1}\n```', "[1, 2]", '"text"', '{"a": 1} and more', "", "{'a': 1}"]:
        assert capability.score(bad, None) == 0.0, bad


def test_json_formatting_keys_needs_the_reference_key_set():
    capability = get_capability("json_formatting:keys")
    assert capability.name == "json_formatting:keys" and capability.needs_reference
    assert capability.score('{"currency": "USD", "order_id": "A1", "amount": 3}', REFERENCE) == 1.0
    assert capability.score('{"order_id": "A1", "amount": 3}', REFERENCE) == 0.0
    assert capability.score('{"order_id": "A1", "amount": 3, "currency": "X", "extra": 1}', REFERENCE) == 0.0
    with pytest.raises(InputError, match="needs a reference"):
        capability.score("{}", None)


def test_exact_match_contains_and_regex():
    exact, contains = get_capability("exact_match"), get_capability("contains")
    assert exact.score(" refund \n", "refund") == 1.0 and exact.score("refunds", "refund") == 0.0
    assert contains.score("the refund is late", "refund") == 1.0 and contains.score("late", "refund") == 0.0
    assert get_capability("contains:EUR").score('{"currency": "EUR"}', None) == 1.0
    regex = get_capability(r"regex:^\{.*\}$")
    assert regex.name == r"regex:^\{.*\}$"
    assert regex.score('{"a":\n1}', None) == 1.0 and regex.score('x{"a": 1}', None) == 0.0
    with pytest.raises(InputError, match="not a valid regular expression"):
        get_capability("regex:(unclosed")


def test_json_schema_validates_against_a_schema_file(tmp_path):
    schema = {"type": "object", "required": ["amount"], "properties": {"amount": {"type": "number"}}}
    path = tmp_path / "answer.schema.json"
    path.write_text(json.dumps(schema))
    capability = get_capability(f"json_schema:{path}")
    assert capability.score('{"amount": 3.5}', None) == 1.0
    assert capability.score('{"amount": "3.5"}', None) == 0.0
    assert capability.score('{"amount": 3', None) == 0.0
    with pytest.raises(InputError, match="no such JSON Schema file"):
        get_capability(f"json_schema:{tmp_path / 'missing.json'}")
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": 12}')
    with pytest.raises(InputError, match="not a valid JSON Schema"):
        get_capability(f"json_schema:{bad}")


PLUGIN = '''
def share_of_words(output, reference):
    words = reference.split()
    return sum(word in output for word in words) / len(words)

def is_short(output, reference):
    return float(len(output) < 10)
is_short.binary = True

def too_big(output, reference):
    return 2.0
'''


def test_plugin_from_a_module_on_the_path(tmp_path, monkeypatch):
    (tmp_path / "my_scores.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    graded = get_capability("my_scores:share_of_words")
    assert graded.name == "my_scores:share_of_words" and not graded.binary
    assert graded.score("refund late", "refund my order late") == pytest.approx(0.5)
    assert get_capability("my_scores:is_short").binary
    with pytest.raises(InputError, match="outside \\[0, 1\\]"):
        get_capability("my_scores:too_big").score("x", "y")


def test_plugin_from_a_file(tmp_path):
    path = tmp_path / "scores_file.py"
    path.write_text(PLUGIN)
    assert get_capability(f"{path}:is_short").score("short", None) == 1.0


def test_plugins_that_cannot_load_raise_input_errors(tmp_path, monkeypatch):
    (tmp_path / "broken_plugin.py").write_text("import a_module_that_does_not_exist\n")
    (tmp_path / "fine_plugin.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(InputError, match="could not be imported"):
        get_capability("broken_plugin:score")
    with pytest.raises(InputError, match="could not be imported"):
        get_capability("no_such_module_anywhere:score")
    with pytest.raises(InputError, match="has no function score"):
        get_capability("fine_plugin:score")
    with pytest.raises(InputError, match="unknown capability"):
        get_capability("json_fromatting")


def test_register_capability_works_as_for_built_ins():
    @register_capability("shouting")
    class Shouting(Capability):
        def __init__(self, argument):
            self.name = "shouting"

        def score(self, output, reference):
            return float(output.isupper())

    try:
        assert "shouting" in available_capabilities()
        assert get_capability("shouting").score("HELLO", None) == 1.0
    finally:
        unregister_capability("shouting")
    assert "shouting" not in available_capabilities()
    with pytest.raises(InputError, match="unknown capability"):
        get_capability("shouting")
    with pytest.raises(ValueError, match="no capability is registered as 'shouting'"):
        unregister_capability("shouting")


def test_repair_keeps_the_complete_fields_and_continues_with_the_reference():
    capability = get_capability("json_formatting")
    output = '{"order_id": "A12",  "amount": 3'  # stopped mid-object; two spaces as the model wrote them
    repaired = capability.repair(output, REFERENCE)
    assert repaired == '{"order_id": "A12",  "amount": 3,  "currency": "EUR"}'
    assert capability.score(repaired, REFERENCE) == 1.0
    assert capability.repair('{"a": 1}', REFERENCE) is None  # already passes: nothing to repair


def test_repair_puts_a_started_field_first_and_never_opened_objects_get_the_reference():
    capability = get_capability("json_formatting:keys")
    repaired = capability.repair('{"order_id": "A12", "currency": "EU', REFERENCE)
    assert repaired == '{"order_id": "A12", "currency": "EUR", "amount": 30}'
    assert capability.repair('```json\n{"order_id": "A12"}', REFERENCE) == REFERENCE
    # A key the reference does not have is where :keys failed, so the kept prefix ends before it.
    assert capability.repair('{"order_id": "A12", "oops": 1, "amount": 3}', REFERENCE) == (
        '{"order_id": "A12", "amount": 30, "currency": "EUR"}'
    )
    # Every field present, then trailing text: the repair is the output up to its own closing brace.
    full = '{"order_id": "B7", "amount": 30, "currency": "EUR"}'
    assert capability.repair(full + " thanks", REFERENCE) == full


KEYS = st.lists(st.sampled_from(["id", "amount", "currency", "note", "date", "status"]), min_size=1, max_size=6,
                unique=True)
VALUES = st.one_of(st.integers(-999, 999), st.text("abc xyz", max_size=6), st.booleans(),
                   st.lists(st.integers(0, 9), max_size=3))


def test_repair_and_keys_hold_when_decode_spaces_the_tokens():
    """A word-level tokenizer without a decoder writes `{ " k1 " : 5 , " k2 " : 7 , "` for `{"k1": 5, "k2": 7, ...}`:
    the repair keeps the model's fields and continues with the reference's third key, not its first."""
    reference = '{"k1": 5, "k2": 7, "k3": "x", "k4": 2}'
    output = '{ " k1 " : 5 , " k2 " : 7 , " k3 '
    repaired = get_capability("json_formatting").repair(output, reference)
    assert repaired.startswith('{ " k1 " : 5 , " k2 " : 7 , ')
    assert [key.strip() for key in json.loads(repaired)] == ["k1", "k2", "k3", "k4"]
    assert get_capability("json_formatting:keys").score('{ " k1 " : 5 , " k2 " : 7 , " k3 " : 1 , " k4 " : 2 }',
                                                        reference) == 1.0
    assert get_capability("json_formatting:keys").score('{ " k1 " : 5 , " k2 " : 7 }', reference) == 0.0


@settings(max_examples=150, deadline=None)
@given(keys=KEYS, data=st.data(), item_sep=st.sampled_from([", ", ",", ",\n  "]),
       key_sep=st.sampled_from([": ", ":"]))
def test_repair_is_valid_json_with_the_reference_keys_and_shares_the_output_prefix(keys, data, item_sep, key_sep):
    reference_value = {key: data.draw(VALUES) for key in keys}
    reference = json.dumps(reference_value)
    written = data.draw(st.lists(st.sampled_from(keys), unique=True, max_size=len(keys)))
    output_full, field_ends = "{", [1]
    for index, key in enumerate(written):
        output_full += (item_sep if index else "") + json.dumps(key) + key_sep + json.dumps(data.draw(VALUES))
        field_ends.append(len(output_full))
    output_full += "}"
    cut = data.draw(st.integers(0, len(output_full) - 1))  # the model stopped before closing the object
    output = output_full[:cut]
    for spec in ("json_formatting", "json_formatting:keys"):
        repaired = get_capability(spec).repair(output, reference)
        value = json.loads(repaired)
        assert isinstance(value, dict) and set(value) == set(keys)
        kept = max((end for end in field_ends if end <= cut), default=0)  # the last complete field's end
        assert len(os.path.commonprefix([repaired, output])) >= kept
        assert parse_object(repaired).keys()[: len(parse_object(output).keys())] == parse_object(output).keys()
