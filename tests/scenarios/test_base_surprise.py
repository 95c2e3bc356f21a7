"""The base-surprise study's weighting: Σ_s max(0, h_s) · w_s, w from the base's probability of the next token."""

from __future__ import annotations

import math

import numpy as np

from benchmarks.studies.base_surprise import weighted


def test_each_weighting_against_a_loop():
    h = np.array([0.5, -1.0, 2.0, 3.0])  # (T,) position parts
    p = np.array([np.nan, 0.9, 0.25, 1.0])  # the first position predicts no supervised token
    parts = [(h, p), None]  # a dropped row scores 0
    for weight, of in (("plain", lambda q: 1.0), ("miss", lambda q: 1.0 - q), ("surprisal", lambda q: -math.log(q))):
        for prompt in (0.0, 1.0):
            expected = sum(max(0.0, hs) * (prompt if math.isnan(q) else of(q)) for hs, q in zip(h, p, strict=True))
            assert np.allclose(weighted(parts, weight, prompt), [expected, 0.0], rtol=0, atol=1e-12)
