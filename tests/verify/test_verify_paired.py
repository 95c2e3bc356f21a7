"""The paired tests that decide `gradian verify`: exact McNemar and Holm against naive loops, the issue's numbers, and
a verification.json built from synthetic scores validated against its schema."""

from __future__ import annotations

import math
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from gradian.regression.statistics import change, holm
from gradian.verify.measure import Original
from gradian.verify.pages import curve_chart, render_page
from gradian.verify.paired import ALPHA, paired_test, with_holm
from gradian.verify.plan import CurvePoint, Plan, Topic
from gradian.verify.recipe import Recipe
from gradian.verify.retrain import Retrain
from gradian.verify.schema_doc import render_doc
from gradian.verify.verification import summarize, verification_schema


def naive_two_sided_binomial(k: int, n: int) -> float:
    """Σ over outcomes as unlikely as k of C(n, i) / 2^n: the exact two-sided test against 1/2."""
    probability = [math.comb(n, i) / 2 ** n for i in range(n + 1)]
    return min(1.0, sum(p for p in probability if p <= probability[k] * (1 + 1e-9)))


def scores_with(better: int, worse: int, same: int) -> tuple[np.ndarray, np.ndarray]:
    after = np.r_[np.ones(better), np.zeros(worse), np.ones(same)]
    before = np.r_[np.zeros(better), np.ones(worse), np.ones(same)]
    return after, before


@pytest.mark.parametrize(("better", "worse", "expected"), [(11, 0, 0.001), (12, 3, 0.035), (11, 1, 0.006)])
def test_mcnemar_reproduces_the_issues_numbers(better, worse, expected):
    after, before = scores_with(better, worse, 80 - better - worse)
    test = paired_test(after, before, "control", binary=True)
    assert (test.better, test.worse, test.test) == (better, worse, "mcnemar-exact")
    assert test.p == pytest.approx(naive_two_sided_binomial(better, better + worse), rel=1e-9)
    assert round(test.p, 3) == expected
    assert test.beats and test.delta == pytest.approx((better - worse) / 80)


@pytest.mark.parametrize(("better", "worse"), [(5, 0), (6, 0), (12, 3), (4, 4), (0, 9)])
def test_a_retrains_change_ci_agrees_with_its_paired_test(better, worse):
    # the change CI is the regression's interval: the paired test inverted, so it excludes 0 exactly when p < ALPHA
    after, before = scores_with(better, worse, 80 - better - worse)
    test = paired_test(after, before, "fine-tuned", binary=True)
    low, high = change(after, before, binary=True).ci
    assert (test.p < ALPHA) == (low > 0 or high < 0)
    assert low <= test.delta <= high


def test_a_retrain_that_is_worse_never_beats():
    after, before = scores_with(0, 12, 68)
    test = paired_test(after, before, "control", binary=True)
    assert test.p < 0.05 and not test.beats


def test_graded_scores_use_wilcoxon():
    rng = np.random.default_rng(0)
    before = rng.random(60)
    test = paired_test(before + 0.1 + 0.01 * rng.random(60), before, "x", binary=False)
    assert test.test == "wilcoxon" and test.beats and test.better == 60


def naive_holm(pvalues: list[float]) -> list[float]:
    m = len(pvalues)
    out = []
    for p in pvalues:
        # adjusted p_i = max over j with p_j <= p_i (in sorted order) of (m - rank_j) p_j
        ranked = sorted(pvalues)
        rank = ranked.index(p)
        out.append(min(1.0, max((m - j) * ranked[j] for j in range(rank + 1))))
    return out


@pytest.mark.parametrize("pvalues", [[0.001, 0.035, 0.006], [0.04, 0.01, 0.03, 0.2], [0.5], [0.3, 0.3, 0.001]])
def test_holm_equals_the_naive_step_down(pvalues):
    assert holm(pvalues) == pytest.approx(naive_holm(pvalues))


def test_the_issues_run_is_confirmed_after_holm():
    """The tiny run of the issue: the removal against two controls and the reseeded run, all three must hold."""
    tests = []
    for better, worse in ((11, 0), (12, 3), (11, 1)):
        after, before = scores_with(better, worse, 80 - better - worse)
        tests.append(paired_test(after, before, "c", binary=True))
    assert all(t.beats for t in with_holm(tests))
    assert max(t.p_holm for t in tests) == pytest.approx(0.035, abs=5e-4)


