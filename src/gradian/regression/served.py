"""The regression where the user serves: the served answers scored, and measured with the training path's test.

Users measure a regression on their serving stack (a merged export, its generation_config.json, the server's chat
template and dtype), not on Gradian's path (the adapter on the base, prompts rendered as trained, greedy decoding).
Given the served answers (`--served-outputs`, and `--served-base-outputs` for the base as served), this module scores
them with the capability and compares them with the same paired test as the training path
(`regression.statistics.compare`), so the two drops can be set side by side: a drop only serving shows is the
serving stack's, not the training rows'.

Files are JSONL, one `{"id": <eval row id>, "output": "<text>"}` per eval row; every eval row needs one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gradian.capabilities import Capability, passed
from gradian.errors import InputError
from gradian.regression.measure import RegressionResult, scores_are_binary
from gradian.regression.statistics import RegressionSummary, compare


@dataclass
class ServedRow:
    """One eval row's served answers and their scores (`base_output` None: Gradian's own base answer was scored)."""

    id: str
    output: str
    score: float
    base_score: float
    base_output: str | None = None


@dataclass
class ServedRegression:
    """The served regression beside the training path's: `served_only_delta` is the drop serving adds (negative)."""

    summary: RegressionSummary
    training: RegressionSummary
    rows: list[ServedRow]
    base_source: str  # "served" (--served-base-outputs) or "gradian" (Gradian's own base answers)
    outputs: str
    base_outputs: str | None = None

    @property
    def served_only_delta(self) -> float:
        """Served delta minus the training path's delta: the part of the drop the serving stack adds."""
        return self.summary.delta - self.training.delta

    def to_dict(self) -> dict[str, Any]:
        """The `served` block of report.json, less the differences (`regression.serving_diff`)."""
        return {
            "outputs": self.outputs, "base_outputs": self.base_outputs, "base_source": self.base_source,
            "regression": self.summary.to_dict(),
            "training": {k: self.training.to_dict()[k] for k in ("delta", "ci_low", "ci_high", "p_value",
                                                                 "significant")},
            "served_only_delta": self.served_only_delta,
            "n_served_fail": sum(1 for row in self.rows if not passed(row.score)),
        }


def read_served_outputs(path: str | Path, ids: list[str]) -> dict[str, str]:
    """{eval row id: served text} from `path`; an unreadable file, a bad line, an unknown or repeated id, or an eval
    row without an answer raise `InputError` naming the file (and line)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError("no such file; pass the served answers as JSONL.", path) from None
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"cannot read the served answers ({getattr(error, 'strerror', None) or error}).",
                         path) from None
    known = set(ids)
    outputs: dict[str, str] = {}
    lines: dict[str, int] = {}  # where each id was answered
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        row_id, output = _served_row(line, path, number)
        if row_id not in known:
            raise InputError(f"id {row_id!r} is not an eval row id; every served answer names the eval row it "
                             "answers.", path, number)
        if row_id in outputs:
            raise InputError(f"id {row_id!r} is answered twice (first on line {lines[row_id]}); keep one served "
                             "answer per eval row.", path, number)
        outputs[row_id], lines[row_id] = output, number
    if not outputs:
        raise InputError("the file holds no served answers; write one JSON line per eval row, "
                         '{"id": ..., "output": ...}.', path)
    missing = [i for i in ids if i not in outputs]
    if missing:
        raise InputError(f"{len(missing)} eval row(s) have no served answer, the first {missing[0]!r}; give one line "
                         "per eval row.", path)
    return outputs


def _served_row(line: str, path: Path, number: int) -> tuple[str, str]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as error:
        raise InputError(f"this line is not valid JSON ({error.msg}); each line is "
                         '{"id": ..., "output": ...}.', path, number) from None
    except RecursionError:
        raise InputError('this line is JSON nested too deeply to read; each line is {"id": ..., "output": ...}.',
                         path, number) from None
    if not isinstance(row, dict) or "id" not in row or not isinstance(row.get("output"), str):
        raise InputError('each line needs an "id" and an "output" string, {"id": ..., "output": ...}.', path, number)
    if not isinstance(row["id"], (str, int)) or isinstance(row["id"], bool):
        raise InputError('"id" must be the eval row id (a string or a number).', path, number)
    return str(row["id"]), row["output"]


@dataclass
class ServedAnswers:
    """The served answers read (`--served-outputs`, and `--served-base-outputs` when given), by eval row id."""

    outputs: dict[str, str]
    path: str
    base: dict[str, str] | None = None
    base_path: str | None = None


def read_served(outputs: str | Path, base_outputs: str | Path | None, ids: list[str]) -> ServedAnswers:
    """Both served files, checked against the eval row ids before anything is generated."""
    base = read_served_outputs(base_outputs, ids) if base_outputs is not None else None
    return ServedAnswers(read_served_outputs(outputs, ids), str(outputs), base,
                         str(base_outputs) if base_outputs is not None else None)


def measure_served(measured: RegressionResult, capability: Capability, answers: ServedAnswers, *,
                   min_effect: float = 0.0, seed: int = 0) -> ServedRegression:
    """Score the served answers and measure their drop with the training path's paired test, on the same rows;
    the base side is the served base's answers when given, else Gradian's own base answers."""
    references = {row.id: row.reference for row in measured.rows}
    served, served_base = answers.outputs, answers.base
    rows = []
    for row in measured.rows:
        base_text = served_base[row.id] if served_base is not None else None
        base_score = capability.score(base_text, references[row.id]) if base_text is not None else row.base_score
        rows.append(ServedRow(row.id, served[row.id], capability.score(served[row.id], references[row.id]),
                              base_score, base_text))
    base, tuned = [row.base_score for row in rows], [row.score for row in rows]  # (n,) each
    binary = scores_are_binary(capability, np.asarray(base, dtype=np.float64), np.asarray(tuned, dtype=np.float64))
    summary = compare(base, tuned, binary=binary, min_effect=min_effect,
                      seed=seed, capability=capability.name, confidence=measured.summary.confidence)
    return ServedRegression(summary, measured.summary, rows, "served" if served_base is not None else "gradian",
                            answers.path, answers.base_path)
