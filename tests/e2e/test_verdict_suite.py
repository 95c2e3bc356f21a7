"""The multi-cause verdict on a two-cause family of the scenario suite: each planted cause named, nothing else.

travel-cut-prose (dev) plants two causes: one category's answers cut mid-object and another's wrapped in prose.
Seed 1 is the run where the verdict named the cut rows and none of the prose rows (recall 0.48, BENCHMARKS.md); on
this build (CPU, the scenario code of this tree) it loses 9.0 points, 10 of its 18 failing answers stop early and
3 are wrapped. Seed 0 of the same family lost 0.5 points when built here (not significant: the verdict refuses), so
it gates nothing. The rule was chosen on this family; kitchen-cut-fence-spaced (test) is reported, not gated.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow
MIN_RECALL = 0.8  # of each planted cause
MIN_PRECISION = 0.9  # of all named rows


@pytest.fixture(scope="module")
def two_causes(scenario, attributed):
    folder = scenario("travel-cut-prose", 1)
    out = attributed("travel-cut-prose", 1)
    return json.loads((out / "report.json").read_text()), json.loads((folder / "truth.json").read_text()), out, folder


def test_each_planted_cause_is_named(two_causes):
    report, truth, _, _ = two_causes
    verdict = report["verdict"]
    named, planted = set(verdict["culprit_ids"]), set(truth["culprit_ids"])
    assert verdict["kind"] == "data-cluster", verdict["summary"]
    for cause in truth["causes"]:
        rows = set(cause["culprit_ids"])
        assert len(rows & named) >= MIN_RECALL * len(rows), (cause["cause"], len(rows & named), len(rows))
    assert len(named & planted) >= MIN_PRECISION * len(named), (len(named & planted), len(named))
    causes = verdict["causes"]
    assert len([c for c in causes if c["kind"] == "rows"]) >= 2, [c["name"] for c in causes]
    for cause in causes:
        assert cause["explains"] is not None and cause["explains"] > 0 and cause["harm_share_ci"] is not None
    assert "Cause 2:" in verdict["summary"]


def test_culprits_hold_every_named_row_with_its_cause_and_the_cleaned_data_drops_them(two_causes):
    report, _, out, folder = two_causes
    verdict = report["verdict"]
    culprits = [json.loads(line) for line in (out / "culprits.jsonl").read_text().splitlines()]
    owner = {i: c["name"] for c in verdict["causes"] for i in c["example_ids"]}
    assert sorted(row["id"] for row in culprits) == sorted(verdict["culprit_ids"]) == sorted(owner)
    assert all(row["_gradian"]["cause"] == owner[row["id"]] for row in culprits)
    assert len({row["_gradian"]["cause"] for row in culprits}) >= 2
    cleaned = [json.loads(line)["id"] for line in (out / "train.cleaned.jsonl").read_text().splitlines()]
    original = [json.loads(line)["id"] for line in (folder / "train.jsonl").read_text().splitlines()]
    assert cleaned == [i for i in original if i not in owner]
