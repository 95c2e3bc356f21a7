"""Rows as columns (data/columns.py) give back the rows of the plain lists, and everything computed from them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from audit_rows import base_config, clean_rows, examples
from gradian.audit import AuditContext, run_checks
from gradian.audit.finding import Finding
from gradian.clusters.groups import candidate_groups, nearest_rows
from gradian.clusters.summary import (
    LabelMembership,
    RowFlags,
    group_statistics,
    summarize_clusters,
)
from gradian.data.base_model import BaseModelRef
from gradian.data.columns import (
    ExampleColumns,
    StringColumn,
    ids_of,
    mask_of,
    positions_of,
    texts_of,
)
from gradian.data.examples import Example, read_dataset
from gradian.data.render import IGNORE, Rendered, render_chunks, render_dataset
from gradian.data.rendered_columns import RenderedColumns
from gradian.data.setup import TrainingSetup
from gradian.report.rows import ExampleRows
from gradian.report.schema import Attribution, build_report
from gradian.report.writers import write_report
from gradian.verdict import Verdict

ROWS = [
    {"prompt": "my order is late", "completion": " ok"},
    {"id": "x7", "prompt": "where is it", "completion": " here", "meta": {"source": "web", "n": [1, 2.5]}},
    {"text": "just text é ✓"},
    {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
    {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]},
    {"instruction": "sum", "input": "1 2", "output": "3"},
    {"prompt": [{"role": "user", "content": "p"}], "completion": [{"role": "assistant", "content": "c"}]},
]


def write_jsonl(path, rows, end="\n"):
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + end for row in rows), encoding="utf-8")
    return path


def random_rendered(n: int, seed: int = 0) -> list[Rendered]:
    """Rows of every kind: masked prompts, pad-masked tokens, labels that are not the tokens, empty rows."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        ids = rng.integers(0, 50, size=int(rng.integers(0, 30))).tolist()
        cut = int(rng.integers(0, len(ids) + 1))
        labels = [IGNORE] * cut + ids[cut:]
        if i % 5 == 1:
            labels = [IGNORE if t == 3 else label for t, label in zip(ids, labels, strict=True)]
        if i % 7 == 2 and ids:
            labels[-1] = ids[-1] + 1  # a shifted label: kept as it is
        if i % 11 == 3:
            labels = labels[:-1]  # one label fewer than tokens
        over = ["", "truncated", "dropped", "refused", "split"][i % 5]
        rows.append(Rendered(f"r{i}", ids, labels, len(ids) + i % 3, cut, bool(i % 2), i % 3 == 0, over))
    return rows


def test_example_columns_give_back_every_row_as_read(tmp_path):
    rows = [{**row, "id": f"{k}-{row['id']}"} if "id" in row else row for k in range(3) for row in ROWS]
    listed = read_dataset(write_jsonl(tmp_path / "train.jsonl", rows))
    columns = ExampleColumns.from_examples(listed, batch_rows=4)  # rows across several batches
    assert len(columns) == len(listed) and list(columns) == listed
    assert [columns[i] for i in range(len(listed))] == listed and columns[-1] == listed[-1]
    assert [e.raw for e in columns] == [e.raw for e in listed] and [e.source for e in columns] == [e.source
                                                                                               for e in listed]
    assert list(columns[3:9]) == listed[3:9] and list(columns.take([8, 0, 8])) == [listed[8], listed[0], listed[8]]
    assert list(columns.ids) == [e.id for e in listed] and columns.ids == [e.id for e in listed]
    assert list(columns.texts()) == [(e.prompt_text, e.completion_text) for e in listed]
    assert np.array_equal(columns.lines, [e.line for e in listed])
    with pytest.raises(IndexError):
        columns[len(listed)]


def test_rendered_columns_give_back_every_row_and_label():
    listed = random_rendered(500)
    columns = RenderedColumns.from_rendered(listed, batch_rows=64)
    assert list(columns) == listed
    assert all(columns[i] == listed[i] for i in range(0, 500, 7)) and columns[-1] == listed[-1]
    assert list(columns.take([499, 3, 64])) == [listed[499], listed[3], listed[64]]
    assert list(columns[60:70]) == listed[60:70]
    assert np.array_equal(columns.lengths(), [len(r.input_ids) for r in listed])
    assert list(columns.ids) == [r.example_id for r in listed]


def test_rendering_in_chunks_is_rendering_the_list(tiny_tokenizer):
    rows = [{"prompt": f"my order {i} is late", "completion": f" refund {i}"} for i in range(50)]
    train = examples(rows)
    setup = TrainingSetup(max_length=9)
    listed = render_dataset(train, tiny_tokenizer, setup)
    assert list(RenderedColumns.from_chunks(render_chunks(train, tiny_tokenizer, setup))) == listed


