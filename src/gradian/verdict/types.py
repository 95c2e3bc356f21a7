"""What the verdict returns: its kind, its causes (each with its rows and numbers), the prose and the next action."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

KINDS = ("no-regression", "setup", "data-cluster", "diffuse", "serving")
CAUSE_KINDS = ("rows", "setup", "serving")


@dataclass
class Cause:
    """One cause the verdict names: a group of training rows (`rows`), a setting of the run (`setup`, no rows), or a
    way the served path differs from training's (`serving`, no rows: `name` is the `regression.serving_diff` rule).

    `explains` is the share of the failing answers whose symptom this cause teaches; `harm_share` (with its 95%
    lower bound over eval queries) and `lift` are the share of the gradients' harm its rows hold and that share
    over their size share (None when attribution did not run, or for a setup cause). `example_ids` are the rows it
    names that no cause before it named, so every culprit belongs to exactly one cause. `setting_fix` is the
    one-line change to the run's setting that cut these rows as they were trained, with the value that cuts none
    (the audit finding's `setting_fix`: "raise max_length to ≥ 158 (...)"), and `setting_finding` that finding's
    title, why the rows hurt; both empty when no setting did.
    """

    kind: str
    name: str  # a finding group ("cut_in_data", "fails_capability:wrapped"), "cluster 3", or a setup check
    located_by: str  # failures | harm | symptom-harm | gradients | symptom | serving: what found it (verdict.rules)
    example_ids: list[str] = field(default_factory=list)
    symptom: str | None = None
    explains: float | None = None
    size_share: float | None = None
    harm_share: float | None = None
    harm_share_ci: tuple[float, float] | None = None
    lift: float | None = None
    fix: str = ""
    setting_fix: str = ""
    setting_finding: str = ""

    def __post_init__(self) -> None:
        if self.kind not in CAUSE_KINDS:
            raise ValueError(f"cause kind must be one of {CAUSE_KINDS}, not {self.kind!r}")

    @property
    def size(self) -> int:
        return len(self.example_ids)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["harm_share_ci"] = None if self.harm_share_ci is None else list(self.harm_share_ci)
        return {**data, "n_rows": self.size}


@dataclass
class Verdict:
    """What went wrong (`kind`), in one paragraph with the numbers, and what to do next.

    `causes` are the causes named, first the one the verdict's rule found, then those beside it; `culprit_ids` are
    every row they name, in that order. `evidence` holds the numbers behind the summary (docs/report-schema.md).
    """

    kind: str
    summary: str
    next_action: str
    evidence: dict[str, Any] = field(default_factory=dict)
    culprit_ids: list[str] = field(default_factory=list)
    causes: list[Cause] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"verdict kind must be one of {KINDS}, not {self.kind!r}")

    def to_dict(self) -> dict[str, Any]:
        return {**{k: v for k, v in asdict(self).items() if k != "causes"},
                "causes": [cause.to_dict() for cause in self.causes]}


def cause_by_row(causes: Sequence[dict[str, Any]]) -> dict[str, str]:
    """{row id: the name of the cause that names it}, from the causes as report.json holds them (`verdict.causes`)."""
    return {i: cause["name"] for cause in causes for i in cause.get("example_ids") or []}
