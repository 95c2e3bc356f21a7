"""Paired statistics against known answers: McNemar and the signed-rank test by hand, and the one gate and its
interval never disagreeing."""

from __future__ import annotations

from math import comb

import numpy as np
import pytest

from gradian.regression.statistics import (
    RegressionSummary,
    clopper_pearson,
    compare,
    detectable_drop,
    mcnemar_counts,
    mcnemar_exact,
    signed_rank,
)


def _pairs(table: dict[tuple[int, int], int]) -> tuple[list[bool], list[bool]]:
    base, tuned = [], []
    for (b, t), count in table.items():
        base += [bool(b)] * count
        tuned += [bool(t)] * count
    return base, tuned


def test_mcnemar_matches_a_hand_computed_table():
    # 8 pairs broken (base passes, fine-tuned fails), 2 fixed, 30 + 5 concordant, which do not count.
    base, tuned = _pairs({(1, 0): 8, (0, 1): 2, (1, 1): 30, (0, 0): 5})
    expected = 2 * sum(comb(10, k) for k in range(0, 3)) / 2**10  # two-sided: 2 * P(X <= 2), X ~ Bin(10, 1/2)
    assert expected == pytest.approx(0.109375)
    assert mcnemar_exact(base, tuned) == pytest.approx(expected, rel=1e-12)
    assert mcnemar_exact(tuned, base) == pytest.approx(expected, rel=1e-12)


def test_mcnemar_without_discordant_pairs_or_balanced_is_one():
    assert mcnemar_exact(*_pairs({(1, 1): 10, (0, 0): 3})) == 1.0
    assert mcnemar_exact(*_pairs({(1, 0): 4, (0, 1): 4})) == pytest.approx(1.0)


def test_compare_flags_a_clear_drop_and_reports_naive_counts():
    base, tuned = _pairs({(1, 1): 60, (1, 0): 35, (0, 1): 2, (0, 0): 3})
    summary = compare(np.array(base, dtype=float), np.array(tuned, dtype=float), binary=True, capability="x")
    b, t = np.array(base, dtype=np.float64), np.array(tuned, dtype=np.float64)
    assert summary.delta == pytest.approx(t.mean() - b.mean())
    assert (summary.base_rate, summary.finetuned_rate, summary.n) == (pytest.approx(b.mean()), pytest.approx(t.mean()), 100)
    assert summary.ci_low <= summary.delta <= summary.ci_high < 0
    assert summary.significant and summary.verdict == "regression"
    assert (summary.n_broken, summary.n_fixed, summary.n_base_fail, summary.n_finetuned_fail) == (35, 2, 5, 38)
    assert summary.p_value == pytest.approx(mcnemar_exact(base, tuned))
    assert set(summary.to_dict()) >= {"capability", "base_rate", "finetuned_rate", "delta", "ci_low", "ci_high",
                                      "p_value", "n", "significant"}


def test_compare_refuses_inside_the_noise_band():
    base, tuned = _pairs({(1, 1): 100, (1, 0): 4, (0, 1): 2, (0, 0): 14})
    summary = compare(base, tuned, binary=True, capability="json_formatting")
    assert summary.ci_low < 0 < summary.ci_high
    assert not summary.significant and summary.verdict == "no-regression"
    assert ("inside the noise band (these 120 prompts detect a drop of 5 points or more: 6 answers broken, none "
            "fixed), so Gradian does not attribute") in summary.explain()


def test_min_effect_turns_a_small_but_certain_drop_into_a_refusal():
    base, tuned = _pairs({(1, 1): 380, (1, 0): 20, (0, 0): 0})
    assert compare(base, tuned, binary=True).significant
    summary = compare(base, tuned, binary=True, min_effect=0.10, capability="c")
    assert summary.ci_high < 0 and not summary.significant
    assert "minimum effect of 10 points" in summary.explain()


def test_an_improvement_is_not_a_regression():
    base, tuned = _pairs({(0, 1): 30, (1, 1): 50})
    summary = compare(base, tuned, binary=True, capability="c")
    assert summary.ci_low > 0 and not summary.significant
    assert "better" in summary.explain()


def test_graded_scores_use_wilcoxon_and_no_stop_rates_are_reported():
    rng = np.random.default_rng(0)
    base = rng.uniform(0.5, 1.0, size=60)
    tuned = np.clip(base - rng.uniform(0.1, 0.3, size=60), 0, 1)
    stopped = [True] * 45 + [False] * 15
    summary = compare(base, tuned, binary=False, capability="plug:in", base_stopped=[True] * 60,
                      finetuned_stopped=stopped)
    assert summary.test == "wilcoxon" and summary.p_value < 1e-6 and summary.significant
    assert summary.finetuned_no_stop_rate == pytest.approx(0.25) and summary.base_no_stop_rate == 0.0
    assert "scores" in summary.explain()


