"""What every audit check returns."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SEVERITIES = ("critical", "warning", "info")


@dataclass
class Finding:
    """One mechanical problem in the run, with the rows it concerns and the exact fix.

    `example_ids` lists the rows concerned for per-example findings (empty for run-wide ones);
    `values` holds the counts and numbers behind the title.
    """

    check: str
    severity: str
    title: str
    fix: str
    example_ids: list[str] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)
    category: str = ""  # setup | stop | hyperparameter | per-row | run-wide: the registering check's (audit/registry.py)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, not {self.severity!r}")

    @property
    def per_example(self) -> bool:
        return bool(self.example_ids)

    def to_dict(self) -> dict[str, Any]:
        """The one JSON form of a finding: findings.json (diagnose) and report.json (attribute) both write it."""
        return {**asdict(self), "n_examples": len(self.example_ids)}


def by_severity(findings: list[Finding]) -> list[Finding]:
    """Most severe first, then the ones that concern most rows."""
    return sorted(findings, key=lambda f: (SEVERITIES.index(f.severity), -len(f.example_ids), f.check))
