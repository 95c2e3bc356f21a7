"""Paired statistics: is the fine-tuned model really worse than the base on the same eval prompts?

Both models answer the same prompts, so the evidence is the per-example difference `finetuned_score - base_score`.
One test decides, and the interval printed beside it is built on that test inverted, so "significant" and "the
interval excludes zero" can never disagree:

- pass/fail capabilities: the exact McNemar test, the exact two-sided binomial test of the answers broken against
  the answers fixed (the discordant pairs) at 1/2. Its p is the doubled smaller tail, which at 1/2 (a symmetric
  binomial) is also the usual "outcomes no likelier than the observed one" p, and is exactly the dual of the
  Clopper-Pearson interval of the broken share π = broken / (broken + fixed).
- graded capabilities: the two-sided Wilcoxon signed-rank test of the prompts whose score moved, and the shifts
  θ of those differences that the same test does not reject (a Hodges-Lehmann interval, found by inverting the
  test itself).

The difference is `delta = s × c`: the share s of prompts whose answer changed (the discordant share) times the
change among them, c = 1 - 2π for pass/fail or θ for graded scores. The test speaks about c alone, so its interval
of c taken at s as observed (the interval conditional on how many answers changed) covered the true difference in
only 40-67% of simulated drops where answers break one way (BENCHMARKS.md). The CI is therefore every product of
the test's interval of c with the Clopper-Pearson interval of s (`exact-product`, `signed-rank-product`). s's
interval lies above zero whenever an answer changed, so the product excludes zero exactly when c's does, exactly
when p < 1 - confidence: "significant" and "the interval excludes zero" still never disagree.

A regression is `significant` when p < 1 - confidence, the difference is a drop, and the drop is at least
`min_effect`: everything else is inside the noise band and Gradian refuses to attribute it, saying how large a drop
these prompts could have detected (`detectable_drop`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from scipy import special, stats

from gradian.capabilities import passed

N_RESAMPLES = 9999
EXACT_SIGNED_RANK = 50  # moved prompts up to which the signed-rank p is counted exactly


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
    test: str = field(default="mcnemar-exact", metadata={"help": "the test that decides: mcnemar-exact | wilcoxon"})
    interval: str = field(default="exact-product",
                          metadata={"help": "how the CI is made: the test inverted, times the share of prompts "
                                            "that changed with its own interval (exact-product | "
                                            "signed-rank-product)"})
    detectable_drop: float | None = field(
        default=None, metadata={"help": "smallest drop the test can call significant on these n prompts: the fewest "
                                        "answers broken, none fixed, as a fraction of n; None when no drop can"})

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
        if self.delta >= 0:
            return "the fine-tune is not worse on average, so there is no regression to attribute"
        if self.ci_high < 0:
            return (f"smaller than the minimum effect of {_points(self.min_effect, sign=False)} points, "
                    "so Gradian does not attribute")
        return f"inside the noise band{self._detectable()}, so Gradian does not attribute"

    def _detectable(self) -> str:
        """How large a drop these prompts could detect, for a refusal inside the noise band."""
        if self.detectable_drop is None:
            return "" if self.n == 0 else f" (no drop on {self.n} prompts could be significant)"
        broken = round(self.detectable_drop * self.n)
        moved = "answers broken, none fixed" if self.binary else "prompts falling from 1 to 0, none rising"
        return (f" (these {self.n} prompts detect a drop of {100 * self.detectable_drop:.3g} points or more: "
                f"{broken} {moved})")


def _pct(rate: float) -> str:
    return f"{100 * rate:.0f}%"


def _points(value: float, *, sign: bool = True) -> str:
    text = f"{abs(100 * value):.1f}" if 0 < abs(100 * value) < 1 else f"{abs(100 * value):.0f}"
    if text.strip("0.") == "" or not sign:
        return text
    return ("+" if value > 0 else "−") + text


@dataclass(frozen=True)
class PairedEvidence:
    """What the one test says: its p-value and the interval of `delta` that inverts it (both at `confidence`)."""

    test: str
    interval: str
    p_value: float
    ci_low: float
    ci_high: float


def mcnemar_counts(broken: int, fixed: int, n: int, confidence: float = 0.95) -> PairedEvidence:
    """Exact McNemar from the discordant counts on `n` prompts: the p-value and the CI of delta (module docstring).

    p is the doubled smaller tail of Bin(broken + fixed, 1/2), capped at 1 (not mid-p). The Clopper-Pearson interval
    of π = broken / (broken + fixed) has its ends where each one-sided tail equals (1 - confidence) / 2, so it
    excludes 1/2 exactly when p < 1 - confidence; c = 1 - 2π then excludes 0 exactly then, and so does delta = s × c.
    """
    discordant = broken + fixed
    p_value = min(1.0, 2.0 * float(special.bdtr(min(broken, fixed), discordant, 0.5))) if discordant else 1.0
    low, high = clopper_pearson(broken, discordant, confidence)  # π's ends; (0, 1) with nothing changed
    ci_low, ci_high = by_share(discordant, n, 1 - 2 * high, 1 - 2 * low, confidence)
    return PairedEvidence("mcnemar-exact", "exact-product", p_value, ci_low, ci_high)


def clopper_pearson(k: int, m: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval of a binomial share k / m, from the beta quantiles; (0, 1) when m = 0.
    (scipy's `binomtest(...).proportion_ci(method="exact")` gives the same ends by root-finding, 1.8 ms a call
    against 6 µs: tests/regression took 486 s with it, against 11 s.)"""
    tail = (1.0 - confidence) / 2
    low = float(special.betaincinv(k, m - k + 1, tail)) if k > 0 else 0.0
    high = float(special.betaincinv(k + 1, m - k, 1.0 - tail)) if k < m else 1.0
    return low, high


