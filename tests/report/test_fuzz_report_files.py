"""Fuzzing the report files `verify` reads: report.json, examples.jsonl and generations.jsonl, each damaged at
random (a field replaced or removed, the file cut or bytes changed). `verify`'s readers answer with the report's
contents or one `InputError` naming the file, and what they accept the plan can use (`verify.plan.harm_groups`).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from test_report import run  # noqa: F401 - the report fixture

from fuzzing import FUZZ, answer, bounded
from gradian.capabilities import get_capability
from gradian.errors import InputError
from gradian.regression.measure import GENERATIONS, SETTINGS
from gradian.report.rows import EXAMPLES_FILE, read_examples
from gradian.report.writers import write_report
from gradian.verify.measure import read_original
from gradian.verify.plan import harm_groups
from gradian.verify.run import INPUTS, read_report
from gradian.verify.sets import ranking_of

values = st.recursive(st.none() | st.booleans() | st.integers(-(10**20), 10**20) | st.floats() | st.text(max_size=12),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                      max_leaves=6)


@pytest.fixture
def written(run, tmp_path):  # noqa: F811
    """A valid report folder (report.json, examples.jsonl) and its report as read back."""
    out = tmp_path / "report"
    write_report(out, run["report"], run["examples"], run["rows"])
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    report["settings"] = {**report.get("settings", {}), "dataset": str(run["dataset"])}
    (out / "report.json").write_text(json.dumps(report), encoding="utf-8")
    return out, report, (out / EXAMPLES_FILE).read_bytes()


def _paths(value, prefix=()):
    """Every place in a JSON value: a key of an object or an index of a list."""
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value[:4]):
            yield from _paths(child, (*prefix, index))


def _replace(value, path, new, delete=False):
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    if len(path) == 1 and delete and isinstance(copy, dict):
        del copy[path[0]]
    else:
        copy[path[0]] = _replace(copy[path[0]], path[1:], new, delete)
    return copy


def test_a_valid_report_folder_reads(written):
    out, report, _ = written
    assert read_report(out) == report
    rows = read_examples(out)
    assert len(rows) == report["n_examples"]
    harm_groups({**report, "examples": rows})


@pytest.mark.parametrize("verdict", ["data-cluster", 5, None, ["data-cluster"]])
def test_a_hand_edited_verdict_is_one_sentence(written, verdict):
    """The verdict edited to a string (or any non-object) is refused naming report.json, not a crash mid-verify."""
    out, report, _ = written
    (out / "report.json").write_text(json.dumps({**report, "verdict": verdict}), encoding="utf-8")
    with pytest.raises(InputError, match=r"report\.json: does not match the report schema \(at verdict"):
        read_report(out)


def test_examples_cut_mid_line_names_the_file_and_line(written):
    out, _, data = written
    lines = data.count(b"\n")
    (out / EXAMPLES_FILE).write_bytes(data[: len(data) - 10])
    with pytest.raises(InputError, match=rf"examples\.jsonl:{lines}: is not one whole JSON object"):
        read_examples(out)


@FUZZ
@given(data=st.data(), new=values, delete=st.booleans())
@example(data=None, new="data-cluster", delete=False)  # the verdict edited to a string
@bounded
def test_fuzz_report_json(written, data, new, delete):
    out, report, _ = written
    path = ("verdict",) if data is None else data.draw(st.sampled_from(list(_paths(report))))
    damaged = _replace(report, path, new, delete and bool(path))
    (out / "report.json").write_text(json.dumps(damaged), encoding="utf-8")
    read = answer(lambda: read_report(out), out, names="report.json")
    if read is not None:
        harm_groups({**read, "examples": []})
        assert isinstance(read["verdict"], dict) and isinstance(read["regression"], dict)
        assert all(isinstance(value, (str, type(None))) for name, value in read["settings"].items()
                   if name in INPUTS) and isinstance(read["settings"].get("seed", 0), int)


@pytest.mark.parametrize("damage", [
    lambda data: data[:-10],  # cut mid-line: JSONDecodeError before
    lambda data: data.replace(b"{", b"\x80", 1),  # not UTF-8: UnicodeDecodeError before
    lambda data: data.replace(data.split(b"\n")[1], b"[1, 2]", 1),  # not a row: AttributeError in the plan before
    lambda data: data.replace(b'"cluster": ', b'"cluster": "x", "was": ', 1),  # a field of another type
])
def test_a_damaged_examples_line_is_one_sentence_naming_the_file(written, damage):
    """The failures the fuzz test below found in examples.jsonl, pinned."""
    out, _, data = written
    (out / EXAMPLES_FILE).write_bytes(damage(data))
    with pytest.raises(InputError, match=rf"^{out / EXAMPLES_FILE}(:\d+)?: ") as raised:
        read_examples(out)
    assert "\n" not in str(raised.value)


@FUZZ
@given(data=st.data(), new=values, cut=st.integers(0, 10**6) | st.none(),
       flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=3))
@bounded
def test_fuzz_examples_jsonl(written, data, new, cut, flips):
    out, report, original = written
    rows = [json.loads(line) for line in original.decode().splitlines()]
    index = data.draw(st.integers(0, len(rows) - 1))
    path = data.draw(st.sampled_from(list(_paths(rows[index]))))
    rows[index] = _replace(rows[index], path, new, bool(path) and data.draw(st.booleans()))
    damaged = bytearray("".join(json.dumps(row) + "\n" for row in rows).encode())
    for position, value in flips:
        damaged[position % len(damaged)] = value
    if cut is not None:
        damaged = damaged[: cut % len(damaged)]
    (out / EXAMPLES_FILE).write_bytes(bytes(damaged))
    read = answer(lambda: read_examples(out), out, names=EXAMPLES_FILE)
    if read is not None:
        harm_groups({**report, "examples": read})
        answer(lambda: ranking_of(read, out / EXAMPLES_FILE), out, names=EXAMPLES_FILE)


generation_row = st.fixed_dictionaries({"id": st.text(max_size=5) | values, "prompt_ids": st.lists(st.integers(0, 50))
                                        | values, "reference": st.text(max_size=10) | st.none() | values,
                                        "base_output": st.text(max_size=10) | values,
                                        "finetuned_output": st.text(max_size=10) | values})


@FUZZ
@given(rows=st.lists(generation_row | values, max_size=4), settings=values | st.fixed_dictionaries(
    {"max_new_tokens": values}), spec=st.sampled_from(["json_formatting", "exact_match", "contains", "regex:^\\{"]))
@example(rows=[{"id": "a", "prompt_ids": [1], "reference": "x", "base_output": 0, "finetuned_output": "y"}],
         settings={"max_new_tokens": 4}, spec="exact_match")
@bounded
def test_fuzz_generations(rows, settings, spec, tmp_path_factory):
    out = tmp_path_factory.mktemp("generations")
    (out / GENERATIONS).write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    (out / SETTINGS).write_text(json.dumps(settings), encoding="utf-8")
    original = answer(lambda: read_original(out, get_capability(spec)), out)
    if original is not None:
        assert all(isinstance(i, int) for ids in original.prompt_ids for i in ids)
        assert np.isfinite(original.base).all() and original.max_new_tokens > 0


@pytest.mark.parametrize("damage, names", [
    (lambda out, report, rows: (out / "report.json").write_text(json.dumps({**report, "verdict": "data-cluster"})),
     "report.json: does not match the report schema (at verdict"),
    (lambda out, report, rows: (out / EXAMPLES_FILE).write_bytes(rows[:-10]), f"{EXAMPLES_FILE}:"),
    (lambda out, report, rows: (out / "report.json").write_text(json.dumps(
        {**report, "settings": {**report["settings"], "seed": "zero"}})), "report.json: has the seed 'zero'"),
])
def test_verify_on_a_damaged_report_is_exit_2_naming_the_file(written, damage, names):
    """Through the CLI: one sentence naming the file (and line), exit code 2, before any retrain."""
    from click.testing import CliRunner

    from gradian.cli.main import cli, register_commands

    out, report, rows = written
    damage(out, report, rows)
    if not cli.commands:
        register_commands()
    result = CliRunner().invoke(cli, ["verify", "--report", str(out)])
    assert result.exit_code == 2, result.output[-2000:]
    last = result.stderr.rstrip("\n").split("\n")[-1]
    assert last.startswith("Error: ") and names in last and "Traceback" not in result.output, last
    assert not (out / "verify").exists()
