"""Rule 5 without a mechanism on two suite builds, attributed end to end: the rows standing out in a gradient
cluster that no audit check marks are named only when they hold half the harm and write what the failing answers
write where they leave the answer they should give (`verdict.rules.outlier_test`).

- tickets-swap-intent (test) plants `account_access` for `invoice_copy` in the EUR invoice rows. No check marks
  them, and the failing answers write the swap, so the planted rows write each failing answer's departure and the
  verdict names them (BENCHMARKS.md: on the builds there, every named row writes it, 15% of the other rows).
- kitchen-null-bpe (dev) is clean data. On seed 27 here its diet cluster (117 rows) stood out whole and held 79% of
  the harm, and the verdict named all 117 until the departure test; removing them fixed 7 answers and broke 27.
  Whatever a build on another machine regresses, no clean row may be named.

The verdict-stability gate (its expectations from the scenarios' ground truth): `test_verdict_scenarios.py`.
"""

from __future__ import annotations

import json

import pytest

from gradian.verdict.thresholds import MIN_FLAG_GAP, MIN_OUTLIER_HARM

pytestmark = pytest.mark.slow


def _report(scenario, attributed, family: str, seed: int):
    out = attributed(family, seed)
    truth = json.loads((scenario(family, seed) / "truth.json").read_text())
    return json.loads((out / "report.json").read_text()), truth


def test_rows_that_write_the_swapped_label_are_named(scenario, attributed):
    report, truth = _report(scenario, attributed, "tickets-swap-intent", 0)
    verdict = report["verdict"]
    assert report["regression"]["significant"], report["regression"]  # 9.5 points lost on every build so far
    assert verdict["kind"] == "data-cluster", verdict["summary"]
    named, planted = set(verdict["culprit_ids"]), set(truth["culprit_ids"])
    assert len(named & planted) >= 0.9 * len(named) and len(named & planted) >= 0.5 * len(planted)
    departures = set(report["symptoms"]["departures"].values())
    assert any("account_access" in d for d in departures), departures
    if verdict["evidence"].get("culprit_rule") == "effect":
        written = verdict["evidence"]["outliers"]["departures_written"]
        assert written["inside"] - written["outside"] >= MIN_FLAG_GAP and "account_access" in written["example"]
        assert "write what the failing answers write" in verdict["summary"]


def test_a_clean_fine_tune_whose_topic_drifts_names_no_rows(scenario, attributed):
    report, _ = _report(scenario, attributed, "kitchen-null-bpe", 27)
    verdict = report["verdict"]
    assert verdict["kind"] in ("no-regression", "diffuse") and not verdict["culprit_ids"], verdict["summary"]
    outliers = verdict["evidence"].get("outliers")
    if outliers is not None and outliers["harm_share"] >= MIN_OUTLIER_HARM:  # as on this session's build
        written = outliers["departures_written"]
        assert written is not None and written["inside"] - written["outside"] < MIN_FLAG_GAP
        assert "no audit finding marks them" in verdict["summary"]
