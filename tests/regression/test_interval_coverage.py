"""The printed CI holds the true difference at its level where answers break one way; the conditional one did not."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.studies.interval_coverage import cell


@pytest.mark.parametrize("n, changed, broken", [(80, 0.15, 1.0), (200, 0.05, 0.95), (40, 0.3, 0.75), (80, 0.3, 0.5)])
def test_the_product_interval_covers_the_true_difference(n, changed, broken):
    found = cell(n, changed, broken, 2000, np.random.default_rng(1))
    assert found["coverage product"] >= 0.95, found
    if broken >= 0.95:  # all but one-way: the interval at the observed share missed the truth half the time
        assert found["coverage conditional"] < 0.8, found
