"""Rows as columns: the training rows held in Arrow record batches, not N Python objects.

A million rows as `Example` dicts and `Rendered` token lists cost ~1.3 KB a row in Python objects. Here they are
Arrow columns, as `datasets` holds a dataset: record batches of BATCH_ROWS rows, strings as UTF-8 buffers with
int32 offsets, numbers as fixed-width arrays. `ExampleColumns` is a `Sequence[Example]` (and
`data.rendered_columns.RenderedColumns` a `Sequence[Rendered]`): indexing or iterating builds one row object at a
time, so code written for lists keeps working while nothing holds N of them. A row is found in its batch by a
binary search over the batch offsets (as `datasets.table.IndexedTableMixin` does).

What is kept per example: id, line, source, prompt text and completion text; a prompt/completion or text row's
`fields` are rebuilt from its two texts, other shapes (messages) keep their fields as JSON too; `raw` is kept as
JSON only where it is not the fields themselves: the texts plus ~30 bytes a row (`nbytes`).
"""

from __future__ import annotations

import bisect
import itertools
import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gradian.data.examples import Example

BATCH_ROWS = 4096
PLAIN, TEXT, JSON_FIELDS = 0, 1, 2  # how an example's fields are kept (`kind`)

EXAMPLE_SCHEMA = pa.schema([
    ("id", pa.string()), ("line", pa.int32()), ("source", pa.int32()), ("kind", pa.int8()),
    ("prompt", pa.string()), ("completion", pa.string()),
    ("fields", pa.string()),  # JSON, "" for a PLAIN or TEXT row (JSON is never empty)
    ("raw", pa.string()),  # JSON, "" when the raw row is its fields
])

T = TypeVar("T")
R = TypeVar("R", bound="Rows[Any]")


class Rows(Sequence[T]):
    """A `Sequence` over columns: an item is built by `_at`, a slice is a `take` of the same kind (no copy to lists)."""

    def _at(self, index: int) -> T:
        raise NotImplementedError

    def take(self: R, indices: Any) -> R:
        raise NotImplementedError

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self: R, index: slice) -> R: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return self.take(np.arange(len(self))[index])
        return self._at(index)


class RowBatches:
    """Record batches of one schema and where each batch starts: row i lives in batch b at i - starts[b]."""

    def __init__(self, batches: Iterable[pa.RecordBatch], schema: pa.Schema) -> None:
        self.schema = schema
        self.batches = [batch for batch in batches if batch.num_rows]
        self.starts = list(itertools.accumulate((b.num_rows for b in self.batches), initial=0))  # (B + 1,)

    def __len__(self) -> int:
        return self.starts[-1]

    def locate(self, index: int) -> tuple[int, int]:
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"row {index} of {n}")
        batch = bisect.bisect_right(self.starts, index) - 1
        return batch, index - self.starts[batch]

    def column(self, name: str) -> pa.ChunkedArray:
        return pa.chunked_array([b.column(name) for b in self.batches], type=self.schema.field(name).type)

    def take(self, indices: Any) -> list[pa.RecordBatch]:
        """The rows at `indices`, BATCH_ROWS to a batch (a batch's int32 offsets never overflow)."""
        table = pa.Table.from_batches(self.batches, schema=self.schema)
        indices = np.asarray(indices, dtype=np.int64)
        return [table.take(pa.array(indices[start : start + BATCH_ROWS])).combine_chunks().to_batches()[0]
                for start in range(0, len(indices), BATCH_ROWS)]

    @property
    def nbytes(self) -> int:
        return sum(batch.nbytes for batch in self.batches)


def chunked(rows: Iterable[Any], size: int) -> Iterator[list[Any]]:
    iterator = iter(rows)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