def test_explain_reads_as_one_sentence_with_the_numbers():
    summary = RegressionSummary("json_formatting", base_rate=0.93, finetuned_rate=0.91, delta=-0.02, ci_low=-0.06,
                                ci_high=0.02, p_value=0.5, n=120, significant=False, detectable_drop=0.05)
    assert summary.explain() == (
        "The fine-tuned model passes json_formatting on 91% vs 93% for the base (Δ −2 points, 95% CI −6 to +2, "
        "n=120): inside the noise band (these 120 prompts detect a drop of 5 points or more: 6 answers broken, "
        "none fixed), so Gradian does not attribute."
    )


def test_compare_rejects_unpaired_input():
    with pytest.raises(ValueError):
        compare([1.0, 0.0], [1.0], binary=True)


def _binary_run(broken: int, fixed: int, unchanged: int = 0) -> tuple[np.ndarray, np.ndarray]:
    base, tuned = _pairs({(1, 0): broken, (0, 1): fixed, (1, 1): unchanged})
    return np.array(base, dtype=float), np.array(tuned, dtype=float)


def test_five_answers_broken_none_fixed_on_80_prompts_is_refused_with_the_noise_band():
    # base 100%, fine-tuned 93.75%: exact McNemar gives 2 × 0.5⁵ = 0.0625, not below 0.05, so the CI holds zero
    summary = compare(*_binary_run(5, 0, unchanged=75), binary=True, capability="json_formatting")
    assert summary.p_value == pytest.approx(0.0625, rel=1e-12)
    assert summary.ci_low < 0 < summary.ci_high
    assert not summary.significant and summary.verdict == "no-regression"
    assert summary.detectable_drop == pytest.approx(6 / 80)
    assert (summary.test, summary.interval) == ("mcnemar-exact", "exact-product")
    assert summary.explain() == (
        "The fine-tuned model passes json_formatting on 94% vs 100% for the base (Δ −6 points, 95% CI −14 to +0.6, "
        "n=80): inside the noise band (these 80 prompts detect a drop of 7.5 points or more: 6 answers broken, "
        "none fixed), so Gradian does not attribute."
    )
    assert {"test", "interval", "detectable_drop"} <= set(summary.to_dict())


def test_six_answers_broken_none_fixed_on_80_prompts_is_a_regression():
    summary = compare(*_binary_run(6, 0, unchanged=74), binary=True)
    assert summary.p_value == pytest.approx(0.03125, rel=1e-12)
    assert summary.ci_low <= summary.delta <= summary.ci_high < 0
    share_low = _clopper_pearson_by_hand(6, 80)[0]  # π's lower end solves π⁶ = 0.025; the share's lower end holds 6
    assert summary.ci_high == pytest.approx(share_low * (1 - 2 * 0.025 ** (1 / 6)), rel=1e-9)
    assert summary.significant and summary.verdict == "regression"


@pytest.mark.parametrize("confidence, most", [(0.95, 200), (0.90, 60), (0.99, 60)])
def test_significant_is_the_interval_excluding_zero_for_every_small_table(confidence, most):
    alpha = 1 - confidence
    for discordant in range(most + 1):
        for broken in range(discordant + 1):
            fixed = discordant - broken
            summary = compare(*_binary_run(broken, fixed, unchanged=3), binary=True, confidence=confidence)
            excludes_zero = summary.ci_high < 0 or summary.ci_low > 0
            assert (summary.p_value < alpha) == excludes_zero, (broken, fixed, summary)
            assert summary.significant == (summary.ci_high < 0), (broken, fixed, summary)
            assert summary.ci_low <= summary.delta <= summary.ci_high, (broken, fixed, summary)


@pytest.mark.parametrize("broken, fixed", [(5, 0), (6, 0), (8, 2), (0, 7), (17, 9), (40, 41), (120, 80), (1, 199)])
def test_the_exact_p_value_matches_a_float64_binomial_sum_by_hand(broken, fixed):
    discordant = broken + fixed
    tail = sum(comb(discordant, k) for k in range(min(broken, fixed) + 1)) / 2**discordant  # P(X <= min), Bin(m, 1/2)
    expected = min(1.0, 2 * tail)
    assert mcnemar_counts(broken, fixed, discordant + 10).p_value == pytest.approx(expected, rel=1e-10, abs=1e-300)


def _clopper_pearson_by_hand(k: int, m: int, tail: float = 0.025) -> tuple[float, float]:
    """Bisection on float64 binomial sums: the lower end solves P(X ≥ k | p) = tail, the upper P(X ≤ k | p) = tail."""
    def below(p: float, top: int) -> float:  # P(X ≤ top), X ~ Bin(m, p); falls as p grows
        return sum(comb(m, j) * p**j * (1 - p) ** (m - j) for j in range(top + 1))

    def solve(falling, target: float) -> float:
        lo, hi = 0.0, 1.0
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if falling(mid) > target else (lo, mid)
        return (lo + hi) / 2

    low = 0.0 if k == 0 else solve(lambda p: below(p, k - 1), 1 - tail)  # P(X ≥ k) = tail
    high = 1.0 if k == m else solve(lambda p: below(p, k), tail)
    return low, high


