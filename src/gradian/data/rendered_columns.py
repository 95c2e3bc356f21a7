"""Rendered rows as columns: `RenderedColumns`, a `Sequence[Rendered]` over Arrow record batches (`data.columns`).

Per row: its tokens (one flat int32 buffer per batch, int32 offsets), one bit per token saying whether the token is
its own label (else IGNORE), the labels themselves only for a row where that does not hold, the row's lengths and
flags; the ids are the examples' own column. About 4.1 bytes a token plus ~25 bytes a row (`nbytes`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from gradian.data.columns import BATCH_ROWS, RowBatches, Rows, StringColumn, chunked, string_array
from gradian.data.render import IGNORE, Rendered

RENDERED_SCHEMA = pa.schema([
    ("input_ids", pa.list_(pa.int32())),  # the rows' ids are a column of their own (`RenderedColumns.ids`)
    ("trained", pa.list_(pa.bool_())),  # True where a token's label is the token, False where it is IGNORE
    ("labels", pa.list_(pa.int32())),  # null unless the labels are not `trained`'s tokens-or-IGNORE
    ("full_length", pa.int32()), ("prompt_length", pa.int32()), ("tail_cut", pa.bool_()), ("dropped", pa.bool_()),
    ("over_limit", pa.dictionary(pa.int32(), pa.string())),
])


class RenderedColumns(Rows[Rendered]):
    """Rendered rows as columns (see the module docstring); `rendered[i]` is the `Rendered` row training saw."""

    def __init__(self, batches: Iterable[pa.RecordBatch], ids: StringColumn, *, shared_ids: bool = False) -> None:
        self._rows = RowBatches(batches, RENDERED_SCHEMA)
        self._views = [_TokenView(batch) for batch in self._rows.batches]
        self.ids = ids  # (N,) example id of every row
        self.shared_ids = shared_ids  # the examples' own id column (one owner: not counted in `nbytes`)
        if len(ids) != len(self._rows):
            raise ValueError(f"{len(ids)} ids for {len(self._rows)} rendered rows")

    @classmethod
    def from_chunks(cls, chunks: Iterable[Sequence[Rendered]], ids: StringColumn | None = None) -> RenderedColumns:
        """Columns of rows that arrive a chunk at a time (`data.render.render_chunks`); each chunk is one batch.

        With `ids` (the examples' id column) the rows must be those examples in order, and share that column.
        """
        batches, own, done = [], [], 0
        for chunk in chunks:
            if not len(chunk):
                continue
            names = [row.example_id for row in chunk]
            if ids is None:
                own.append(string_array(names))
            elif names != ids.values.slice(done, len(chunk)).to_pylist():
                raise ValueError(f"rendered rows {done}..{done + len(chunk)} are not the examples' rows in order")
            batches.append(_rendered_batch(chunk))
            done += len(chunk)
        if ids is not None:
            return cls(batches, ids, shared_ids=True)
        return cls(batches, StringColumn(pa.chunked_array(own, type=pa.string())))

    @classmethod
    def from_rendered(cls, rendered: Iterable[Rendered], batch_rows: int = BATCH_ROWS,
                      ids: StringColumn | None = None) -> RenderedColumns:
        return cls.from_chunks(chunked(rendered, batch_rows), ids)

    def __len__(self) -> int:
        return len(self._rows)

    def _at(self, index: int) -> Rendered:
        batch, row = self._rows.locate(index)
        return self._views[batch].row(row, self.ids[self._rows.starts[batch] + row])

    def __iter__(self) -> Iterator[Rendered]:
        names = iter(self.ids)
        for view in self._views:
            yield from view.rows(names)

    def __repr__(self) -> str:
        return f"RenderedColumns({len(self)} rows, {self.nbytes} bytes)"

    def take(self, indices: Any) -> RenderedColumns:
        return RenderedColumns(self._rows.take(indices), self.ids.take(indices))

    def lengths(self) -> np.ndarray:
        """(N,) tokens of every row as trained."""
        return np.concatenate([np.diff(view.offsets) for view in self._views]) if self._views else np.zeros(0, int)

    @property
    def nbytes(self) -> int:
        own = 0 if self.shared_ids else self.ids.nbytes
        return self._rows.nbytes + sum(view.nbytes for view in self._views) + own


class _TokenView:
    """NumPy views of one batch's buffers (no copy but the two flag columns), to build rows fast."""

    def __init__(self, batch: pa.RecordBatch) -> None:
        tokens, trained = batch.column("input_ids"), batch.column("trained")
        self.offsets = tokens.offsets.to_numpy()  # (n + 1,) into `values`
        self.values = tokens.values.to_numpy()  # (T,) int32
        bits = trained.values  # one bit per token, Arrow's order (least significant first)
        self.bits = np.frombuffer(bits.buffers()[1], dtype=np.uint8) if len(bits) else np.zeros(0, np.uint8)
        self.bit_start = bits.offset + int(trained.offsets[0].as_py()) - int(self.offsets[0])
        self.labels = batch.column("labels")
        self.full_length = batch.column("full_length").to_numpy()
        self.prompt_length = batch.column("prompt_length").to_numpy()
        self.tail_cut = batch.column("tail_cut").to_numpy(zero_copy_only=False)
        self.dropped = batch.column("dropped").to_numpy(zero_copy_only=False)
        over = batch.column("over_limit")
        self.over_codes, self.over_names = over.indices.to_numpy(), over.dictionary.to_pylist()

    @property
    def nbytes(self) -> int:
        return self.tail_cut.nbytes + self.dropped.nbytes

    def trained(self, start: int, stop: int) -> np.ndarray:
        """(stop - start,) bool: which of the tokens [start, stop) are their own labels."""
        first, last = self.bit_start + start, self.bit_start + stop
        lo = first // 8
        unpacked = np.unpackbits(self.bits[lo : (last + 7) // 8], bitorder="little")
        return unpacked[first - 8 * lo : last - 8 * lo].astype(bool)

    def row(self, i: int, example_id: str) -> Rendered:
        start, stop = int(self.offsets[i]), int(self.offsets[i + 1])
        tokens = self.values[start:stop]
        labels = self.labels[i].as_py()
        if labels is None:
            labels = np.where(self.trained(start, stop), tokens, IGNORE).tolist()
        return Rendered(example_id, tokens.tolist(), labels,
                        int(self.full_length[i]), int(self.prompt_length[i]), bool(self.tail_cut[i]),
                        bool(self.dropped[i]), self.over_names[self.over_codes[i]])

    def rows(self, ids: Iterator[str]) -> Iterator[Rendered]:
        """This batch's rows, their ids taken from `ids` in order (the batch's buffers go to Python at once)."""
        first, last = int(self.offsets[0]), int(self.offsets[-1])
        tokens = self.values[first:last]  # (T,)
        flat_tokens = tokens.tolist()
        flat_labels = np.where(self.trained(first, last), tokens, IGNORE).tolist()
        bounds = (self.offsets - first).tolist()
        columns = zip(self.labels.to_pylist(), self.full_length.tolist(), self.prompt_length.tolist(),
                      self.tail_cut.tolist(), self.dropped.tolist(), self.over_codes.tolist(), strict=True)
        for i, (labels, full, prompt, tail_cut, dropped, over) in enumerate(columns):
            start, stop = bounds[i], bounds[i + 1]
            yield Rendered(next(ids), flat_tokens[start:stop], flat_labels[start:stop] if labels is None else labels,
                           full, prompt, tail_cut, dropped, self.over_names[over])


def _rendered_batch(rows: Sequence[Rendered]) -> pa.RecordBatch:
    """One record batch of `rows`: flat tokens, a trained bit per token, labels kept only where they must be."""
    lengths = np.fromiter((len(r.input_ids) for r in rows), dtype=np.int64, count=len(rows))
    offsets = np.concatenate([[0], np.cumsum(lengths)])  # (n + 1,)
    if offsets[-1] >= 2**31:
        raise ValueError(f"{offsets[-1]} tokens in one batch of {len(rows)} rows; use smaller batches")
    tokens = np.fromiter(itertools.chain.from_iterable(r.input_ids for r in rows), dtype=np.int32,
                         count=int(offsets[-1]))  # (T,)
    trained, plain = _trained(rows, tokens, offsets)
    label_lengths = np.where(plain, 0, [len(r.labels) for r in rows])
    label_offsets = np.concatenate([[0], np.cumsum(label_lengths)]).astype(np.int32)
    kept = (r.labels for r, ok in zip(rows, plain, strict=True) if not ok)
    label_values = np.fromiter(itertools.chain.from_iterable(kept), dtype=np.int32, count=int(label_offsets[-1]))
    token_offsets = pa.array(offsets.astype(np.int32))
    bits = pa.BooleanArray.from_buffers(pa.bool_(), len(trained), [None, pa.py_buffer(np.packbits(
        trained, bitorder="little"))])
    arrays = [
        pa.ListArray.from_arrays(token_offsets, pa.array(tokens)),
        pa.ListArray.from_arrays(token_offsets, bits),
        pa.ListArray.from_arrays(pa.array(label_offsets), pa.array(label_values), mask=pa.array(plain)),
        pa.array(np.fromiter((r.full_length for r in rows), dtype=np.int32, count=len(rows))),
        pa.array(np.fromiter((r.prompt_length for r in rows), dtype=np.int32, count=len(rows))),
        pa.array([r.tail_cut for r in rows], type=pa.bool_()),
        pa.array([r.dropped for r in rows], type=pa.bool_()),
        pa.array([r.over_limit for r in rows], type=pa.string()).dictionary_encode(),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=RENDERED_SCHEMA)


def _trained(rows: Sequence[Rendered], tokens: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(T,) bool: label == token, and (n,) bool: the row's every label is its token or IGNORE."""
    if all(len(r.labels) == len(r.input_ids) for r in rows):
        labels = np.fromiter(itertools.chain.from_iterable(r.labels for r in rows), dtype=np.int64, count=len(tokens))
        trained = labels == tokens  # (T,)
        odd = np.concatenate([[0], np.cumsum(~(trained | (labels == IGNORE)))])  # labels neither, counted
        return trained, odd[offsets[1:]] == odd[offsets[:-1]]
    trained, plain = np.zeros(len(tokens), dtype=bool), np.zeros(len(rows), dtype=bool)
    for i, r in enumerate(rows):  # a row whose labels are not one per token keeps its labels as they are
        if len(r.labels) == len(r.input_ids):
            labels, ids = np.asarray(r.labels), np.asarray(r.input_ids)
            trained[offsets[i] : offsets[i + 1]] = labels == ids
            plain[i] = bool(np.all((labels == ids) | (labels == IGNORE)))
    return trained, plain
