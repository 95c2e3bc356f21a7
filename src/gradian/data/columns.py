"""Rows as columns: the training rows and their rendering held in Arrow record batches, not N Python objects.

A million rows as `Example` dicts and `Rendered` token lists cost ~1.3 KB a row in Python objects. Here they are
Arrow columns, as `datasets` holds a dataset: token ids in one flat int32 buffer per batch with int64 offsets
(Arrow's large_list), strings as UTF-8 buffers with offsets (large_string), flags as fixed-width arrays.
`ExampleColumns` is a `Sequence[Example]` and `RenderedColumns` a `Sequence[Rendered]`: indexing or iterating
builds one row object at a time, so code written for lists keeps working while nothing holds N of them. A row is
found in its batch by a binary search over the batch offsets (as `datasets.table.IndexedTableMixin` does).

What is kept per example: id, line, source, prompt text and completion text; a prompt/completion or text row's
`fields` are rebuilt from its two texts, other shapes (messages) keep their fields as JSON too; `raw` is kept as
JSON only where it is not the fields themselves. Per rendered row: its tokens, a 0/1 byte per token saying whether
the token is its own label (else IGNORE), the labels themselves only for a row where that does not hold, and the
row's lengths and flags.
"""

from __future__ import annotations

import bisect
import itertools
import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gradian.data.examples import Example
from gradian.data.render import IGNORE, Rendered

BATCH_ROWS = 4096
PLAIN, TEXT, JSON_FIELDS = 0, 1, 2  # how an example's fields are kept (`kind`)

EXAMPLE_SCHEMA = pa.schema([
    ("id", pa.large_string()), ("line", pa.int64()), ("source", pa.int32()), ("kind", pa.int8()),
    ("prompt", pa.large_string()), ("completion", pa.large_string()),
    ("fields", pa.large_string()),  # JSON, null for a PLAIN or TEXT row
    ("raw", pa.large_string()),  # JSON, null when the raw row is its fields
])
RENDERED_SCHEMA = pa.schema([
    ("example_id", pa.large_string()), ("input_ids", pa.large_list(pa.int32())),
    ("trained", pa.large_list(pa.uint8())),  # 1 where a token's label is the token, 0 where it is IGNORE
    ("labels", pa.large_list(pa.int32())),  # null unless the labels are not `trained`'s tokens-or-IGNORE
    ("full_length", pa.int64()), ("prompt_length", pa.int64()), ("tail_cut", pa.bool_()), ("dropped", pa.bool_()),
    ("over_limit", pa.dictionary(pa.int32(), pa.string())),
])


class _Batches:
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
        table = pa.Table.from_batches(self.batches, schema=self.schema)
        return table.take(pa.array(np.asarray(indices, dtype=np.int64))).combine_chunks().to_batches()

    @property
    def nbytes(self) -> int:
        return sum(batch.nbytes for batch in self.batches)


def _chunks(rows: Iterable[Any], size: int) -> Iterator[list[Any]]:
    iterator = iter(rows)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


class StringColumn(Sequence[str]):
    """One string per row (ids, texts) in an Arrow large_string array; `positions` finds values without a dict."""

    def __init__(self, values: pa.ChunkedArray | pa.Array) -> None:
        self.values = values if isinstance(values, pa.ChunkedArray) else pa.chunked_array([values])

    def __len__(self) -> int:
        return len(self.values)

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> StringColumn: ...

    def __getitem__(self, index: int | slice) -> str | StringColumn:
        if isinstance(index, slice):
            return self.take(np.arange(len(self))[index])
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
        found = pc.index_in(wanted, value_set=self.values.combine_chunks())
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
        wanted = pa.array(list(values), type=pa.large_string())
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


