"""The numbers of verification.json on synthetic scores: recovery against a naive loop, and the status rule."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from benchmarks.studies.recovery_coverage import cell
from gradian.verify.measure import Original, recovery
from gradian.verify.verification import answers_moved, status


def original(base, finetuned) -> Original:
    n = len(base)
    return Original([str(i) for i in range(n)], [[1]] * n, [None] * n, np.asarray(base, dtype=np.float64),
                    np.asarray(finetuned, dtype=np.float64), 8)


def naive_recovery(after, base, finetuned) -> float:
    gained = sum(a - f for a, f in zip(after, finetuned, strict=True))
    lost = sum(b - f for b, f in zip(base, finetuned, strict=True))
    return gained / lost


def test_recovery_equals_the_naive_ratio_and_its_ci_holds_it():
    rng = np.random.default_rng(0)
    base = np.ones(200)
    finetuned = (rng.random(200) > 0.3).astype(float)  # ~30% broken
    after = np.where(finetuned == 0, (rng.random(200) > 0.4).astype(float), 1.0)  # ~60% of them fixed
    result = recovery(after, original(base, finetuned))
    assert result.value == pytest.approx(naive_recovery(after.tolist(), base.tolist(), finetuned.tolist()), abs=1e-12)
    low, high = result.ci
    assert low < result.value < high
    assert 0.3 < low and high < 0.9


def naive_interval(after, base, finetuned, draws=40000, seed=1):
    """The posterior interval by cells: pass/fail triples counted into the 8 (base, fine-tuned, after) cells,
    Dirichlet(count + ½) over the cells, the ratio of gained to lost per draw, one draw at a time."""
    cells = [(b, f, a) for b in (0, 1) for f in (0, 1) for a in (0, 1)]
    counts = [sum(1 for t in zip(base, finetuned, after, strict=True) if t == c) + 0.5 for c in cells]
    rng = np.random.default_rng(seed)
    ratios = []
    for p in rng.dirichlet(counts, size=draws):
        gained = sum(w * (a - f) for w, (b, f, a) in zip(p, cells, strict=True))
        lost = sum(w * (b - f) for w, (b, f, a) in zip(p, cells, strict=True))
        if lost > 0:
            ratios.append(gained / lost)
    return np.quantile(ratios, 0.025), np.quantile(ratios, 0.975)


@pytest.mark.parametrize("fixed, newly_failing", [(8, 0), (0, 0), (5, 2)])
def test_the_interval_is_the_cells_posterior(fixed, newly_failing):
    base = np.r_[np.ones(36), np.zeros(4)]
    finetuned = np.r_[np.zeros(8), np.ones(30), np.zeros(2)]  # 8 broken, 2 the fine-tune fixed, 2 both fail
    after = finetuned.copy()
    after[:fixed] = 1.0
    after[8:8 + newly_failing] = 0.0
    result = recovery(after, original(base, finetuned))
    expected = naive_interval(after.astype(int).tolist(), base.astype(int).tolist(), finetuned.astype(int).tolist())
    assert result.ci == pytest.approx(expected, rel=0.15, abs=0.04)  # Monte Carlo on both sides; a ratio's tail is long


def test_a_retrain_that_fixed_every_broken_answer_is_not_certain_of_it():
    base = np.ones(40)
    finetuned = np.r_[np.zeros(8), np.ones(32)]  # 8 broken answers
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fixed_all = recovery(np.ones(40), original(base, finetuned))
        changed_nothing = recovery(finetuned.copy(), original(base, finetuned))
    assert fixed_all.value == 1.0 and fixed_all.ci[0] < 0.8 < 1.0 < fixed_all.ci[1]  # the bootstrap said 1 to 1
    assert changed_nothing.value == 0.0 and changed_nothing.ci[0] < 0.0 < 0.2 < changed_nothing.ci[1]


def test_the_interval_holds_the_true_recovery_where_the_bootstrap_did_not():
    found = cell(40, 0.25, 1.0, 0.0, 150, np.random.default_rng(2))  # every broken answer fixed, nothing broken
    assert found["coverage posterior"] >= 0.95, found
    assert found["coverage bootstrap"] < 0.6, found
    found = cell(80, 0.1, 0.5, 0.03, 150, np.random.default_rng(3))
    assert found["coverage posterior"] >= 0.93, found


def test_nothing_lost_has_no_recovery():
    assert recovery(np.ones(10), original(np.ones(10), np.ones(10))).value is None


def removal_verification(primary_rate, tests, control_rates=(0.8, 0.8), kind="removal"):
    """A verification dict with what `status` reads: the primary retrain, the controls and the paired tests."""
    primary = {"name": "p", "kind": kind, "rate": primary_rate, "beyond_seed_noise": True}
    controls = [{"name": f"control-{i}", "kind": "control", "rate": r, "beyond_seed_noise": False}
                for i, r in enumerate(control_rates, start=1)]
    return {"verdict": "data-cluster", "base_rate": 1.0, "finetuned_rate": 0.8, "primary": "p", "removed": 10,
            "retrains": [primary, *controls], "tests": tests, "reseeded_regression": {"significant": True}}


def outcome(against, beats, p_holm=0.01):
    return {"against": against, "beats": beats, "p_holm": p_holm, "better": 9, "worse": 1}


@pytest.mark.parametrize(("rate", "tests", "controls", "expected"), [
    (0.95, [outcome("fine-tuned", True), outcome("control-1", True), outcome("control-2", True)], (0.8, 0.8), "confirmed"),
    (0.95, [outcome("fine-tuned", True), outcome("control-1", False, 0.2)], (0.8, 0.8), "inconclusive"),
    (0.80, [outcome("fine-tuned", False, 1.0)], (0.7, 0.7), "not-confirmed"),  # no better than the fine-tune
    (0.85, [outcome("fine-tuned", True), outcome("control-1", False, 0.5)], (0.9, 0.86), "not-confirmed"),  # below random
    (0.95, [outcome("fine-tuned", True)], (), "confirmed"),  # --controls 0: the fine-tune alone
])
def test_status_rule(rate, tests, controls, expected):
    assert status(removal_verification(rate, tests, controls))[0] == expected


def test_a_fix_is_tested_against_the_fine_tune():
    fix = removal_verification(0.95, [outcome("fine-tuned", True)], (), kind="fix")
    state, reason = status(fix)
    assert state == "confirmed" and reason.startswith("the fix answers better than the fine-tune")
    assert status({**fix, "tests": []})[0] == "inconclusive"


def test_no_regression_report_status():
    quiet = {"verdict": "no-regression", "base_rate": 1.0, "finetuned_rate": 1.0, "primary": None,
             "retrains": [{"name": "reseeded", "beyond_seed_noise": False}],
             "reseeded_regression": {"significant": False}}
    assert status(quiet)[0] == "confirmed"
    assert status({**quiet, "reseeded_regression": {"significant": True}})[0] == "not-confirmed"
    moved = {**quiet, "retrains": [{"name": "control-1", "beyond_seed_noise": True}]}
    assert status(moved)[0] == "inconclusive"


def test_answers_moved_counts_each_prompt_as_a_naive_loop_does():
    """Of the answers the fine-tune broke, those the retrain fixes; of those it got right, those that now fail."""
    rng = np.random.default_rng(3)
    base, finetuned, after = ((rng.random(300) > share).astype(float) for share in (0.1, 0.3, 0.3))
    fixed = broken = newly = 0
    for b, f, a in zip(base, finetuned, after, strict=True):
        broken += b == 1 and f == 0
        fixed += b == 1 and f == 0 and a == 1
        newly += f == 1 and a == 0
    assert answers_moved(after, original(base, finetuned)) == {"broken_by_finetune": broken, "fixed": fixed,
                                                               "newly_failing": newly}
    assert 0 < fixed < broken and newly > 0


def test_a_removal_that_fixes_its_failures_but_uncovers_others_says_so():
    """Measured on a SmolLM2 run with two causes: removing the named rows fixed all 11 failing answers and broke 10
    of another category; the net rate is no better than random, and the reason says what moved."""
    moved = {"broken_by_finetune": 11, "fixed": 11, "newly_failing": 10}
    v = {**removal_verification(0.82, [outcome("fine-tuned", False, 1.0)], (0.85, 0.85)), "answers": moved}
    state, reason = status(v)
    assert state == "not-confirmed"
    assert reason.endswith("it fixes 11 of the 11 answers the fine-tune broke, and 10 answers the fine-tune got "
                           "right now fail: another failure the removal uncovered (their outputs: "
                           "verify/p/scores.json)")
    quiet = status({**v, "answers": {**moved, "newly_failing": 0}})[1]
    assert quiet == "removing the 10 rows answers no better than removing as many rows at random"


@pytest.mark.parametrize("verdict", ["data-cluster", "no-regression"])
def test_capped_retrains_never_confirm(verdict):
    confirmed = removal_verification(0.95, [outcome("fine-tuned", True)], ())
    if verdict == "no-regression":  # nothing lost, nothing moved: confirmed when the retrains are the run's
        confirmed = {**confirmed, "verdict": verdict, "reseeded_regression": {"significant": False},
                     "retrains": [{**r, "beyond_seed_noise": False} for r in confirmed["retrains"]]}
    assert status(confirmed)[0] == "confirmed"
    state, reason = status({**confirmed, "capped": True, "max_steps": 1})
    assert state == "inconclusive"
    assert "capped at 1 optimizer step " in reason and "rerun without it" in reason