class StringColumn(Rows[str]):
    """One string per row (ids, texts) in Arrow string arrays; `positions` finds values without a dict."""

    def __init__(self, values: pa.ChunkedArray | pa.Array) -> None:
        self.values = values if isinstance(values, pa.ChunkedArray) else pa.chunked_array([values])

    @classmethod
    def of(cls, values: Iterable[str], batch_rows: int = BATCH_ROWS) -> StringColumn:
        """A column of `values` (a list, or any iterable), built a batch at a time."""
        return cls(pa.chunked_array([string_array(chunk) for chunk in chunked(values, batch_rows)], type=pa.string()))

    def __eq__(self, other: object) -> bool:
        """Equal to any sequence of the same strings in the same order (a list of ids, another column)."""
        if not isinstance(other, Sequence) or isinstance(other, str) or len(other) != len(self):
            return NotImplemented if not isinstance(other, Sequence) else False
        return all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __len__(self) -> int:
        return len(self.values)

    def _at(self, index: int) -> str:
        return self.values[index].as_py()

    def __iter__(self) -> Iterator[str]:
        for chunk in self.values.chunks:
            yield from chunk.to_pylist()

    def __repr__(self) -> str:
        return f"StringColumn({len(self)} rows)"

    def take(self, indices: Any) -> StringColumn:
        return StringColumn(self.values.take(pa.array(np.asarray(indices, dtype=np.int64))))

    def positions(self, values: Iterable[str]) -> np.ndarray:
        """(len(values),) int64: the row of each value (its first), -1 where it is not in the column."""
        wanted = pa.array(list(values), type=pa.large_string())
        found = pc.index_in(wanted, value_set=self.values.cast(pa.large_string()).combine_chunks())
        return np.asarray(found.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)

    @property
    def nbytes(self) -> int:
        return self.values.nbytes


def positions_of(ids: Sequence[str], values: Iterable[str]) -> np.ndarray:
    """(len(values),) int64 row of each value in `ids`, -1 where absent; a `StringColumn` looks them up in Arrow."""
    if isinstance(ids, StringColumn):
        return ids.positions(values)
    first: dict[str, int] = {}
    for index, value in enumerate(ids):
        first.setdefault(value, index)
    return np.array([first.get(value, -1) for value in values], dtype=np.int64)


def mask_of(ids: Sequence[str], values: Iterable[str]) -> np.ndarray:
    """(len(ids),) bool: which rows hold one of `values`."""
    if isinstance(ids, StringColumn):
        wanted = pa.array(list(values), type=pa.string())
        return np.asarray(pc.is_in(ids.values, value_set=wanted).to_numpy(zero_copy_only=False), dtype=bool)
    chosen = set(values)
    return np.fromiter((value in chosen for value in ids), dtype=bool, count=len(ids))


class TextPairs(Sequence[tuple[str, str]]):
    """(prompt text, completion text) of every row, read from two string columns one row at a time."""

    def __init__(self, prompts: StringColumn, completions: StringColumn) -> None:
        self.prompts, self.completions = prompts, completions

    def __len__(self) -> int:
        return len(self.prompts)

    @overload
    def __getitem__(self, index: int) -> tuple[str, str]: ...

    @overload
    def __getitem__(self, index: slice) -> TextPairs: ...

    def __getitem__(self, index: int | slice) -> tuple[str, str] | TextPairs:
        if isinstance(index, slice):
            return TextPairs(self.prompts[index], self.completions[index])
        return self.prompts[index], self.completions[index]

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return zip(self.prompts, self.completions, strict=True)


