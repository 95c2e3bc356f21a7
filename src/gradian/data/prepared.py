"""The rows `diagnose` audits and `attribute` takes gradients on: the trainer's own, where the run recorded them.

A run trained with `GradianCallback` holds `gradian_rows.safetensors` (`data.recorded_rows`): every row as the
trainer prepared it. A dataset row is matched to its recorded row by its `id` when the record holds that id (and
then its content must agree: an edited row is not the row trained), else by its content (`content_hash`, which
finds the row in the trainer's dataset order or any other). A matched row is read from the record and never re-rendered; a row without a match
is rendered by Gradian's port of the trainer (`data.render`), and `RowsSource` says how many and why.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from gradian.data.columns import ExampleColumns
from gradian.data.recorded_rows import RecordedRows, content_hash, find_rows_file, read_recorded_rows
from gradian.data.render import BATCH, Rendered, render_chunks
from gradian.data.rendered_columns import RenderedColumns
from gradian.data.run_folder import RunInfo
from gradian.data.run_record import RunRecord
from gradian.data.setup import TrainingSetup
from gradian.data.trl_prepare import Preparation

SHOWN_IDS = 5  # rendered rows a description names
RECORDED = "rows as the trainer prepared them, recorded by GradianCallback"


@dataclass
class RowsSource:
    """Where the audited rows came from: `rows_from` is `record` (every row), `render` (none) or `record+render`."""

    rows_from: str
    recorded: int = 0  # rows read from the record
    rendered: int = 0  # rows Gradian's renderer produced
    file: str | None = None  # the rows file read
    matched_by: str | None = None  # "id" | "content": how dataset rows found their recorded rows
    why: str | None = None  # why rows were rendered although the run has a record
    rendered_ids: list[str] = field(default_factory=list)  # the first SHOWN_IDS of them

    def describe(self) -> str:
        """One line for a command's output."""
        if self.rows_from == "record":
            return f"all {self.recorded} {RECORDED} ({self.file}; matched by {self.matched_by})"
        rendered = f"{self.rendered} rendered by Gradian from the dataset and the run's settings"
        because = f": {self.why}" if self.why else ""
        if self.rows_from == "render":
            return rendered + because
        shown = ", ".join(self.rendered_ids) + (", ..." if self.rendered > len(self.rendered_ids) else "")
        return (f"{self.recorded} {RECORDED} ({self.file}; matched by {self.matched_by}); {rendered}{because} "
                f"(rows {shown})")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "summary": self.describe()}


def training_rows(examples: ExampleColumns, tokenizer: Any, setup: TrainingSetup, run: RunInfo | None,
                  tally: Preparation | None = None) -> tuple[RenderedColumns, RowsSource]:
    """`examples` as trained: from the run's recorded rows where they match, rendered otherwise (`tally` counts
    whose code rendered them).

    Raises `InputError` naming the rows file when the record names one that is damaged."""
    recorded, why = _recorded(run.record if run is not None else None)
    if recorded is None:
        rendered = RenderedColumns.from_chunks(render_chunks(examples, tokenizer, setup, tally), ids=examples.ids)
        return rendered, RowsSource("render", rendered=len(examples), why=why)
    assert run is not None and run.record is not None
    matches, matched_by, why = match_rows(examples, recorded, run.record)
    chunks = _merged(examples, matches, recorded, tokenizer, setup, tally)
    rendered = RenderedColumns.from_chunks(chunks, ids=examples.ids)
    found = sum(j is not None for j in matches)
    kind = "record" if found == len(examples) else "render" if not found else "record+render"
    shown = [e for e, j in zip(examples.ids, matches, strict=True) if j is None][:SHOWN_IDS]
    return rendered, RowsSource(kind, found, len(examples) - found, str(recorded.path), matched_by,
                                why if found < len(examples) else None, shown)


def _recorded(record: RunRecord | None) -> tuple[RecordedRows | None, str | None]:
    """The run's recorded rows, or None and why there are none to read."""
    if record is None:
        return None, None
    reference = record.rows
    if reference is None:
        return None, ("its gradian_run.json holds no rows (written by a GradianCallback that did not record them, "
                      "or on a dataset it could not read)")
    path = find_rows_file(record.path, reference)
    if path is None:
        return None, f"{reference.get('file')}, which gradian_run.json names, is not in the run folder"
    return read_recorded_rows(path, reference), None


def match_rows(examples: Sequence[Any], recorded: RecordedRows,
               record: RunRecord) -> tuple[list[int | None], str, str | None]:
    """(each example's recorded row or None, how they were matched, why some were not). An example whose id the
    record holds is that row, and must have its text; any other is found by its text."""
    reference = record.rows or {}
    eos = [str(e) for e in reference.get("eos_stripped") or []]
    ids = (record.data.get("dataset") or {}).get("ids")
    by_id = {str(name): j for j, name in enumerate(ids)} if isinstance(ids, list) and len(ids) == len(recorded) \
        else None
    by_content = _by_content(recorded)
    matches: list[int | None] = []
    absent = changed = named = 0
    for example in examples:
        digest = content_hash(example.fields, eos)
        found = by_id.get(example.id) if by_id is not None else None
        if found is not None:  # the id names the row: its text must be the trainer's
            named += 1
            if recorded.content(found) != digest:
                found, changed = None, changed + 1
        else:  # an id the trainer did not have, or no ids: a row of the same text trained the same
            found = by_content.get(digest)
            absent += found is None
        matches.append(found)
    how = "id" if named == len(matches) else "content" if not named else "id, else content"
    return matches, how, _why(absent, changed, reference)


def _by_content(recorded: RecordedRows) -> dict[bytes, int]:
    """Content hash -> the first recorded row of that content (rows of equal text are equal to training)."""
    out: dict[bytes, int] = {}
    for index in range(len(recorded)):
        digest = recorded.content(index)
        if digest is not None:
            out.setdefault(digest, index)
    return out


def _why(absent: int, changed: int, reference: dict[str, Any]) -> str | None:
    """Why rows found no recorded row, in words."""
    if not reference.get("with_content"):
        return "the trainer kept no text beside its tokens, so no dataset row can be tied to a recorded row"
    parts = []
    if absent:
        parts.append(f"{absent} match no recorded row by id or text (the trainer dropped or never had them)")
    if changed:
        parts.append(f"{changed} differ from the trainer's copy of them (the dataset changed since training)")
    return "; ".join(parts) or None


def _merged(examples: ExampleColumns, matches: list[int | None], recorded: RecordedRows, tokenizer: Any,
            setup: TrainingSetup, tally: Preparation | None) -> Iterator[list[Rendered]]:
    """The rows in dataset order, BATCH at a time: recorded ones read from the record, the rest rendered lazily."""
    unmatched = (example for example, j in zip(examples, matches, strict=True) if j is None)
    rendered = itertools.chain.from_iterable(render_chunks(unmatched, tokenizer, setup, tally))
    names = iter(examples.ids)
    for start in range(0, len(matches), BATCH):
        yield [recorded.row(j, next(names)) if j is not None else _named(next(rendered), next(names))
               for j in matches[start : start + BATCH]]


def _named(row: Rendered, name: str) -> Rendered:
    assert row.example_id == name, (row.example_id, name)  # the renderer keeps the examples' order
    return row