def synthetic(curve: bool, removal: np.ndarray | None = None, dropped_controls: tuple[np.ndarray, ...] = ()) -> dict:
    """summarize() on made-up per-prompt scores: 40 prompts, 10 broken by the fine-tune; `removal` the named rows'
    zero-weight scores (default: every prompt right), `dropped_controls` random drops' scores."""
    n = 40
    base, finetuned = np.ones(n), np.r_[np.zeros(10), np.ones(30)]
    original = Original([str(i) for i in range(n)], [[1]] * n, [None] * n, base, finetuned, 8)
    rng = np.random.default_rng(1)
    names = {"without-culprits": "removal", "without-culprits-dropped": "dropped", "control-1": "control",
             "control-2": "control", "same-category": "topic", "reseeded": "reseeded"}
    scores = {"without-culprits": np.ones(n) if removal is None else removal,
              "without-culprits-dropped": np.r_[np.zeros(2), np.ones(n - 2)]}
    for k, dropped in enumerate(dropped_controls, start=1):
        names[f"control-{k}-dropped"], scores[f"control-{k}-dropped"] = "dropped-control", dropped
    for name in ("control-1", "control-2", "same-category", "reseeded"):
        scores[name] = np.where(finetuned == 0, (rng.random(n) < 0.2).astype(float), 1.0)
    points = None
    if curve:
        points = [CurvePoint(0.05, 5, "top-5pct", ["top-5pct-random-1"]),
                  CurvePoint(0.1, 10, "top-10pct", ["top-10pct-random-1"])]
        for point in points:
            names[point.top], names[point.randoms[0]] = "curve", "curve-control"
            scores[point.top] = np.r_[(rng.random(10) < 0.7).astype(float), np.ones(30)]
            scores[point.randoms[0]] = finetuned.copy()
    jobs = [(kind, Retrain(name, [], 0)) for name, kind in names.items()]
    markers = {name: {"rows": 90, "zero_weight": 0 if kind in ("reseeded", "dropped", "dropped-control") else 10,
                      "seed": 0,
                      "global_step": 30, "wall_s": 1.0} for name, kind in names.items()}
    plan = Plan(jobs, "without-culprits", 10, topic=Topic("category", "invoice", 14, "same-category", None),
                curve=points, ranking="rank_score" if curve else None)
    report = {"verdict": {"kind": "data-cluster"}, "regression": {"capability": "json_formatting", "binary": True}}
    recipe = Recipe(training={}, lora={}, seed=0)
    return summarize(plan, original, scores, markers, recipe, report, seed=0, device="cpu", max_steps=None,
                     original_train_s=None)


@pytest.mark.parametrize("curve", [False, True])
def test_verification_json_validates_against_its_schema(curve):
    verification = synthetic(curve)
    jsonschema.validate(verification, verification_schema())
    assert verification["status"] == "confirmed", verification["status_reason"]
    assert [t["against"] for t in verification["tests"]] == ["fine-tuned", "control-1", "control-2"]
    assert verification["dropped"]["recovery"] == pytest.approx(0.8)
    assert verification["topic"]["test"]["against"] == "same-category"
    assert (verification["curve"] is not None) == curve
    broken = {**verification, "tests": [{"against": "x"}]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, verification_schema())


def test_the_named_rows_dropped_from_the_file_are_tested_against_random_drops():
    """A removal that fixes its failures and uncovers others is not confirmed (the zero-weight retrain); dropping the
    rows from the file is tested against random drops of as many rows, and the status reason says how that went."""
    uncovering = np.r_[np.ones(10), np.zeros(12), np.ones(18)]  # fixes the 10 broken answers, breaks 12 right ones
    unmoved = np.r_[np.zeros(10), np.ones(30)]  # a random drop: the fine-tune's answers
    hint = synthetic(False, uncovering)
    assert hint["status"] == "not-confirmed" and hint["dropped"]["beats_random"] is None
    assert hint["status_reason"].endswith("rerun with --dropped-controls 3 to test dropping them from the training "
                                          "file against random drops")
    tested = synthetic(False, uncovering, (unmoved, unmoved.copy(), unmoved.copy()))
    jsonschema.validate(tested, verification_schema())
    dropped = tested["dropped"]
    assert dropped["controls"] == ["control-1-dropped", "control-2-dropped", "control-3-dropped"]
    assert [t["against"] for t in dropped["tests"]] == ["fine-tuned", *dropped["controls"]]
    assert dropped["random_recovery"] == 0.0 and dropped["beats_random"] is True  # 8 better, 0 worse: p = 0.008
    assert tested["status"] == "not-confirmed"  # reported, not gated on
    assert "dropping them from the training file instead answers better than the fine-tune and each of the 3 random " \
           "drops of as many rows (recovery 80.0% against 0.0%" in tested["status_reason"]
    assert [t["against"] for t in tested["tests"]] == ["fine-tuned", "control-1", "control-2"]  # unchanged
    assert "3 random drops of as many rows" in render_page(tested, "verification.md.j2")
    level = synthetic(False, uncovering, (np.r_[np.zeros(2), np.ones(38)],))  # a random drop as good as the named
    assert level["dropped"]["beats_random"] is False
    assert "instead does not answer better than the fine-tune and each of the 1 random drops" in level["status_reason"]


