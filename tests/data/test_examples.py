"""Dataset reading: every TRL shape plus Alpaca and ShareGPT, stable ids, one-sentence errors."""

from __future__ import annotations

import json

import pytest

from gradian.data.examples import read_dataset
from gradian.errors import InputError


def write(tmp_path, rows, name="train.jsonl") -> str:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_every_shape_and_stable_ids(tmp_path):
    rows = [
        {"prompt": "p", "completion": "c"},
        {"id": "abc", "messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]},
        {"text": "t"},
        {"instruction": "do", "input": "this", "output": "done"},
        {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "r"}]},
        {"prompt": [{"role": "user", "content": "u"}], "completion": [{"role": "assistant", "content": "a"}]},
    ]
    found = read_dataset(write(tmp_path, rows))
    assert [e.id for e in found] == ["1", "abc", "3", "4", "5", "6"]
    assert [e.shape for e in found] == ["prompt_completion", "messages", "text", "prompt_completion", "messages",
                                        "conversational_prompt_completion"]
    assert found[3].fields == {"prompt": "do\n\nthis", "completion": "done"}
    assert found[4].fields["messages"][1] == {"role": "assistant", "content": "r"}
    assert found[1].prompt_text == "u" and found[1].completion_text == "a"


def test_json_array_and_blank_lines(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([{"prompt": "p", "completion": "c"}, {"text": "t"}]))
    assert len(read_dataset(path)) == 2
    jsonl = tmp_path / "gaps.jsonl"
    jsonl.write_text('{"text": "a"}\n\n{"text": "b"}\n')
    assert [e.id for e in read_dataset(jsonl)] == ["1", "3"]  # ids are line numbers, blank lines counted


def test_eval_rows_may_lack_the_reference(tmp_path):
    (row,) = read_dataset(write(tmp_path, [{"prompt": "p"}]), eval_set=True)
    assert row.completion is None
    with pytest.raises(InputError, match="no \"completion\""):
        read_dataset(write(tmp_path, [{"prompt": "p"}]))


@pytest.mark.parametrize(("content", "line", "words"), [
    (b'{"text": "a"}\n{"text": \n', 2, "not valid JSON"),
    (b'{"text": "a"}\n{"foo": 1}\n', 2, "no known fields"),
    (b'{"a\\nb": 1}\n', 1, 'no known fields (found: "a\\nb")'),  # a key's newline stays escaped: one line
    (b'{"text": "a"}\n{"text": "\xff\xfe"}\n', 2, "not UTF-8"),
    (b"", None, "empty"),
    (b'{"id": 1, "text": "a"}\n{"id": 1, "text": "b"}\n', 2, "duplicate id"),
    (b'{"messages": [{"role": "user"}]}\n', 1, "role"),
    (b'["not an object"]', 1, "expected a JSON object"),
])
def test_bad_input_names_file_and_line(tmp_path, content, line, words):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    with pytest.raises(InputError) as error:
        read_dataset(path)
    assert error.value.path == str(path) and error.value.line == line
    assert words in str(error.value) and str(error.value).startswith(str(path)) and "\n" not in str(error.value)


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="no such file; check the path"):
        read_dataset(tmp_path / "nope.jsonl")


