"""The answer-length control (`benchmarks.harness.baselines`): it ranks a world whose cause is the answers' length
perfectly, and a world whose cause leaves the length alone no better than its culprits' share."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.harness.baselines import length_control_scores
from gradian.scenarios.evaluate import auprc

N_ROWS, N_CULPRITS, N_QUERIES = 200, 30, 12


def _world(culprit_shift: int, failing_shift: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    """Token lengths of a world: the base's own answers 20–40 tokens, each clean row within a token of its own answer,
    each culprit `culprit_shift` tokens from it, and the failing answers `failing_shift` from their references."""
    rng = np.random.default_rng(seed)
    own = rng.integers(20, 40, N_ROWS)
    trained = own + rng.integers(-1, 2, N_ROWS)
    positive = np.zeros(N_ROWS, dtype=bool)
    positive[rng.choice(N_ROWS, N_CULPRITS, replace=False)] = True
    trained[positive] = own[positive] + culprit_shift
    intended = rng.integers(20, 40, N_QUERIES)
    return intended + failing_shift, intended, trained, own, positive


def test_a_world_of_cut_answers_is_ranked_perfectly():
    failing, intended, trained, own, positive = _world(culprit_shift=-12, failing_shift=-15)
    assert auprc(length_control_scores(failing, intended, trained, own), positive) == 1.0


def test_a_world_of_longer_answers_is_ranked_perfectly_too():  # the sign of v picks the direction
    failing, intended, trained, own, positive = _world(culprit_shift=8, failing_shift=6)
    assert auprc(length_control_scores(failing, intended, trained, own), positive) == 1.0


def test_a_world_where_the_cause_keeps_the_length_is_ranked_near_chance():
    shares = []
    for seed in range(5):  # a swapped value: the culprits as long as their clean neighbours, the failures too
        rng = np.random.default_rng(100 + seed)
        failing, intended, trained, own, positive = _world(culprit_shift=0, failing_shift=0, seed=seed)
        trained[positive] = own[positive] + rng.integers(-1, 2, N_CULPRITS)
        failing = intended + rng.integers(-1, 2, N_QUERIES)
        shares.append(auprc(length_control_scores(failing, intended, trained, own), positive))
    assert max(shares) < 0.4 and np.mean(shares) == pytest.approx(N_CULPRITS / N_ROWS, abs=0.1)


def test_no_length_direction_scores_every_row_zero():
    assert not length_control_scores([30, 20], [30, 20], [10, 50, 30], [30, 30, 30]).any()
