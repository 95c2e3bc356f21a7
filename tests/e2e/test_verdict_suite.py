"""The multi-cause verdict on two two-cause families of the scenario suite, built and attributed end to end.

travel-cut-prose (dev) plants two causes: one category's answers cut mid-object and another's wrapped in prose.
Whether the prose rows cause any of the regression is the build's to say, not the plant's: the tiny model seldom
learns the wrapper whole. Seed 1, built here (CPU, this tree's scenario code), loses 11.5 points; 17 of its 23
failing answers stop early and 2 are wrapped (8.7%, under `MIN_CAUSE_EXPLAINS`, 15%). Seed 2 loses 20.0 points
with none wrapped. An earlier build of seed 1 had 3 of 18 wrapped (17%) and its verdict named both causes. This
gate used to assert that; it turned on one answer, and failed on other machines. So the gate now holds the rule to
the build's evidence:
- the cause the answers show (cut, the dominant symptom) is named whole;
- nothing outside the planted rows is named;
- a planted cause whose symptom clears the share and whose rows hold harm beyond their size is named;
- one that does not clear them is not named.

kitchen-cut-drop-spaced (dev) plants answers cut in one category and a field dropped from every answer of
another. The two break different answers (half of the failing answers stop early, half have wrong fields, on seeds
0 and 1), and over all failing answers the cut rows' larger effects leave the dropped-field rows less harm than
their size: the verdict named none of them until a group's harm was also read on the answers that show its symptom
(`clusters.groups.SymptomHarm`). Seed 0 names 68 of 68 cut rows and 69 of 69 dropped-field rows, nothing else.

Naming two causes from synthetic evidence is tested in tests/verdict/test_verdict_causes.py; on SmolLM2, in
BENCHMARKS.md.
"""

from __future__ import annotations

import json

import pytest

from gradian.verdict.thresholds import MIN_CAUSE_EXPLAINS, MIN_CAUSE_HARM_SHARE

pytestmark = pytest.mark.slow
MIN_RECALL = 0.8  # of a cause the answers show
MIN_PRECISION = 0.9  # of all named rows
TEACHES = {"cut": "stops-early", "prose": "wrapped"}  # the symptom each planted cause's rows teach


@pytest.fixture(scope="module")
def two_causes(scenario, attributed):
    folder = scenario("travel-cut-prose", 1)
    out = attributed("travel-cut-prose", 1)
    return json.loads((out / "report.json").read_text()), json.loads((folder / "truth.json").read_text()), out, folder


def shown(report, cause):
    """Whether the answers and the gradients show a planted cause: its rows' symptom sub-group (the capability
    check's rows that teach its symptom) explains MIN_CAUSE_EXPLAINS of the failing answers and holds harm
    significantly beyond its size."""
    symptom = TEACHES[cause["cause"]]
    group = next(g for g in report["groups"] if g["check"] == "fails_capability" and g["symptom"] == symptom)
    assert group["size"] == len(cause["culprit_ids"])  # the sub-group is the planted rows
    share = report["symptoms"]["shares"][symptom]
    return share >= MIN_CAUSE_EXPLAINS and group["harm_share_ci"][0] > group["size_share"] \
        and group["harm_share"] >= MIN_CAUSE_HARM_SHARE


def test_each_cause_the_build_shows_is_named_and_nothing_else(two_causes):
    report, truth, _, _ = two_causes
    verdict = report["verdict"]
    named, planted = set(verdict["culprit_ids"]), set(truth["culprit_ids"])
    assert verdict["kind"] == "data-cluster", verdict["summary"]
    assert report["symptoms"]["dominant"] == TEACHES["cut"]
    assert len(named & planted) >= MIN_PRECISION * len(named), (len(named & planted), len(named))
    for cause in truth["causes"]:
        rows = set(cause["culprit_ids"])
        if cause["cause"] == "cut" or shown(report, cause):
            assert len(rows & named) >= MIN_RECALL * len(rows), (cause["cause"], len(rows & named), len(rows))
        else:
            assert not rows & named, (cause["cause"], len(rows & named), report["symptoms"]["shares"])
    causes = verdict["causes"]
    for cause in causes:
        assert cause["kind"] == "rows" and cause["explains"] and cause["harm_share_ci"] is not None
    assert ("Cause 2:" in verdict["summary"]) == (len(causes) >= 2)


def test_culprits_hold_every_named_row_with_its_cause_and_the_cleaned_data_drops_them(two_causes):
    report, _, out, folder = two_causes
    verdict = report["verdict"]
    culprits = [json.loads(line) for line in (out / "culprits.jsonl").read_text().splitlines()]
    owner = {i: c["name"] for c in verdict["causes"] for i in c["example_ids"]}
    assert sorted(row["id"] for row in culprits) == sorted(verdict["culprit_ids"]) == sorted(owner)
    assert all(row["_gradian"]["cause"] == owner[row["id"]] for row in culprits)
    assert {row["_gradian"]["cause"] for row in culprits} == {c["name"] for c in verdict["causes"]}
    cleaned = [json.loads(line)["id"] for line in (out / "train.cleaned.jsonl").read_text().splitlines()]
    original = [json.loads(line)["id"] for line in (folder / "train.jsonl").read_text().splitlines()]
    assert cleaned == [i for i in original if i not in owner]


@pytest.fixture(scope="module")
def cut_and_drop(scenario, attributed):
    folder = scenario("kitchen-cut-drop-spaced", 0)
    out = attributed("kitchen-cut-drop-spaced", 0)
    return json.loads((out / "report.json").read_text()), json.loads((folder / "truth.json").read_text())


def test_a_dropped_field_beside_cut_rows_is_named_as_its_own_cause(cut_and_drop):
    report, truth = cut_and_drop
    verdict = report["verdict"]
    shares = report["symptoms"]["shares"]
    assert shares["stops-early"] >= MIN_CAUSE_EXPLAINS and shares["wrong-fields"] >= MIN_CAUSE_EXPLAINS, shares
    named, planted = set(verdict["culprit_ids"]), set(truth["culprit_ids"])
    assert verdict["kind"] == "data-cluster", verdict["summary"]
    assert len(named & planted) >= MIN_PRECISION * len(named), (len(named & planted), len(named))
    by_cause = {c["name"]: set(c["example_ids"]) for c in verdict["causes"]}
    for cause, check in (("cut", "cut_in_data"), ("drop-field", "missing_fields")):
        rows = set(next(c for c in truth["causes"] if c["cause"] == cause)["culprit_ids"])
        assert len(rows & by_cause.get(check, set())) >= MIN_RECALL * len(rows), (cause, verdict["summary"])
    assert "Cause 2: " in verdict["summary"] and "missing or renamed fields" in verdict["summary"]