@pytest.mark.parametrize("setup", [TrainingSetup(), TrainingSetup(max_length=8), TrainingSetup(packing=True)])
def test_every_check_finds_the_same_over_columns_as_over_lists(tiny_tokenizer, setup):
    rows = clean_rows(30)
    rows[4] = dict(rows[1])  # an exact duplicate
    rows[9] = {"prompt": rows[9]["prompt"], "completion": ' {"intent": "order", "ord'}  # cut in the data
    train = examples(rows)
    rendered = render_dataset(train, tiny_tokenizer, setup)

    def findings(train_rows, rendered_rows):
        ctx = AuditContext(train_rows, rendered_rows, tiny_tokenizer, setup, None, None,
                           BaseModelRef("tiny/base", "tiny/base"), base_config(tiny_tokenizer))
        return [f.to_dict() for f in run_checks(ctx)]

    expected = findings(train, rendered)
    assert expected  # the planted faults are found
    assert findings(ExampleColumns.from_examples(train, batch_rows=7),
                    RenderedColumns.from_rendered(rendered, batch_rows=7)) == expected


def test_positions_and_masks_in_arrow_equal_the_dict_lookup():
    ids = [f"id{i}" for i in range(300)]
    column = StringColumn.of(ids, batch_rows=64)
    wanted = ["id5", "nope", "id299", "id0", "id5"]
    assert np.array_equal(positions_of(column, wanted), positions_of(ids, wanted))
    assert list(positions_of(ids, wanted)) == [5, -1, 299, 0, 5]
    assert np.array_equal(mask_of(column, wanted), mask_of(ids, wanted)) and mask_of(ids, wanted).sum() == 3
    assert list(column.take([3, 1])) == ["id3", "id1"] and column[-1] == "id299" and list(column[2:4]) == ids[2:4]


def test_the_rows_take_a_few_bytes_a_token_and_a_few_dozen_a_row():
    n, tokens = 20000, 24
    rng = np.random.default_rng(0)
    rendered = RenderedColumns.from_rendered(
        Rendered(f"r{i}", ids, [IGNORE] * 8 + ids[8:], tokens, 8)
        for i, ids in enumerate(rng.integers(4, 30000, size=(n, tokens)).tolist()))
    per_row = rendered.nbytes / n
    assert per_row <= tokens * 4.2 + 48, per_row  # int32 tokens + a loss bit each; ids, offsets, lengths, flags
    texts = [(f"please help my invoice {i}", f'{{"intent": "invoice", "n": {i}}}') for i in range(n)]
    example_columns = ExampleColumns.from_examples(
        Example(f"r{i}", i + 1, {"prompt": p, "completion": c}) for i, (p, c) in enumerate(texts))
    text_bytes = sum(len(p) + len(c) + len(f"r{i}") for i, (p, c) in enumerate(texts)) / n
    assert example_columns.nbytes / n <= text_bytes + 40, (example_columns.nbytes / n, text_bytes)
    # the Python objects these replace: ~1.3 KB a row
    assert rendered.nbytes / n + example_columns.nbytes / n < 300


REGRESSION = dict(capability="json_formatting", base_rate=0.95, finetuned_rate=0.6, delta=-0.35, ci_low=-0.45,
                  ci_high=-0.25, p_value=1e-6, n=80, significant=True)


def planted(n_per: int = 40, seed: int = 0):
    """Rows of three topics with the harm planted in the first, findings on some rows, effects (Q, N)."""
    rng = np.random.default_rng(seed)
    topics = [("invoice currency amount", "invoice"), ("shipping package late", "shipping"),
              ("refund card payment", "refund")]
    train, labels = [], []
    for i in range(3 * n_per):
        words, name = topics[i % 3]
        train.append(Example(f"r{i}", i + 1, {"prompt": f"please {words} {i}", "completion": f'{{"intent": "{name}"}}'},
                             raw={"id": f"r{i}", "prompt": f"please {words} {i}", "completion": f'{{"intent": "{name}"}}',
                                  "k": i}))
        labels.append(i % 3)
    labels = np.array(labels)
    effects = rng.normal(size=(6, len(train))) * 0.1 - 0.8 * (labels == 0)
    findings = [Finding("cut_in_data", "warning", "cut", "fix", [f"r{i}" for i in range(0, 30, 3)]),
                Finding("duplicate", "info", "dup", "fix", ["r5", "r7"])]
    return train, labels, effects, findings


