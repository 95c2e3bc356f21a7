"""The numbers of verification.json on synthetic scores: recovery against a naive loop, and the status rule."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from gradian.verify.measure import Original, recovery
from gradian.verify.verification import status


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


def test_a_degenerate_bootstrap_falls_back_to_percentiles_without_warning_the_user():
    base = np.ones(40)
    finetuned = np.r_[np.zeros(8), np.ones(32)]  # 8 broken answers
    with warnings.catch_warnings():  # a retrain that changed nothing: every resample's ratio is 0, BCa's is 0 / 0
        warnings.simplefilter("error")
        result = recovery(finetuned.copy(), original(base, finetuned))
    assert result.value == 0.0 and result.ci == (0.0, 0.0)


def test_nothing_lost_has_no_recovery():
    assert recovery(np.ones(10), original(np.ones(10), np.ones(10))).value is None


def verification(recovery_ci, random_ci=(-0.1, 0.1), random_mean=0.0, seed_recovery=0.0, kind="removal"):
    primary = {"name": "p", "kind": kind, "recovery_ci": list(recovery_ci), "beyond_seed_noise": True}
    return {"verdict": "data-cluster", "base_rate": 1.0, "finetuned_rate": 0.8, "primary": "p", "removed": 10,
            "retrains": [primary], "random_recovery_ci": list(random_ci) if random_ci else None,
            "random_recovery": random_mean if random_ci else None, "seed_recovery": seed_recovery,
            "reseeded_regression": {"significant": True}}


@pytest.mark.parametrize(("recovery_ci", "kwargs", "expected"), [
    ((0.8, 1.0), {}, "confirmed"),
    ((0.05, 0.9), {}, "inconclusive"),  # overlaps the controls' CI
    ((-0.2, -0.01), {}, "not-confirmed"),  # no better than the controls' mean
    ((0.8, 1.0), {"seed_recovery": 0.9}, "inconclusive"),  # seed noise alone moves it as far
    ((0.5, 0.8), {"seed_recovery": -0.85}, "not-confirmed"),  # |seed noise| above its upper end
    ((0.8, 1.0), {"random_ci": None, "kind": "fix"}, "confirmed"),
])
def test_status_rule(recovery_ci, kwargs, expected):
    assert status(verification(recovery_ci, **kwargs))[0] == expected


def test_no_regression_report_status():
    quiet = {"verdict": "no-regression", "base_rate": 1.0, "finetuned_rate": 1.0, "primary": None,
             "retrains": [{"name": "reseeded", "beyond_seed_noise": False}],
             "reseeded_regression": {"significant": False}}
    assert status(quiet)[0] == "confirmed"
    assert status({**quiet, "reseeded_regression": {"significant": True}})[0] == "not-confirmed"
    moved = {**quiet, "retrains": [{"name": "control-1", "beyond_seed_noise": True}]}
    assert status(moved)[0] == "inconclusive"
