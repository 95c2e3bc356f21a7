"""Paired statistics: is the fine-tuned model really worse than the base on the same eval prompts?

Both models answer the same prompts, so the evidence is the per-example difference
`finetuned_score - base_score`. The interval is a paired bootstrap (resampling eval examples,
which keeps each pair together); for pass/fail capabilities the p-value is an exact McNemar test
(a binomial test on the discordant pairs), for graded scores a Wilcoxon signed-rank test.
A regression is `significant` only when the whole interval lies below zero and the drop is at
least `min_effect`: everything else is inside the noise band and Gradian refuses to attribute it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from scipy import stats

from gradian.capabilities import passed

N_RESAMPLES = 9999


@dataclass
class RegressionSummary:
    """The `regression` block of report.json; rates and deltas are fractions in [0, 1] (points / 100)."""

    capability: str
    base_rate: float
    finetuned_rate: float
    delta: float = field(metadata={"help": "finetuned_rate - base_rate; negative = the fine-tune is worse"})
    ci_low: float
    ci_high: float
    p_value: float
    n: int
    significant: bool
    binary: bool = True
    confidence: float = 0.95
    min_effect: float = 0.0
    n_base_fail: int = 0
    n_finetuned_fail: int = 0
    n_fixed: int = field(default=0, metadata={"help": "base fails, fine-tuned passes"})
    n_broken: int = field(default=0, metadata={"help": "base passes, fine-tuned fails"})
    base_no_stop_rate: float | None = field(default=None, metadata={"help": "share of base answers cut by the limit"})
    finetuned_no_stop_rate: float | None = None
    test: str = "mcnemar-exact"

    @property
    def verdict(self) -> str:
        """`regression` when significant, else `no-regression` (a refusal is a result)."""
        return "regression" if self.significant else "no-regression"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "verdict": self.verdict}

    def explain(self) -> str:
        """One plain sentence with the numbers and what Gradian does about them."""
        if self.binary:
            rates = f"passes {self.capability} on {_pct(self.finetuned_rate)} vs {_pct(self.base_rate)} for the base"
        else:
            rates = f"scores {self.finetuned_rate:.2f} on {self.capability} vs {self.base_rate:.2f} for the base"
        numbers = (
            f"(Δ {_points(self.delta)} points, {self.confidence:.0%} CI {_points(self.ci_low)} to "
            f"{_points(self.ci_high)}, n={self.n})"
        )
        return f"The fine-tuned model {rates} {numbers}: {self._reason()}."

    def _reason(self) -> str:
        if self.significant:
            return "a significant regression, so Gradian attributes it"
        if self.ci_low > 0:
            return "the fine-tune is better, so there is no regression to attribute"
        if self.ci_high < 0:
            return (f"smaller than the minimum effect of {_points(self.min_effect, sign=False)} points, "
                    "so Gradian does not attribute")
        return "inside the noise band, so Gradian does not attribute"


def _pct(rate: float) -> str:
    return f"{100 * rate:.0f}%"


def _points(value: float, *, sign: bool = True) -> str:
    text = f"{abs(100 * value):.1f}" if 0 < abs(100 * value) < 1 else f"{abs(100 * value):.0f}"
    if text.strip("0.") == "" or not sign:
        return text
    return ("+" if value > 0 else "−") + text


def paired_bootstrap_ci(
    diffs: Sequence[float] | np.ndarray, confidence: float = 0.95, seed: int = 0, n_resamples: int = N_RESAMPLES
) -> tuple[float, float]:
    """BCa bootstrap interval of the mean paired difference (resampling eval examples).

    Constant differences (every pair moved the same way, or none moved) have no spread to resample:
    the interval is that constant. BCa falls back to the percentile interval when it is undefined.
    """
    diffs = np.asarray(diffs, dtype=np.float64)
    if diffs.size == 0:
        raise ValueError("no paired differences")
    if np.all(diffs == diffs[0]):
        return float(diffs[0]), float(diffs[0])
    for method in ("BCa", "percentile"):
        result = stats.bootstrap(
            (diffs,), np.mean, confidence_level=confidence, n_resamples=n_resamples, method=method,
            vectorized=True, rng=np.random.default_rng(seed),
        )
        low, high = result.confidence_interval
        if np.isfinite(low) and np.isfinite(high):
            return float(low), float(high)
    return float(diffs.min()), float(diffs.max())


def mcnemar_exact(base_pass: Sequence[bool], ft_pass: Sequence[bool]) -> float:
    """Two-sided exact McNemar p-value: binomial test of the discordant pairs against 1/2."""
    base = np.asarray(base_pass, dtype=bool)
    tuned = np.asarray(ft_pass, dtype=bool)
    broken = int(np.sum(base & ~tuned))
    fixed = int(np.sum(~base & tuned))
    if broken + fixed == 0:
        return 1.0
    return float(stats.binomtest(broken, broken + fixed, 0.5).pvalue)


def wilcoxon_p(diffs: np.ndarray) -> float:
    """Two-sided Wilcoxon signed-rank p-value for graded scores (1.0 when nothing moved)."""
    if not np.any(diffs != 0):
        return 1.0
    return float(stats.wilcoxon(diffs[diffs != 0]).pvalue)


def compare(
    base_scores: Sequence[float],
    ft_scores: Sequence[float],
    *,
    binary: bool,
    min_effect: float = 0.0,
    seed: int = 0,
    capability: str = "",
    confidence: float = 0.95,
    base_stopped: Sequence[bool] | None = None,
    finetuned_stopped: Sequence[bool] | None = None,
) -> RegressionSummary:
    """Paired comparison of per-example scores; `min_effect` is a fraction (0.05 = 5 points)."""
    base = np.asarray(base_scores, dtype=np.float64)
    tuned = np.asarray(ft_scores, dtype=np.float64)
    if base.shape != tuned.shape or base.ndim != 1 or base.size == 0:
        raise ValueError("base and fine-tuned scores must be two non-empty lists of the same length")
    diffs = tuned - base  # (n,) negative = worse after fine-tuning
    delta = float(diffs.mean())
    ci_low, ci_high = paired_bootstrap_ci(diffs, confidence, seed)
    base_pass, tuned_pass = passed(base), passed(tuned)  # (n,) bool each
    p_value = mcnemar_exact(base_pass, tuned_pass) if binary else wilcoxon_p(diffs)
    return RegressionSummary(
        capability=capability,
        base_rate=float(base.mean()),
        finetuned_rate=float(tuned.mean()),
        delta=delta,
        ci_low=ci_low,
        ci_high=ci_high,
        p_value=p_value,
        n=int(base.size),
        significant=bool(ci_high < 0 and -delta >= min_effect),
        binary=binary,
        confidence=confidence,
        min_effect=min_effect,
        n_base_fail=int(np.sum(~base_pass)),
        n_finetuned_fail=int(np.sum(~tuned_pass)),
        n_fixed=int(np.sum(~base_pass & tuned_pass)),
        n_broken=int(np.sum(base_pass & ~tuned_pass)),
        base_no_stop_rate=_no_stop_rate(base_stopped),
        finetuned_no_stop_rate=_no_stop_rate(finetuned_stopped),
        test="mcnemar-exact" if binary else "wilcoxon",
    )


def _no_stop_rate(stopped: Sequence[bool] | None) -> float | None:
    if stopped is None or len(stopped) == 0:
        return None
    return float(1.0 - np.mean(np.asarray(stopped, dtype=bool)))
