"""Every cause named (rule 8), agreement when the gradients' cluster lies inside the named rows, and check categories
read from the audit registry, so a plug-in check weighs like a built-in one."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gradian import check, unregister_check
from gradian.audit import registry
from gradian.audit.finding import Finding
from gradian.clusters.groups import FindingGroup, finding_groups
from gradian.clusters.summary import summarize_clusters
from gradian.regression.symptoms import SYMPTOMS, Symptoms
from gradian.verdict import Verdict, decide, rules
from gradian.verdict.causes import beyond_size
from gradian.verdict.types import cause_by_row

N = 200
IDS = [f"row{i}" for i in range(N)]
CUT = list(range(0, 30))  # rows 0-29: cut mid-object, in cluster 0 (rows 0-39)
FENCED = list(range(100, 130))  # rows 100-129: wrapped in fences, half in cluster 2 (rows 80-119)
LABELS = np.array([i // 40 for i in range(N)])  # five clusters of 40 rows
NAMES = {0: "seat, window, aisle", 2: "hotel, room, night"}
SIGNIFICANT = dict(capability="json_formatting", base_rate=0.98, finetuned_rate=0.80, delta=-0.18, ci_low=-0.25,
                   ci_high=-0.11, p_value=1e-6, n=200, significant=True)


def ids_of(rows) -> list[str]:
    return [IDS[i] for i in rows]


CUT_FINDING = Finding("cut_in_data", "critical", "30 rows have completions cut in the data itself.",
                      "complete or drop them", example_ids=ids_of(CUT))
FAILS = Finding("fails_capability", "critical", "60 of 200 training completions fail json_formatting.",
                "fix or drop them", example_ids=ids_of(CUT + FENCED), values={"capability": "json_formatting"})


def symptoms_of(counts: dict[str, int]) -> Symptoms:
    n = sum(counts.values())
    full = {s: counts.get(s, 0) for s in SYMPTOMS}
    return Symptoms(n, full, {s: c / n for s, c in full.items()})


def effects(harm: dict[int, float], seed: int = 0, n_queries: int = 16) -> np.ndarray:
    """(Q, N) effects: noise around zero, each row in `harm` pushed down by its value."""
    rng = np.random.default_rng(seed)
    values = rng.normal(0.0, 0.3, size=(n_queries, N))
    for row, push in harm.items():
        values[:, row] -= push + rng.normal(0.0, 0.3, size=n_queries)
    return values


def groups_for(findings: list[Finding], values: np.ndarray, failure: dict[str, float]) -> list[FindingGroup]:
    """Finding groups with their real harm numbers, the fails_capability group split as its targets would split it
    (cut rows stop early, fenced rows are wrapped), and a chosen failure share per group name."""
    groups = finding_groups(IDS, findings, values, seed=0)
    whole = next((g for g in groups if g.check == "fails_capability"), None)
    if whole is not None:
        parts = [Finding("fails_capability", "critical", whole.title, "", example_ids=ids_of(rows))
                 for rows in (CUT, FENCED)]
        for symptom, part in zip(("stops-early", "wrapped"), parts, strict=True):
            (group,) = finding_groups(IDS, [part], values, seed=0)
            groups.append(dataclasses.replace(group, symptom=symptom))
    return [dataclasses.replace(g, failure_share=failure.get(g.name, 0.0)) for g in groups]


def verdict_for(findings, values, symptoms, failure, regression=SIGNIFICANT) -> Verdict:
    clusters = summarize_clusters(IDS, LABELS, values, NAMES, findings, seed=0)
    return decide(regression, findings, clusters, values.mean(axis=0), IDS, symptoms=symptoms,
                  groups=groups_for(findings, values, failure))


TWO_CAUSES = {**dict.fromkeys(CUT, 4.0), **dict.fromkeys(FENCED, 3.0)}
BOTH_SYMPTOMS = symptoms_of({"stops-early": 14, "wrapped": 6})


def test_two_data_causes_are_each_named_with_their_rows_symptom_and_harm():
    verdict = verdict_for([CUT_FINDING, FAILS], effects(TWO_CAUSES), BOTH_SYMPTOMS, {"cut_in_data": 0.6})
    assert verdict.kind == "data-cluster", verdict.summary
    first, second = verdict.causes
    assert first.name == "cut_in_data" and first.example_ids == ids_of(CUT) and first.symptom == "stops-early"
    assert first.explains == pytest.approx(0.7) and first.located_by == "failures"
    assert second.name == "fails_capability:wrapped" and second.example_ids == ids_of(FENCED)
    assert second.symptom == "wrapped" and second.explains == pytest.approx(0.3)
    assert second.lift is not None and second.lift >= 2 and second.harm_share is not None and second.harm_share > 0.2
    assert verdict.culprit_ids == ids_of(CUT) + ids_of(FENCED)
    cause_of = cause_by_row(verdict.to_dict()["causes"])
    assert cause_of[IDS[100]] == "fails_capability:wrapped" and cause_of[IDS[0]] == "cut_in_data"
    assert "Cause 2: 30 more rows with completions wrapped in fences or prose" in verdict.summary
    assert "30.0% of the failing answers are wrapped in fences or prose" in verdict.summary
    assert verdict.next_action.startswith("drop these 60 rows: culprits.jsonl")
    assert verdict.evidence["n_culprits"] == 60
    assert verdict.evidence["latent_rows"] == 0 and "look at the" not in verdict.next_action  # every failing row named


def test_a_single_cause_run_grows_no_second_cause():
    cut_only = effects(dict.fromkeys(CUT, 4.0))
    verdict = verdict_for([CUT_FINDING, FAILS], cut_only, BOTH_SYMPTOMS, {"cut_in_data": 0.6})
    assert [c.name for c in verdict.causes] == ["cut_in_data"] and verdict.culprit_ids == ids_of(CUT)
    assert "Cause 2" not in verdict.summary
    # the fenced rows hold harm, but no failing answer is wrapped: no evidence on the answers' side
    cut_alone = symptoms_of({"stops-early": 20})
    verdict = verdict_for([CUT_FINDING, FAILS], effects(TWO_CAUSES), cut_alone, {"cut_in_data": 0.6})
    assert [c.name for c in verdict.causes] == ["cut_in_data"]
    # ... but the fenced rows fail the capability themselves: the next action points at them after the named rows
    # (on two SmolLM2 runs, removing the cut rows alone let such rows fail the model)
    assert verdict.evidence["latent_rows"] == len(FENCED)
    assert verdict.next_action.endswith(f"then look at the {len(FENCED)} other training rows that teach a failure "
                                        "themselves (findings.json: fails_capability): no failing answer shows them "
                                        "yet, but with these rows gone they can teach the next failure")
    # a share of wrapped answers, but without attribution: no evidence on the gradients' side
    groups = [dataclasses.replace(g, harm_share=None, harm_share_ci=None, lift=None)
              for g in groups_for([CUT_FINDING, FAILS], cut_only, {"cut_in_data": 0.6})]
    verdict = decide(SIGNIFICANT, [CUT_FINDING, FAILS], None, None, IDS, symptoms=BOTH_SYMPTOMS, groups=groups)
    assert [c.name for c in verdict.causes] == ["cut_in_data"] and verdict.evidence["gradients"] == {
        "agreement": "not-run"}


def test_a_group_named_first_is_split_into_its_symptom_causes():
    """No cut_in_data finding: the whole fails_capability group is found where the failures sit, and named as its
    two causes, each with its own rows and symptom share."""
    mixed = symptoms_of({"stops-early": 9, "wrapped": 8, "other": 3})
    verdict = verdict_for([FAILS], effects(TWO_CAUSES), mixed, {"fails_capability": 0.7})
    assert verdict.kind == "data-cluster" and verdict.evidence["group"] == "fails_capability"
    assert [(c.name, c.size) for c in verdict.causes] == [("fails_capability:stops-early", 30),
                                                          ("fails_capability:wrapped", 30)]
    assert [c.explains for c in verdict.causes] == [pytest.approx(0.45), pytest.approx(0.4)]
    assert "These rows hold 2 causes" in verdict.summary


def test_the_top_cluster_inside_the_named_rows_is_agreement():
    """The gradients' top cluster is the fenced category (a subset of the named rows, few of the cut rows)."""
    fenced_first = {**dict.fromkeys(CUT, 1.5), **dict.fromkeys(FENCED, 6.0)}
    verdict = verdict_for([CUT_FINDING, FAILS], effects(fenced_first), BOTH_SYMPTOMS, {"cut_in_data": 0.6})
    gradients = verdict.evidence["gradients"]
    assert gradients["top_cluster"]["name"] == "hotel, room, night" and gradients["top_cluster"]["holds_group_rows"] == 0
    assert gradients["top_cluster"]["inside_named_rows"] == 0.5  # rows 100-119 of its 80-119 are named
    assert gradients["agreement"] == "disagree"  # half inside: not a subset
    fenced_cluster = np.array([2 if i in FENCED else (0 if i < 40 else 1 + i % 2 * 2) for i in range(N)])
    clusters = summarize_clusters(IDS, fenced_cluster, effects(fenced_first), NAMES, [CUT_FINDING, FAILS], seed=0)
    verdict = decide(SIGNIFICANT, [CUT_FINDING, FAILS], clusters, effects(fenced_first).mean(axis=0), IDS,
                     symptoms=BOTH_SYMPTOMS, groups=groups_for([CUT_FINDING, FAILS], effects(fenced_first),
                                                               {"cut_in_data": 0.6}))
    gradients = verdict.evidence["gradients"]
    assert gradients["agreement"] == "agree" and gradients["top_cluster"]["inside_named_rows"] == 1.0
    assert "The gradients agree: cluster \u201chotel, room, night\u201d, which holds" in verdict.summary
    assert "lies inside the named rows" in verdict.summary and "disagree" not in verdict.summary