def by_share(changed: int, n: int, low: float, high: float, confidence: float) -> tuple[float, float]:
    """The CI of delta = s × c: every product of [low, high], c's interval among the `changed` prompts, with the
    Clopper-Pearson interval of s = changed / n."""
    share_low, share_high = clopper_pearson(changed, n, confidence)
    products = [share * end for share in (share_low, share_high) for end in (low, high)]
    return min(products), max(products)


def mcnemar_exact(base_pass: Sequence[bool], ft_pass: Sequence[bool]) -> float:
    """Two-sided exact McNemar p-value of paired pass/fail outcomes (see `mcnemar_counts`)."""
    base = np.asarray(base_pass, dtype=bool)
    tuned = np.asarray(ft_pass, dtype=bool)
    broken, fixed = int(np.sum(base & ~tuned)), int(np.sum(~base & tuned))
    return mcnemar_counts(broken, fixed, max(base.size, 1)).p_value


def wilcoxon_p(diffs: np.ndarray) -> float:
    """Two-sided Wilcoxon signed-rank p-value of the nonzero differences (1.0 when nothing moved).

    Differences are rounded to 12 decimals first, so 0.1 + 0.2 - 0.3 is no move and equal moves tie. Up to
    `EXACT_SIGNED_RANK` moved prompts the p-value is exact (`_exact_signed_rank_p`, ties included), beyond it the
    normal approximation with the tie correction (scipy's).
    """
    moved = _rounded(diffs)
    moved = moved[moved != 0]
    if moved.size == 0:
        return 1.0
    if moved.size <= EXACT_SIGNED_RANK:
        return _exact_signed_rank_p(moved)
    return float(stats.wilcoxon(moved, method="asymptotic").pvalue)


def _exact_signed_rank_p(moved: np.ndarray) -> float:
    """Doubled smaller tail of the signed-rank sum over all 2^m sign flips (midranks for ties), counted exactly.

    Ranks are halves at worst, so twice the rank sum is an integer and the null counts are a subset-sum table.
    """
    doubled = np.rint(2 * stats.rankdata(np.abs(moved))).astype(np.int64)  # (m,)
    observed = int(doubled[moved > 0].sum())
    counts = np.zeros(int(doubled.sum()) + 1)  # counts[s]: sign flips whose doubled positive-rank sum is s
    counts[0] = 1.0
    for rank in doubled:
        counts[rank:] = counts[rank:] + counts[:-rank].copy()
    below, above = counts[: observed + 1].sum(), counts[observed:].sum()  # exact integers below 2^53
    return float(min(1.0, 2 * min(below, above) / counts.sum()))