def test_the_interval_is_every_product_of_the_change_and_the_changed_share_in_float64():
    """delta = s × (1 − 2π): π the broken share of the changed answers, s the changed share of the prompts, each with
    its Clopper-Pearson interval (the ends where a one-sided binomial tail is 0.025), solved here by bisection."""
    for broken, fixed, n in ((6, 0, 80), (8, 2, 120), (17, 9, 200), (0, 7, 80), (40, 41, 200)):
        (p_low, p_high), (s_low, s_high) = _clopper_pearson_by_hand(broken, broken + fixed), _clopper_pearson_by_hand(broken + fixed, n)
        products = [s * (1 - 2 * p) for s in (s_low, s_high) for p in (p_low, p_high)]
        evidence = mcnemar_counts(broken, fixed, n)
        assert evidence.ci_low == pytest.approx(min(products), rel=1e-9, abs=1e-12), (broken, fixed)
        assert evidence.ci_high == pytest.approx(max(products), rel=1e-9, abs=1e-12), (broken, fixed)
    nothing = mcnemar_counts(0, 0, 80)  # nothing changed: the change may be anything, the share small
    assert nothing.p_value == 1.0 and nothing.ci_low == pytest.approx(-_clopper_pearson_by_hand(0, 80)[1]) and nothing.ci_high == \
        pytest.approx(_clopper_pearson_by_hand(0, 80)[1])


def test_the_detectable_drop_is_the_fewest_broken_answers_the_test_passes():
    assert detectable_drop(80, binary=True) == pytest.approx(6 / 80)  # 2 × 0.5⁶ < 0.05 <= 2 × 0.5⁵
    assert detectable_drop(80, binary=True, confidence=0.99) == pytest.approx(8 / 80)  # 2 × 0.5⁸ < 0.01
    assert detectable_drop(5, binary=True) is None
    assert detectable_drop(80, binary=False) == pytest.approx(6 / 80)
    summary = compare([1.0] * 5, [0.0] * 5, binary=True, capability="c")
    assert not summary.significant and summary.detectable_drop is None
    assert "no drop on 5 prompts could be significant" in summary.explain()


def test_graded_gate_and_its_interval_never_disagree():
    rng = np.random.default_rng(7)
    for case in range(60):
        n = int(rng.integers(4, 90))
        base = rng.uniform(0, 1, n)
        moved = rng.random(n) < rng.uniform(0.1, 1.0)
        tuned = np.clip(base + moved * rng.normal(rng.uniform(-0.15, 0.1), 0.2, n), 0, 1)
        if case % 2:  # coarse scores: ties, and differences that are zero only up to rounding
            base, tuned = np.round(base, 1), np.round(tuned, 1)
        summary = compare(base, tuned, binary=False)
        assert (summary.test, summary.interval) == ("wilcoxon", "signed-rank-product")
        assert (summary.p_value < 0.05) == (summary.ci_high < 0 or summary.ci_low > 0), (case, summary)
        assert summary.significant == (summary.ci_high < 0 and summary.delta < 0), (case, summary)


def test_graded_interval_of_six_equal_drops_is_that_drop_and_significant():
    diffs = np.r_[np.zeros(74), np.full(6, -0.5)]
    evidence = signed_rank(diffs)
    assert evidence.p_value == pytest.approx(0.03125)  # exact signed-rank: all 6 ranks negative, 2 / 2⁶
    share_low, share_high = clopper_pearson(6, 80)
    assert evidence.ci_low == pytest.approx(-0.5 * share_high) and evidence.ci_high == pytest.approx(-0.5 * share_low)
    assert share_low < 6 / 80 < share_high
    assert compare(np.ones(80), 1 + diffs, binary=False).significant


def test_the_exact_signed_rank_p_matches_every_sign_flip_counted_by_hand():
    from itertools import product

    from scipy.stats import rankdata

    moved = np.array([-0.5, -0.5, -0.2, 0.1, -0.3, -0.2, 0.5, -0.4])  # ties: midranks
    ranks = rankdata(np.abs(moved))
    observed = ranks[moved > 0].sum()
    sums = [sum(r for r, s in zip(ranks, signs, strict=True) if s) for signs in product((0, 1), repeat=moved.size)]
    below = sum(t <= observed + 1e-9 for t in sums) / len(sums)
    above = sum(t >= observed - 1e-9 for t in sums) / len(sums)
    assert signed_rank(moved).p_value == pytest.approx(min(1.0, 2 * min(below, above)), rel=1e-12)


def test_a_graded_refusal_states_the_drop_the_prompts_could_detect():
    tuned = np.r_[np.ones(77), np.full(3, 0.5)]
    summary = compare(np.ones(80), tuned, binary=False, capability="plug:in")
    assert summary.p_value == pytest.approx(0.25)  # 2 / 2³: three moved prompts can reject no shift at all,
    share_high = clopper_pearson(3, 80)[1]  # so ±1 point × the moved share's upper end
    assert (summary.ci_low, summary.ci_high) == (pytest.approx(-share_high), pytest.approx(share_high))
    assert not summary.significant
    assert ("inside the noise band (these 80 prompts detect a drop of 7.5 points or more: 6 prompts falling from 1 "
            "to 0, none rising)") in summary.explain()