def test_disagreement_names_the_cluster_with_which():
    elsewhere = dict.fromkeys(range(160, 200), 5.0)  # the harm in cluster 4, no finding there
    verdict = verdict_for([CUT_FINDING], effects(elsewhere), symptoms_of({"stops-early": 20}), {"cut_in_data": 0.6})
    assert verdict.evidence["gradients"]["agreement"] == "disagree"
    assert "the gradients point at cluster \u201ccluster 4\u201d, which holds 97.3% of the harm (4.9x its size), and " \
        "it holds only 0.0% of these rows" in verdict.summary


def test_a_setup_cause_beside_a_data_cause_is_named():
    pad = Finding("pad_eos_masking", "warning", "pad == eos; if the collator masks pad ids every EOS label is hidden",
                  "give the tokenizer a distinct pad token", values={"collator_masks_pad": None})
    some_run_on = symptoms_of({"stops-early": 14, "never-stops": 6})
    verdict = verdict_for([CUT_FINDING, pad], effects(dict.fromkeys(CUT, 4.0)), some_run_on, {"cut_in_data": 0.6})
    assert verdict.kind == "data-cluster" and [c.name for c in verdict.causes] == ["cut_in_data", "pad_eos_masking"]
    setup = verdict.causes[1]
    assert setup.kind == "setup" and setup.example_ids == [] and setup.explains == pytest.approx(0.3)
    assert pad.fix in verdict.next_action and "Cause 2: the run's setup" in verdict.summary
    assert verdict.culprit_ids == ids_of(CUT)
    few_run_on = symptoms_of({"stops-early": 19, "never-stops": 1})
    verdict = verdict_for([CUT_FINDING, pad], effects(dict.fromkeys(CUT, 4.0)), few_run_on, {"cut_in_data": 0.6})
    assert [c.name for c in verdict.causes] == ["cut_in_data"]