def signed_rank(diffs: Sequence[float] | np.ndarray, confidence: float = 0.95) -> PairedEvidence:
    """Wilcoxon signed-rank p-value and the CI of delta that inverts the same test.

    The interval is every shift θ of the m moved prompts' differences that `wilcoxon_p` does not reject, its ends
    taken on the grid of Walsh averages (where the statistic changes) and the midpoints between them, bounded by the
    largest shift scores in [0, 1] allow (too few moved prompts can reject no shift at all), then times the share of
    the n prompts that moved (`by_share`).
    Each end is searched for from zero's side: when the test keeps zero the interval holds zero, and when
    it rejects zero the interval stops short of it, whatever the ties do to the p-value between grid points.
    """
    diffs = _rounded(diffs)  # (n,)
    moved = diffs[diffs != 0]  # (m,)
    p_value = wilcoxon_p(moved)
    if moved.size == 0:
        return PairedEvidence("wilcoxon", "signed-rank-product", p_value,  # no move seen: any shift in [-1, 1]
                              *by_share(0, diffs.size, -1.0, 1.0, confidence))
    alpha = 1.0 - confidence
    walsh = np.unique(_rounded((moved[:, None] + moved[None, :])[np.triu_indices(moved.size)] / 2))  # (≤ m(m+1)/2,)
    reach = max(1.0, float(np.abs(moved).max()))  # the largest shift scores in [0, 1] allow
    edges = np.unique(np.concatenate([walsh, [-reach, reach]]))
    grid = np.sort(np.concatenate([edges, (edges[1:] + edges[:-1]) / 2]))

    def kept(theta: float) -> bool:
        return wilcoxon_p(moved - theta) >= alpha

    if p_value >= alpha:  # zero kept: the ends are the outermost kept shifts on either side of it
        low = _last_kept(grid[grid < 0][::-1], kept, 0.0)
        high = _last_kept(grid[grid > 0], kept, 0.0)
    else:  # zero rejected: the kept shifts lie on the Hodges-Lehmann estimate's side of zero, short of it
        centre = float(np.median(walsh))
        sign = -1.0 if centre < 0 or (centre == 0 and moved.mean() < 0) else 1.0
        side = grid[grid * sign > 0]  # never empty: some difference has this sign
        start = float(side[np.argmin(np.abs(side - centre))])
        toward_zero, away = side[(side - start) * sign < 0], side[(side - start) * sign > 0]
        inner = _last_kept(toward_zero[np.argsort(np.abs(toward_zero - start))], kept, start)
        outer = _last_kept(away[np.argsort(np.abs(away - start))], kept, start)
        low, high = sorted((inner, outer))
    return PairedEvidence("wilcoxon", "signed-rank-product", p_value,
                          *by_share(moved.size, diffs.size, low, high, confidence))


def _rounded(values: Sequence[float] | np.ndarray) -> np.ndarray:
    return np.round(np.asarray(values, dtype=np.float64), 12)


def _last_kept(path: np.ndarray, kept: Any, start: float) -> float:
    """The last shift along `path` (moving away from `start`, which stands) that the test keeps, by bisection."""
    lo, hi = -1, path.size  # path[:lo + 1] kept, path[hi:] rejected (assuming the kept set is an interval)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if kept(float(path[mid])):
            lo = mid
        else:
            hi = mid
    return float(path[lo]) if lo >= 0 else start


def detectable_drop(n: int, *, binary: bool, confidence: float = 0.95) -> float | None:
    """Smallest drop the test calls significant on `n` prompts: k answers broken, none fixed, as k / n.

    For graded scores it is k prompts each falling from 1 to 0. None when not even all n prompts broken would do.
    """
    alpha = 1.0 - confidence
    for k in range(1, n + 1):
        p = mcnemar_counts(k, 0, n).p_value if binary else wilcoxon_p(-np.arange(1.0, k + 1))
        if p < alpha:
            return k / n
    return None


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values: the i-th smallest times (m − i), kept monotone, capped at 1, in the input order."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(pvalues[i])))
        adjusted[i] = running
    return adjusted