class ExampleColumns(Sequence[Example]):
    """Training rows as columns (see the module docstring); `examples[i]` is the `Example` read from the file."""

    def __init__(self, batches: Iterable[pa.RecordBatch], sources: Sequence[str]) -> None:
        self._rows = _Batches(batches, EXAMPLE_SCHEMA)
        self.sources = list(sources)

    @classmethod
    def from_examples(cls, examples: Iterable[Example], batch_rows: int = BATCH_ROWS) -> ExampleColumns:
        """Columns of `examples` (any iterable: a reader's generator is consumed a batch at a time)."""
        sources: dict[str, int] = {}
        batches = [_example_batch(chunk, sources) for chunk in _chunks(examples, batch_rows)]
        return cls(batches, list(sources))

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, index: int) -> Example: ...

    @overload
    def __getitem__(self, index: slice) -> ExampleColumns: ...

    def __getitem__(self, index: int | slice) -> Example | ExampleColumns:
        if isinstance(index, slice):
            return self.take(np.arange(len(self))[index])
        batch, row = self._rows.locate(index)
        record = self._rows.batches[batch]
        return self._example({name: record.column(name)[row].as_py() for name in EXAMPLE_SCHEMA.names})

    def __iter__(self) -> Iterator[Example]:
        for batch in self._rows.batches:
            for values in batch.to_pylist():
                yield self._example(values)

    def __repr__(self) -> str:
        return f"ExampleColumns({len(self)} rows, {self.nbytes} bytes)"

    def _example(self, values: dict[str, Any]) -> Example:
        kind, prompt, completion = values["kind"], values["prompt"], values["completion"]
        if kind == PLAIN:
            fields: dict[str, Any] = {"prompt": prompt, "completion": completion}
        elif kind == TEXT:
            fields = {"text": completion}
        else:
            fields = json.loads(values["fields"])
        raw = dict(fields) if values["raw"] is None else json.loads(values["raw"])
        return Example(values["id"], values["line"], fields, self.sources[values["source"]], raw)

    def take(self, indices: Any) -> ExampleColumns:
        return ExampleColumns(self._rows.take(indices), self.sources)

    @property
    def ids(self) -> StringColumn:
        return StringColumn(self._rows.column("id"))

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
    columns: dict[str, list[Any]] = {name: [] for name in EXAMPLE_SCHEMA.names}
    for example in examples:
        kind = _kind(example.fields)
        values = (example.id, example.line, sources.setdefault(example.source, len(sources)), kind,
                  example.prompt_text, example.completion_text,
                  None if kind != JSON_FIELDS else json.dumps(example.fields, ensure_ascii=False),
                  None if example.raw == example.fields else json.dumps(example.raw, ensure_ascii=False))
        for name, value in zip(EXAMPLE_SCHEMA.names, values, strict=True):
            columns[name].append(value)
    return pa.RecordBatch.from_pydict(columns, schema=EXAMPLE_SCHEMA)


def _kind(fields: dict[str, Any]) -> int:
    keys = list(fields)
    if keys == ["prompt", "completion"] and all(isinstance(value, str) for value in fields.values()):
        return PLAIN
    if keys == ["text"] and isinstance(fields["text"], str):
        return TEXT
    return JSON_FIELDS


class RenderedColumns(Sequence[Rendered]):
    """Rendered rows as columns (see the module docstring); `rendered[i]` is the `Rendered` row training saw."""

    def __init__(self, batches: Iterable[pa.RecordBatch]) -> None:
        self._rows = _Batches(batches, RENDERED_SCHEMA)
        self._views = [_TokenView(batch) for batch in self._rows.batches]

    @classmethod
    def from_chunks(cls, chunks: Iterable[Sequence[Rendered]]) -> RenderedColumns:
        """Columns of rows that arrive a chunk at a time (`data.render.render_chunks`); each chunk is one batch."""
        return cls(_rendered_batch(chunk) for chunk in chunks if len(chunk))

    @classmethod
    def from_rendered(cls, rendered: Iterable[Rendered], batch_rows: int = BATCH_ROWS) -> RenderedColumns:
        return cls.from_chunks(_chunks(rendered, batch_rows))

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, index: int) -> Rendered: ...

    @overload
    def __getitem__(self, index: slice) -> RenderedColumns: ...

    def __getitem__(self, index: int | slice) -> Rendered | RenderedColumns:
        if isinstance(index, slice):
            return self.take(np.arange(len(self))[index])
        batch, row = self._rows.locate(index)
        return self._views[batch].row(row)

    def __iter__(self) -> Iterator[Rendered]:
        for view in self._views:
            yield from view.rows()

    def __repr__(self) -> str:
        return f"RenderedColumns({len(self)} rows, {self.nbytes} bytes)"

    def take(self, indices: Any) -> RenderedColumns:
        return RenderedColumns(self._rows.take(indices))

    @property
    def ids(self) -> StringColumn:
        return StringColumn(self._rows.column("example_id"))

    def lengths(self) -> np.ndarray:
        """(N,) tokens of every row as trained."""
        return np.concatenate([np.diff(view.offsets) for view in self._views]) if self._views else np.zeros(0, int)

    @property
    def nbytes(self) -> int:
        return self._rows.nbytes + sum(view.nbytes for view in self._views)