def test_hub_name_says_how_to_save_it(tmp_path, monkeypatch):
    """A Hub dataset's name, as TRL's dataset_name takes one: the sentence says how to write it to a file."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError) as error:
        read_dataset("HuggingFaceH4/ultrachat_200k")
    assert "never downloads" in str(error.value) and 'load_dataset("HuggingFaceH4/ultrachat_200k"' in str(error.value)
    assert "\n" not in str(error.value)
    with pytest.raises(InputError, match="no such file; check the path"):  # a file's name is not a Hub name
        read_dataset("data/train.jsonl")


@pytest.mark.parametrize("content", ['{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}\n",
                                     '{"id": ' + "9" * 5000 + ', "prompt": "a", "completion": "b"}\n'])
def test_json_python_cannot_hold_is_bad_input(tmp_path, content):
    path = tmp_path / "deep.jsonl"
    path.write_text(content)
    with pytest.raises(InputError) as error:
        read_dataset(path)
    assert error.value.line == 1 and "cannot read" in str(error.value)


def _ids(tmp_path, rows: list[dict]) -> list[str]:
    path = tmp_path / "ids.jsonl"
    path.write_text("".join(json.dumps({"prompt": "p", "completion": "c", **row}) + "\n" for row in rows))
    return [example.id for example in read_dataset(path)]


@pytest.mark.parametrize("rows,ids", [
    ([{}, {}, {}], ["1", "2", "3"]),  # no ids: the line numbers, as before
    ([{"id": "3"}, {}, {}], ["3", "2", "line-3"]),  # an earlier explicit id takes the line number
    ([{}, {}, {"id": "2"}], ["1", "line-2", "2"]),  # a later one does too: the file is read a second time
    ([{}, {"id": "line-1"}, {"id": 1}], ["line-1-2", "line-1", "1"]),
], ids=["no-ids", "explicit-first", "explicit-later", "both-names-taken"])
def test_a_row_without_an_id_never_collides(tmp_path, rows, ids):
    assert _ids(tmp_path, rows) == ids


def test_the_streamed_columns_name_rows_as_read_dataset_does(tmp_path):
    from gradian.data.columns import ExampleColumns
    from gradian.data.examples import collect_dataset

    assert _ids(tmp_path, [{}, {}, {"id": "2"}]) == ["1", "line-2", "2"]
    columns = collect_dataset(tmp_path / "ids.jsonl", ExampleColumns.from_examples)
    assert list(columns.ids) == ["1", "line-2", "2"]


def test_two_explicit_ids_alike_are_still_a_duplicate(tmp_path):
    with pytest.raises(InputError, match=r"ids.jsonl:3: duplicate id '2'"):
        _ids(tmp_path, [{"id": 2}, {}, {"id": "2"}])


SHAPES = [
    {"prompt": "p", "completion": "c", "category": "a"},
    {"id": "abc", "messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]},
    {"text": "t ü"},
]


def test_gzip_jsonl_and_parquet_read_as_the_jsonl(tmp_path):
    """A training file as users keep one (datasets' `to_parquet`, a gzip-compressed JSONL) reads as the same rows,
    ids and shapes as the JSONL; a Parquet row leaves out the columns it holds no value for."""
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    plain = read_dataset(write(tmp_path, SHAPES))
    squeezed = tmp_path / "train.jsonl.gz"
    squeezed.write_bytes(gzip.compress((tmp_path / "train.jsonl").read_bytes()))
    columns = {key: [row.get(key) for row in SHAPES] for row in SHAPES for key in row}
    pq.write_table(pa.table(columns), tmp_path / "train.parquet")  # every row holds every column, nulls between
    for path in (squeezed, tmp_path / "train.parquet"):
        found = read_dataset(path)
        assert [(e.id, e.line, e.fields, e.raw) for e in found] == [(e.id, e.line, e.fields, e.raw) for e in plain]
    array = tmp_path / "rows.json.gz"
    array.write_bytes(gzip.compress(json.dumps(SHAPES).encode()))
    assert [e.fields for e in read_dataset(array)] == [e.fields for e in plain]


@pytest.mark.parametrize(("name", "content", "words"), [
    ("train.jsonl.gz", b"\x1f\x8b\x08\x00" + b"\x00" * 6 + b"broken", "not a readable gzip file"),
    ("train.parquet", b"PAR1" + b"\x00" * 20 + b"PAR1", "not a readable Parquet file"),
    ("train.zip", b"PK\x03\x04" + b"\x00" * 30, "is a ZIP archive"),
    ("train.csv", b"prompt,completion\np,c\n", "is a CSV file"),
])
def test_a_format_gradian_cannot_read_is_named(tmp_path, name, content, words):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(InputError) as caught:
        read_dataset(path)
    assert words in str(caught.value) and str(caught.value).startswith(str(path))
    assert "\n" not in str(caught.value)


def test_the_cleaned_file_of_a_parquet_or_gzip_dataset_is_its_rows_as_jsonl(tmp_path):
    """train.cleaned.jsonl copies a JSONL file's lines; from a binary source it writes each kept row back."""
    import gzip

    import numpy as np

    from gradian.report.writers import write_cleaned

    write(tmp_path, SHAPES)
    squeezed = tmp_path / "train.jsonl.gz"
    squeezed.write_bytes(gzip.compress((tmp_path / "train.jsonl").read_bytes()))
    for source in (tmp_path / "train.jsonl", squeezed):
        out = write_cleaned(tmp_path / f"{source.name}.cleaned.jsonl", read_dataset(source), np.array([1]))
        kept = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
        assert kept == [SHAPES[0], SHAPES[2]]


def test_a_dataset_saved_to_disk_reads_as_the_jsonl(tmp_path):
    """A folder datasets' `save_to_disk` wrote reads as its rows; a saved DatasetDict asks for the split's folder."""
    import datasets

    plain = read_dataset(write(tmp_path, SHAPES))
    saved = datasets.Dataset.from_dict({key: [row.get(key) for row in SHAPES] for row in SHAPES for key in row})
    saved.save_to_disk(str(tmp_path / "saved"))
    found = read_dataset(tmp_path / "saved")
    assert [(e.id, e.line, e.fields, e.raw) for e in found] == [(e.id, e.line, e.fields, e.raw) for e in plain]
    datasets.DatasetDict({"train": saved, "test": saved}).save_to_disk(str(tmp_path / "splits"))
    with pytest.raises(InputError, match=r"saved DatasetDict \(splits: test, train\); pass the folder of the split"):
        read_dataset(tmp_path / "splits")
    with pytest.raises(InputError, match="is a folder, expected a JSONL file"):
        read_dataset(tmp_path / "splits" / "..")