def test_clusters_groups_and_flags_are_the_same_from_columns():
    train, labels, effects, findings = planted()
    columns = ExampleColumns.from_examples(train, batch_rows=16)
    ids = [e.id for e in train]
    names = {0: "invoice", 1: "shipping", 2: "refund"}
    listed = summarize_clusters(ids, labels, effects, names, findings, seed=0)
    arrow = summarize_clusters(ids_of(columns), labels, effects, names, findings, seed=0)
    assert [s.to_dict() for s in arrow] == [s.to_dict() for s in listed]
    assert listed[0].id == 0 and listed[0].harm_share > 0.9  # the planted topic holds the harm
    assert isinstance(arrow[0].example_ids, StringColumn) and arrow[0].example_ids == listed[0].example_ids
    prompts = ["please invoice currency amount 5", "please refund card payment"]
    a = candidate_groups(columns, findings, effects, arrow, prompts, seed=0)
    b = candidate_groups(train, findings, effects, listed, prompts, seed=0)
    assert [g.to_dict() for g in a.groups] == [g.to_dict() for g in b.groups]
    assert [c.to_dict() for c in a.clusters or []] == [c.to_dict() for c in b.clusters or []]
    flags = RowFlags.of(ids_of(columns), findings)
    assert flags.checks == ["cut_in_data", "duplicate"] and flags.of_row(3) == ["cut_in_data"]
    assert flags.of_row(5) == ["duplicate"] and flags.of_row(1) == [] and flags.hits.dtype == bool


def test_group_statistics_from_labels_equal_the_dense_float64_membership():
    _, labels, effects, _ = planted(n_per=50, seed=3)
    dense = np.stack([labels == c for c in range(3)]).astype(np.float64)  # (C, N), the naive reference
    by_labels = group_statistics(effects, LabelMembership(labels, [0, 1, 2]), seed=1)
    reference = group_statistics(effects, dense, seed=1)
    for name in ("size_share", "harm_share", "ci_low", "ci_high", "lift", "mean_effect"):
        assert np.allclose(getattr(by_labels, name), getattr(reference, name), rtol=1e-12, atol=1e-12), name
    harm = np.maximum(-effects.mean(axis=0), 0)
    assert np.allclose(by_labels.harm_share, dense @ harm / harm.sum(), atol=1e-12)


def test_nearest_rows_by_chunks_equal_the_rows_at_once():
    train, _, _, _ = planted()
    texts = [e.prompt_text for e in train]
    prompts = ["please invoice currency", "refund card", "zzz unknown"]
    whole = nearest_rows(texts, prompts, k=7, chunk_rows=10**6)
    assert whole is not None and whole.shape == (2, 7)
    assert np.array_equal(nearest_rows(texts, prompts, k=7, chunk_rows=9), whole)


def test_the_report_from_columns_is_the_report_from_lists(tmp_path):
    train, labels, effects, findings = planted()
    source = tmp_path / "train.jsonl"
    source.write_bytes(b"".join(json.dumps(e.raw).encode() + (b"\r\n" if i % 2 else b"\n")
                                for i, e in enumerate(train))[:-1])  # CRLF lines, no final newline
    train = read_dataset(source)
    columns = ExampleColumns.from_examples(train, batch_rows=16)
    culprits = [f"r{i}" for i in range(0, 30, 3)]
    verdict = Verdict(kind="data-cluster", summary="s", evidence={"effect_threshold": -0.5}, culprit_ids=culprits,
                      next_action="drop")
    outputs = []
    for rows in (train, columns):
        clusters = summarize_clusters(ids_of(rows), labels, effects, {}, findings, seed=0)
        report = build_report(REGRESSION, verdict, findings, rows, attribution=Attribution(effects, labels, clusters))
        folder = tmp_path / type(rows).__name__
        write_report(folder, report, rows, ExampleRows.of(ids_of(rows), effects.mean(axis=0), labels, findings,
                                                          culprits))
        outputs.append({p.name: p.read_bytes() for p in folder.iterdir()})
    assert outputs[0] == outputs[1] and "train.cleaned.jsonl" in outputs[1]
    cleaned = outputs[1]["train.cleaned.jsonl"].decode()
    with open(source, encoding="utf-8", newline="") as stream:
        kept = stream.readlines()
    assert cleaned == "".join(line if line.endswith("\n") else line + "\n"
                              for i, line in enumerate(kept) if f"r{i}" not in culprits)
    assert "\r\n" in cleaned and len(outputs[1]["culprits.jsonl"].decode().splitlines()) == len(culprits)
    top = json.loads(outputs[1]["report.json"])["top_rows"]
    assert {row["id"] for row in top} == set(culprits)
    assert texts_of(columns)[2] == (train[2].prompt_text, train[2].completion_text)


def test_rendered_rows_share_the_examples_id_column_and_must_be_their_rows():
    train = examples([{"prompt": f"p{i}", "completion": f"c{i}"} for i in range(10)])
    columns = ExampleColumns.from_examples(train, batch_rows=4)
    listed = [Rendered(e.id, [1, 2, 3], [IGNORE, 2, 3], 3, 1) for e in train]
    shared = RenderedColumns.from_rendered(listed, batch_rows=3, ids=columns.ids)  # batches that do not align
    own = RenderedColumns.from_rendered(listed, batch_rows=3)
    assert list(shared) == listed == list(own) and shared[-1] == listed[-1] and shared.ids is columns.ids
    assert shared.nbytes == own.nbytes - own.ids.nbytes  # the shared column is the examples' to count
    with pytest.raises(ValueError, match="not the examples' rows"):
        RenderedColumns.from_rendered(listed[::-1], ids=columns.ids)
