"""Paired tests between two retrains on the same eval prompts (each prompt answered by both), and Holm's correction.

The test is the regression's own (`gradian.regression.statistics.paired_evidence`): for pass/fail capabilities the
exact McNemar test, a two-sided exact binomial test of the discordant prompts against 1/2; for graded capabilities
the two-sided Wilcoxon signed-rank test of the per-prompt differences. Several comparisons that must all hold (the named rows against each control) are corrected with Holm's
step-down method, which controls the chance of any false "beats" at `ALPHA` without assuming the tests independent.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from gradian.regression.statistics import holm, paired_evidence

ALPHA = 0.05


@dataclass
class PairedTest:
    """`after` against `against` on the same prompts: prompts it does better / worse on, mean difference, p."""

    against: str
    test: str  # "mcnemar-exact" | "wilcoxon"
    better: int
    worse: int
    delta: float
    p: float
    p_holm: float | None = None

    @property
    def beats(self) -> bool:
        p = self.p if self.p_holm is None else self.p_holm
        return self.delta > 0 and p < ALPHA

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"beats": self.beats}


def paired_test(after: np.ndarray, against: np.ndarray, name: str, *, binary: bool) -> PairedTest:
    """Test `after` (n,) against `against` (n,), per-prompt scores of two retrains on the same prompts."""
    after, against = np.asarray(after, dtype=np.float64), np.asarray(against, dtype=np.float64)
    diffs = after - against  # (n,)
    better, worse = int(np.sum(diffs > 0)), int(np.sum(diffs < 0))
    evidence = paired_evidence(against, after, binary=binary)  # the regression's own test, so one p means one thing
    return PairedTest(name, evidence.test, better, worse, float(diffs.mean()), evidence.p_value)


def with_holm(tests: list[PairedTest]) -> list[PairedTest]:
    """The same tests with `p_holm` set over all of them."""
    for test, adjusted in zip(tests, holm([t.p for t in tests]), strict=True):
        test.p_holm = adjusted
    return tests