def test_a_further_cause_passes_a_weaker_harm_test_than_a_data_cluster():
    """One harm test, two sets of thresholds: the data cluster's CI floor is 1.5x the size share, reached counts; a
    further cause's is the size share, and only above it counts; a further cause needs no lift (binary-exact values)."""
    group = FindingGroup("cut_in_data", "critical", "cut", ids_of(CUT), size_share=0.25, harm_share=0.5,
                         harm_share_ci=(0.375, 0.625), lift=2.0)
    assert rules.group_concentrated(group) and beyond_size(group)
    at_size = dataclasses.replace(group, harm_share_ci=(0.25, 0.625))
    assert not rules.group_concentrated(at_size) and not beyond_size(at_size)
    assert beyond_size(dataclasses.replace(at_size, harm_share_ci=(0.25 + 2 ** -10, 0.625)))
    small = dataclasses.replace(group, harm_share=0.125, lift=None)
    assert not rules.group_concentrated(small) and beyond_size(small)
    assert not beyond_size(dataclasses.replace(small, harm_share=0.0625))
    assert not beyond_size(dataclasses.replace(group, harm_share=None))


DROPPED = list(range(100, 130))  # rows 100-129: leave out a field the eval's answers have
MISSING = Finding("missing_fields", "critical", "30 rows leave out fields.", "add the fields",
                  example_ids=ids_of(DROPPED))