class _TokenView:
    """NumPy views of one batch's buffers (no copy but the two 1-byte flag columns), to build rows fast."""

    def __init__(self, batch: pa.RecordBatch) -> None:
        tokens, trained = batch.column("input_ids"), batch.column("trained")
        self.offsets = tokens.offsets.to_numpy()  # (n + 1,) into `values`
        self.values = tokens.values.to_numpy()  # (T,) int32
        self.trained = trained.values.to_numpy()  # (T,) uint8
        self.shift = int(trained.offsets[0].as_py()) - int(self.offsets[0])  # where its rows start, relative
        self.labels = batch.column("labels")
        self.ids = batch.column("example_id")
        self.full_length = batch.column("full_length").to_numpy()
        self.prompt_length = batch.column("prompt_length").to_numpy()
        self.tail_cut = batch.column("tail_cut").to_numpy(zero_copy_only=False)
        self.dropped = batch.column("dropped").to_numpy(zero_copy_only=False)
        over = batch.column("over_limit")
        self.over_codes, self.over_names = over.indices.to_numpy(), over.dictionary.to_pylist()

    @property
    def nbytes(self) -> int:
        return self.tail_cut.nbytes + self.dropped.nbytes

    def row(self, i: int, example_id: str | None = None) -> Rendered:
        start, stop = int(self.offsets[i]), int(self.offsets[i + 1])
        tokens = self.values[start:stop]
        labels = self.labels[i].as_py()
        if labels is None:
            trained = self.trained[start + self.shift : stop + self.shift].astype(bool)
            labels = np.where(trained, tokens, IGNORE).tolist()
        return Rendered(self.ids[i].as_py() if example_id is None else example_id, tokens.tolist(), labels,
                        int(self.full_length[i]), int(self.prompt_length[i]), bool(self.tail_cut[i]),
                        bool(self.dropped[i]), self.over_names[self.over_codes[i]])

    def rows(self) -> Iterator[Rendered]:
        for i, example_id in enumerate(self.ids.to_pylist()):
            yield self.row(i, example_id)


def _rendered_batch(rows: Sequence[Rendered]) -> pa.RecordBatch:
    """One record batch of `rows`: flat tokens, the trained byte per token, labels kept only where they must be."""
    lengths = np.fromiter((len(r.input_ids) for r in rows), dtype=np.int64, count=len(rows))
    offsets = np.concatenate([[0], np.cumsum(lengths)])  # (n + 1,)
    tokens = np.fromiter(itertools.chain.from_iterable(r.input_ids for r in rows), dtype=np.int32,
                         count=int(offsets[-1]))  # (T,)
    same_length = all(len(r.labels) == len(r.input_ids) for r in rows)
    if same_length:
        labels = np.fromiter(itertools.chain.from_iterable(r.labels for r in rows), dtype=np.int64, count=len(tokens))
        trained = labels == tokens  # (T,)
        odd = np.concatenate([[0], np.cumsum(~(trained | (labels == IGNORE)))])
        plain = odd[offsets[1:]] == odd[offsets[:-1]]  # (n,) every label is its token or IGNORE
    else:
        trained = np.zeros(len(tokens), dtype=bool)
        plain = np.zeros(len(rows), dtype=bool)
        for i, r in enumerate(rows):
            if len(r.labels) == len(r.input_ids):
                hit = np.asarray(r.labels) == np.asarray(r.input_ids)
                trained[offsets[i]:offsets[i + 1]] = hit
                plain[i] = bool(np.all(hit | (np.asarray(r.labels) == IGNORE)))
    kept = [r.labels for r, ok in zip(rows, plain, strict=True) if not ok]
    label_offsets = np.concatenate([[0], np.cumsum([0 if ok else len(r.labels) for r, ok in zip(rows, plain,
                                                                                              strict=True)])])
    label_values = np.fromiter(itertools.chain.from_iterable(kept), dtype=np.int32, count=int(label_offsets[-1]))
    arrays = [
        pa.array([r.example_id for r in rows], type=pa.large_string()),
        pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(tokens)),
        pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(trained.astype(np.uint8))),
        pa.LargeListArray.from_arrays(pa.array(label_offsets), pa.array(label_values), mask=pa.array(plain)),
        pa.array(np.fromiter((r.full_length for r in rows), dtype=np.int64, count=len(rows))),
        pa.array(np.fromiter((r.prompt_length for r in rows), dtype=np.int64, count=len(rows))),
        pa.array([r.tail_cut for r in rows], type=pa.bool_()),
        pa.array([r.dropped for r in rows], type=pa.bool_()),
        pa.array([r.over_limit for r in rows], type=pa.string()).dictionary_encode(),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=RENDERED_SCHEMA)


def ids_of(examples: Sequence[Example]) -> Sequence[str]:
    """Every row's id: the id column of `ExampleColumns`, else a list."""
    return examples.ids if isinstance(examples, ExampleColumns) else [example.id for example in examples]


def texts_of(examples: Sequence[Example]) -> Sequence[tuple[str, str]]:
    """Every row's (prompt_text, completion_text): two columns of `ExampleColumns`, else a list."""
    if isinstance(examples, ExampleColumns):
        return examples.texts()
    return [(example.prompt_text, example.completion_text) for example in examples]
