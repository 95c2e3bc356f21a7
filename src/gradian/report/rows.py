"""Per-row results: `examples.jsonl`, one line per training row, beside report.json (which keeps the top rows).

A line is `{"id", "effect", "cluster", "flags", "culprit"}` in dataset order, plus the ranking's parts
(`gradient_effect`, `rank_score`, `relevance_tfidf`, `relevance_repsim`, `row_harm`) when attribution ran (documented in
docs/report-schema.md).
The rows are held as columns (arrays, the flags as a (checks, N) bool array, the ids as a `data.columns.StringColumn`),
not one dict per row, and the file is written a line at a time, so a report over millions of rows stays flat in
memory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gradian.audit.finding import Finding
from gradian.clusters.summary import RowFlags
from gradian.data.columns import mask_of
from gradian.errors import InputError, reason
from gradian.schemas import schema_problem, validator_of

EXAMPLES_FILE = "examples.jsonl"


@dataclass
class ExampleRows:
    """Columns of the per-row results: `effect` and `labels` are None when attribution did not run."""

    ids: Sequence[str]
    effect: np.ndarray | None  # (N,) mean effect over the queries
    labels: np.ndarray | None  # (N,) cluster of each row
    flags: RowFlags  # (checks, N) which checks flag each row
    culprits: np.ndarray  # (N,) bool
    extra: dict[str, np.ndarray] = field(default_factory=dict)  # name -> (N,): the ranking's parts

    @classmethod
    def of(cls, ids: Sequence[str], effect: np.ndarray | None, labels: np.ndarray | None, findings: list[Finding],
           culprit_ids: list[str], extra: dict[str, np.ndarray] | None = None) -> ExampleRows:
        return cls(ids, effect, labels, RowFlags.of(ids, findings), mask_of(ids, culprit_ids), extra or {})

    def row(self, i: int, example_id: str | None = None) -> dict[str, Any]:
        return {
            "id": self.ids[i] if example_id is None else example_id,
            "effect": None if self.effect is None or not np.isfinite(self.effect[i]) else float(self.effect[i]),
            "cluster": None if self.labels is None else int(self.labels[i]),
            "flags": self.flags.of_row(i),
            "culprit": bool(self.culprits[i]),
            **{name: float(values[i]) for name, values in self.extra.items()},
        }

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self.row(i, example_id) for i, example_id in enumerate(self.ids))

    def write(self, path: Path) -> Path:
        """Write examples.jsonl through a temporary file (a reader never sees half of it)."""
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(temporary, "w", encoding="utf-8") as stream:
            for row in self:
                stream.write(json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n")
        os.replace(temporary, path)
        return path


def read_examples(out_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of `out_dir/examples.jsonl`, each checked against the report schema's `$defs/example`; a line cut
    short, damaged or edited out of shape is an `InputError` naming the file and line."""
    path = Path(out_dir) / EXAMPLES_FILE
    validator = schema_validator("example")
    try:
        with open(path, encoding="utf-8") as stream:
            return [_example_line(line, validator, path, number) for number, line in enumerate(stream, start=1)]
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"cannot be read ({reason(error)}); rerun `gradian attribute` into its folder.", path) from None


def _example_line(line: str, validator: Any, path: Path, number: int) -> dict[str, Any]:
    try:
        row = json.loads(line, parse_constant=_no_constant)
    except (ValueError, RecursionError) as error:
        raise InputError(f"is not one whole JSON object ({reason(error)}): the file was cut short or edited; rerun "
                         "`gradian attribute` into its folder to write it again.", path, number) from None
    problem = schema_problem(validator, row)
    if problem:
        raise InputError(f"does not match the report schema ({problem}); rerun `gradian attribute` into its folder "
                         "to write it again.", path, number)
    return row


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def schema_validator(definition: str | None = None) -> Any:
    """A validator of report.json (`definition=None`) or of one of its `$defs` (`"example"`: a line of
    examples.jsonl), from the JSON Schema the package ships."""
    from gradian.report.schema_doc import report_schema

    schema = report_schema()
    if definition is not None:
        schema = {"$schema": schema.get("$schema"), "$defs": schema["$defs"], "$ref": f"#/$defs/{definition}"}
    return validator_of(schema)