SPLIT = ["stops-early"] * 10 + ["wrong-fields"] * 10  # the symptom of each query's failing answer


def split_effects(dropped_push: float, seed: int = 0) -> np.ndarray:
    """(20, N): the cut rows hurt the first ten queries (stop early) hard, the dropped-field rows the last ten
    (wrong fields) by `dropped_push`: over all twenty they hold less harm than their size."""
    values = np.random.default_rng(seed).normal(0.0, 0.3, size=(20, N))
    values[:10, CUT] -= 4.0
    values[10:, DROPPED] -= dropped_push
    return values


def split_verdict(values: np.ndarray, query_symptoms: list[str] | None) -> Verdict:
    findings = [CUT_FINDING, MISSING]
    groups = [dataclasses.replace(g, failure_share=0.6 if g.check == "cut_in_data" else 0.0)
              for g in finding_groups(IDS, findings, values, seed=0, query_symptoms=query_symptoms)]
    clusters = summarize_clusters(IDS, LABELS, values, NAMES, findings, seed=0)
    return decide(SIGNIFICANT, findings, clusters, values.mean(axis=0), IDS, groups=groups,
                  symptoms=symptoms_of({"stops-early": 10, "wrong-fields": 10}))


def test_a_cause_that_breaks_other_answers_is_named_by_its_harm_on_them():
    """Over all failing answers the dropped-field rows hold less harm than their size (the cut rows' is larger), so
    rule 8's test fails; on the answers with wrong fields they hold most of it, and are named from there."""
    values = split_effects(0.5)
    dropped = next(g for g in finding_groups(IDS, [MISSING], values, seed=0, query_symptoms=SPLIT))
    assert dropped.harm_share < dropped.size_share and not beyond_size(dropped)
    on = dropped.on_symptom
    assert on.symptom == "wrong-fields" and on.queries == 10 and on.harm_share > 0.5 and beyond_size(dropped, on)
    harm = np.maximum(-values[10:].mean(axis=0), 0.0)  # naive reference over the wrong-fields queries
    assert on.harm_share == pytest.approx(harm[DROPPED].sum() / harm.sum(), abs=1e-12)
    verdict = split_verdict(values, SPLIT)
    assert [(c.name, c.located_by, c.size) for c in verdict.causes] == [("cut_in_data", "failures", 30),
                                                                         ("missing_fields", "symptom-harm", 30)]
    second = verdict.causes[1]
    assert second.symptom == "wrong-fields" and second.harm_share == on.harm_share and second.lift == on.lift
    assert "Cause 2: 30 more rows with completions that leave out fields the eval's answers have: 50.0% of the " \
        "failing answers are valid but have missing or renamed fields, and on those answers these rows hold" \
        in verdict.summary
    assert verdict.culprit_ids == ids_of(CUT) + ids_of(DROPPED)


def test_no_cause_is_named_by_its_symptom_without_harm_on_it_or_without_query_symptoms():
    assert [c.name for c in split_verdict(split_effects(0.5), None).causes] == ["cut_in_data"]
    assert [c.name for c in split_verdict(split_effects(0.0), SPLIT).causes] == ["cut_in_data"]


@pytest.fixture
def plugin_check():
    """Register a plug-in check for one test, as a plug-in does (`gradian.check`); unregistered afterwards."""
    registered: set[str] = set()

    def register(name: str, category: str, **options) -> None:
        check(name, category, **options)(lambda ctx: [])
        registered.add(name)

    yield register
    for name in registered:
        unregister_check(name)