class ExampleColumns(Rows[Example]):
    """Training rows as columns (see the module docstring); `examples[i]` is the `Example` read from the file."""

    def __init__(self, batches: Iterable[pa.RecordBatch], sources: Sequence[str]) -> None:
        self._rows = RowBatches(batches, EXAMPLE_SCHEMA)
        self.sources = list(sources)
        self.ids = StringColumn(self._rows.column("id"))  # (N,) every row's id, shared by its rendered rows

    @classmethod
    def from_examples(cls, examples: Iterable[Example], batch_rows: int = BATCH_ROWS) -> ExampleColumns:
        """Columns of `examples` (any iterable: a reader's generator is consumed a batch at a time)."""
        sources: dict[str, int] = {}
        batches = [_example_batch(chunk, sources) for chunk in chunked(examples, batch_rows)]
        return cls(batches, list(sources))

    def __len__(self) -> int:
        return len(self._rows)

    def _at(self, index: int) -> Example:
        batch, row = self._rows.locate(index)
        record = self._rows.batches[batch]
        return self._example(*(record.column(name)[row].as_py() for name in EXAMPLE_SCHEMA.names))

    def __iter__(self) -> Iterator[Example]:
        for batch in self._rows.batches:  # a batch's columns to Python at once: far faster than row by row
            for values in zip(*(column.to_pylist() for column in batch.columns), strict=True):
                yield self._example(*values)

    def __repr__(self) -> str:
        return f"ExampleColumns({len(self)} rows, {self.nbytes} bytes)"

    def _example(self, example_id: str, line: int, source: int, kind: int, prompt: str, completion: str,
                 fields_json: str, raw_json: str) -> Example:
        """One row from its column values, in EXAMPLE_SCHEMA's order."""
        if kind == PLAIN:
            fields: dict[str, Any] = {"prompt": prompt, "completion": completion}
        elif kind == TEXT:
            fields = {"text": completion}
        else:
            fields = json.loads(fields_json)
        raw = dict(fields) if not raw_json else {} if raw_json == "{}" else json.loads(raw_json)
        return Example(example_id, line, fields, self.sources[source], raw)

    def take(self, indices: Any) -> ExampleColumns:
        return ExampleColumns(self._rows.take(indices), self.sources)

    def holding(self, text: str) -> ExampleColumns:
        """The rows whose fields, written as JSON, hold `text`: a cheap first cut (Arrow's substring search, no row
        decoded) before a check that reads the rows themselves."""
        found = pc.match_substring(self._rows.column("fields"), text)
        return self.take(np.flatnonzero(found.to_numpy(zero_copy_only=False)))

    @property
    def lines(self) -> np.ndarray:
        return self._rows.column("line").to_numpy()

    def texts(self) -> TextPairs:
        """(prompt_text, completion_text) of every row, as clustering and naming read them."""
        return TextPairs(StringColumn(self._rows.column("prompt")), StringColumn(self._rows.column("completion")))

    @property
    def nbytes(self) -> int:
        return self._rows.nbytes


def _example_batch(examples: list[Example], sources: dict[str, int]) -> pa.RecordBatch:
    kinds = [_kind(example.fields) for example in examples]
    columns = [
        string_array([example.id for example in examples]),
        pa.array(np.fromiter((example.line for example in examples), dtype=np.int32, count=len(examples))),
        pa.array(np.fromiter((sources.setdefault(example.source, len(sources)) for example in examples),
                             dtype=np.int32, count=len(examples))),
        pa.array(np.array(kinds, dtype=np.int8)),
        string_array([example.prompt_text for example in examples]),
        string_array([example.completion_text for example in examples]),
        string_array([json.dumps(example.fields, ensure_ascii=False) if kind == JSON_FIELDS else ""
                  for example, kind in zip(examples, kinds, strict=True)]),
        string_array(["" if example.raw == example.fields else json.dumps(example.raw, ensure_ascii=False)
                  for example in examples]),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=EXAMPLE_SCHEMA)


def string_array(values: list[str]) -> pa.StringArray:
    """A string array of exactly the bytes it holds (Arrow's builder would leave grown buffers behind)."""
    encoded = [value.encode("utf-8") for value in values]
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(values)), out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise ValueError(f"{offsets[-1]} bytes of text in one batch of {len(values)} rows; use smaller batches")
    return pa.StringArray.from_buffers(len(values), pa.py_buffer(offsets.astype(np.int32)),
                                       pa.py_buffer(b"".join(encoded)))


def _kind(fields: dict[str, Any]) -> int:
    keys = list(fields)
    if keys == ["prompt", "completion"] and all(isinstance(value, str) for value in fields.values()):
        return PLAIN
    if keys == ["text"] and isinstance(fields["text"], str):
        return TEXT
    return JSON_FIELDS


def ids_of(examples: Sequence[Example]) -> Sequence[str]:
    """Every row's id: the id column of `ExampleColumns`, else a list."""
    return examples.ids if isinstance(examples, ExampleColumns) else [example.id for example in examples]


def texts_of(examples: Sequence[Example]) -> Sequence[tuple[str, str]]:
    """Every row's (prompt_text, completion_text): two columns of `ExampleColumns`, else a list."""
    if isinstance(examples, ExampleColumns):
        return examples.texts()
    return [(example.prompt_text, example.completion_text) for example in examples]