def paired_evidence(
    before: Sequence[float] | np.ndarray,
    after: Sequence[float] | np.ndarray,
    *,
    binary: bool,
    confidence: float = 0.95,
) -> PairedEvidence:
    """The one test of `after` against `before` (per-prompt scores on the same prompts) and the CI of the mean
    change `after - before` that inverts it: exact McNemar for pass/fail, Wilcoxon signed-rank for graded scores."""
    first, second = np.asarray(before, dtype=np.float64), np.asarray(after, dtype=np.float64)  # (n,) each
    if not binary:
        return signed_rank(second - first, confidence)
    first_pass, second_pass = passed(first), passed(second)  # (n,) bool each
    broken, fixed = int(np.sum(first_pass & ~second_pass)), int(np.sum(~first_pass & second_pass))
    return mcnemar_counts(broken, fixed, max(first.size, 1), confidence)


def significant(evidence: PairedEvidence, delta: float, confidence: float, min_effect: float) -> bool:
    """The gate: the test rejects at 1 - confidence, on the drop side of zero, and the drop is at least `min_effect`.

    The side is the interval's (for pass/fail it is the sign of delta; for graded scores the signed-rank test's
    direction, which a mean can contradict), so a significant drop always has its interval below zero.
    """
    rejected = evidence.p_value < 1.0 - confidence
    return bool(rejected and evidence.ci_high < 0 and delta < 0 and -delta >= min_effect)


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
    """Paired comparison of per-example scores; `min_effect` is a fraction (0.05 = 5 points).

    `seed` is accepted and unused: the test and its interval are exact, so nothing is resampled.
    """
    base = np.asarray(base_scores, dtype=np.float64)
    tuned = np.asarray(ft_scores, dtype=np.float64)
    if base.shape != tuned.shape or base.ndim != 1 or base.size == 0:
        raise ValueError("base and fine-tuned scores must be two non-empty lists of the same length")
    diffs = tuned - base  # (n,) negative = worse after fine-tuning
    delta = float(diffs.mean())
    base_pass, tuned_pass = passed(base), passed(tuned)  # (n,) bool each
    evidence = paired_evidence(base, tuned, binary=binary, confidence=confidence)
    return RegressionSummary(
        capability=capability,
        base_rate=float(base.mean()),
        finetuned_rate=float(tuned.mean()),
        delta=delta,
        ci_low=evidence.ci_low,
        ci_high=evidence.ci_high,
        p_value=evidence.p_value,
        n=int(base.size),
        significant=significant(evidence, delta, confidence, min_effect),
        binary=binary,
        confidence=confidence,
        min_effect=min_effect,
        n_base_fail=int(np.sum(~base_pass)),
        n_finetuned_fail=int(np.sum(~tuned_pass)),
        n_fixed=int(np.sum(~base_pass & tuned_pass)),
        n_broken=int(np.sum(base_pass & ~tuned_pass)),
        base_no_stop_rate=_no_stop_rate(base_stopped),
        finetuned_no_stop_rate=_no_stop_rate(finetuned_stopped),
        test=evidence.test,
        interval=evidence.interval,
        detectable_drop=detectable_drop(int(base.size), binary=binary, confidence=confidence),
    )


def _no_stop_rate(stopped: Sequence[bool] | None) -> float | None:
    if stopped is None or len(stopped) == 0:
        return None
    return float(1.0 - np.mean(np.asarray(stopped, dtype=bool)))


@dataclass
class Change:
    """A capability change on the eval prompts: the mean paired difference and its CI."""

    delta: float
    ci: tuple[float, float]

    def to_dict(self) -> dict[str, Any]:
        return {"delta": self.delta, "ci": list(self.ci)}


def change(after: np.ndarray, before: np.ndarray, *, binary: bool) -> Change:
    """Paired change after − before, with the regression's CI (its test inverted, so it agrees with that test)."""
    diffs = np.asarray(after, dtype=np.float64) - np.asarray(before, dtype=np.float64)  # (n,)
    evidence = paired_evidence(before, after, binary=binary)
    return Change(float(diffs.mean()), (evidence.ci_low, evidence.ci_high))