def test_a_plugin_check_counts_by_its_category_like_a_built_in(plugin_check):
    plugin_check("collator_drops_eos", "stop")
    plugin_check("warmup_too_short", "hyperparameter")
    plugin_check("half_answers", "per-row", teaches=("stops-early",))
    never = symptoms_of({"never-stops": 18, "stops-early": 2})
    stop = Finding("collator_drops_eos", "warning", "the collator drops EOS labels", "keep EOS labels")
    verdict = verdict_for([stop], effects({}), never, {})
    assert verdict.kind == "setup" and verdict.evidence["finding"]["check"] == "collator_drops_eos"
    assert verdict.causes[0].kind == "setup" and verdict.causes[0].explains == pytest.approx(0.9)
    unknown = Finding("collator_notes", "warning", "a note on the collator", "read it")  # no category: not `stop`
    assert verdict_for([unknown], effects({}), never, {}).kind == "diffuse"
    # a step size (category `hyperparameter`) whose log shows damage outranks a cluster whose rows carry no defect
    cluster_harm = effects(dict.fromkeys(range(160, 200), 5.0))
    warmup = Finding("warmup_too_short", "warning", "warmup of 0 steps at lr 5e-3", "warm up over 50 steps",
                     values={"log_shows": "a loss spike at step 3"})
    verdict = verdict_for([warmup], cluster_harm, symptoms_of({"other": 20}), {})
    assert verdict.kind == "diffuse" and verdict.evidence["outranked_by_step_size"] is True
    assert verdict.evidence["run_wide_causes"] == ["warmup_too_short"] and warmup.fix in verdict.next_action
    assert verdict_for([dataclasses.replace(warmup, check="warmup_notes")], cluster_harm, symptoms_of({"other": 20}),
                       {}).kind == "data-cluster"  # unregistered: a setup note, not a step size
    # a per-row plug-in that teaches stopping early is named like cut_in_data
    half = dataclasses.replace(CUT_FINDING, check="half_answers")
    verdict = verdict_for([half], effects({}), symptoms_of({"stops-early": 20}), {"half_answers": 0.6})
    assert verdict.kind == "data-cluster" and verdict.causes[0].name == "half_answers"
    assert verdict.causes[0].symptom == "stops-early"
    # a second plug-in's rows no cause names are latent as a built-in's are; a duplicate teaches nothing, so not its
    plugin_check("half_answers_elsewhere", "per-row", teaches=("stops-early",))
    elsewhere = dataclasses.replace(half, check="half_answers_elsewhere", example_ids=ids_of([150, 151]))
    twins = Finding("duplicate", "warning", "3 duplicated rows", "drop them", example_ids=ids_of([160, 161, 162]))
    verdict = verdict_for([half, elsewhere, twins], effects({}), symptoms_of({"stops-early": 20}),
                          {"half_answers": 0.6})
    assert verdict.culprit_ids == ids_of(CUT) and verdict.evidence["latent_rows"] == 2
    assert "then look at the 2 other training rows that teach a failure themselves (findings.json: " \
           "half_answers_elsewhere)" in verdict.next_action


def test_a_stop_check_teaches_never_stopping_unless_it_says_otherwise(plugin_check):
    plugin_check("collator_drops_eos", "stop")
    plugin_check("eos_moved", "stop", teaches=("stops-early",))
    assert registry.teaches("collator_drops_eos") == registry.teaches("pad_eos_masking") == ("never-stops",)
    assert registry.teaches("missing_eos") == ("never-stops",) and registry.teaches("eos_moved") == ("stops-early",)
    assert registry.teaches("duplicate") == ()  # a per-row check teaches nothing unless it says so
    never = symptoms_of({"never-stops": 18, "stops-early": 2})
    moved = Finding("eos_moved", "warning", "EOS moved", "put EOS back")
    assert verdict_for([moved], effects({}), never, {}).kind == "diffuse"  # what it teaches is not what they show


def test_a_run_wide_capability_finding_explains_the_answers_its_targets_fail_like():
    """Targets failing the capability in most rows are a setup verdict; the check teaches any symptom, so the cause
    explains every failing answer but those that never stop, and names the symptom they show most."""
    most = dataclasses.replace(FAILS, example_ids=IDS[:120])
    verdict = verdict_for([most], effects({}), symptoms_of({"wrapped": 12, "stops-early": 5, "never-stops": 3}), {})
    assert verdict.kind == "setup" and verdict.evidence["finding"]["check"] == "fails_capability"
    cause = verdict.causes[0]
    assert (cause.located_by, cause.symptom, cause.explains) == ("symptom", "wrapped", pytest.approx(0.85))


def test_a_plugin_category_is_recorded_and_checked(plugin_check):
    plugin_check("slow_decay", "run-wide", cause_from="critical")
    assert registry.category_of(Finding("slow_decay", "warning", "t", "f")) == "run-wide"
    assert registry.cause_from("slow_decay") == "critical"
    with pytest.raises(ValueError, match="cause_from"):
        check("bad_severity", "run-wide", cause_from="loud")