def test_the_pages_draw_the_curve_with_every_number_from_the_json():
    verification = synthetic(True)
    chart = curve_chart(verification)
    assert [t["label"] for t in chart["ticks"]] == ["5% (5)", "10% (10)", "named (10)"]
    assert len(chart["marks"]) == 6  # top k and random at each k, and the named rows beside their controls
    html = render_page(verification, "verification.html.j2")
    assert 'id="recovery-curve"' in html and "http" not in html.replace("http-equiv", "")
    for point in verification["curve"]["points"]:
        assert f"{100 * point['recovery']:.1f}%" in html
    markdown = render_page(verification, "verification.md.j2")
    assert "#### Recovery curve" in markdown and "What you will see when you retrain" in markdown
    assert curve_chart(synthetic(False)) is None


def test_the_schema_doc_is_generated_from_the_schema():
    doc = (Path(__file__).parents[2] / "docs" / "verification-schema.md").read_text(encoding="utf-8")
    assert doc == render_doc(verification_schema()), \
        "regenerate: python -m gradian.verify.schema_doc > docs/verification-schema.md"


def load_lds():
    from benchmarks.harness import lds

    return lds


def naive_spearman(x, y) -> float:
    """Pearson correlation of the ranks (no ties in the test data)."""
    rx, ry = np.argsort(np.argsort(x)).astype(float), np.argsort(np.argsort(y)).astype(float)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    return float((rx * ry).sum() / np.sqrt((rx ** 2).sum() * (ry ** 2).sum()))


def test_lds_is_the_mean_per_query_spearman_with_a_ci_that_holds_it():
    lds = load_lds()
    rng = np.random.default_rng(0)
    predicted = rng.normal(size=40)  # (M,) one prediction per subset, shared by the queries
    measured = np.stack([predicted * w + rng.normal(size=40) for w in (2.0, 1.0, 0.0)], axis=1)  # (M, 3)
    measured[:, 2] = 7.0  # a query no subset moves: no ρ, left out
    result = lds.lds(predicted, measured)
    expected = np.mean([naive_spearman(predicted, measured[:, q]) for q in (0, 1)])
    assert result["lds"] == pytest.approx(expected, abs=1e-12) and result["queries"] == 2
    assert result["ci"][0] < result["lds"] < result["ci"][1]
    assert lds.lds(-predicted, measured)["lds"] == pytest.approx(-expected, abs=1e-12)


def test_per_query_rho_is_scipys_spearman_column_by_column():
    """Ties (as the bootstrap's resampled subsets have), a prediction per query, constant columns: the same numbers as
    a loop of `scipy.stats.spearmanr`, to the last bit."""
    from scipy import stats

    lds = load_lds()
    rng = np.random.default_rng(1)
    measured = rng.integers(0, 4, size=(30, 5)).astype(float)  # (M, Q) with ties
    measured[:, 3] = 2.0  # constant: no ρ
    predicted = rng.integers(0, 3, size=(30, 5)).astype(float)  # (M, Q)
    predicted[:, 1] = 1.0  # constant prediction for query 1: no ρ
    expected = [stats.spearmanr(predicted[:, q], measured[:, q]).statistic if q not in (1, 3) else np.nan
                for q in range(5)]
    assert np.array_equal(lds.per_query_rho(predicted, measured), expected, equal_nan=True)
    shared = predicted[:, 0]  # (M,) one prediction for all queries
    expected = [stats.spearmanr(shared, measured[:, q]).statistic if q != 3 else np.nan for q in range(5)]
    assert np.array_equal(lds.per_query_rho(shared, measured), expected, equal_nan=True)
