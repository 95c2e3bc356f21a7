"""Each verdict fires on the input built for it and on no other; culprits are the planted rows."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gradian.audit.finding import Finding
from gradian.audit.registry import check, unregister_check
from gradian.capabilities import get_capability
from gradian.clusters.groups import finding_groups
from gradian.clusters.summary import summarize_clusters
from gradian.regression.generation import GeneratedAnswer
from gradian.regression.measure import RegressionRow
from gradian.regression.symptoms import SYMPTOMS, Symptoms, classify_failures
from gradian.verdict import MIN_LIFT, Verdict, decide, rules
from gradian.verdict.thresholds import CULPRIT_ROBUST_Z, DECISIVE_HARM, MAD_TO_SIGMA, MIN_OUTLIER_HARM

N, CATEGORY, CULPRITS = 100, range(0, 30), range(0, 20)  # rows 0-29: the category; 0-19: its planted culprits
IDS = [f"row{i}" for i in range(N)]
LABELS = np.array([0 if i in CATEGORY else 1 + i % 3 for i in range(N)])

SIGNIFICANT = dict(capability="json_formatting", base_rate=0.95, finetuned_rate=0.55, delta=-0.40, ci_low=-0.5,
                   ci_high=-0.3, p_value=1e-6, n=80, significant=True)
NOISE = dict(SIGNIFICANT, finetuned_rate=0.93, delta=-0.02, ci_low=-0.08, ci_high=0.04, p_value=0.6,
             significant=False)
TRUNCATED = Finding("truncated_completion", "critical", "20 completions are truncated by max_length=64.",
                    "raise max_length to \u2265 412 tokens, the p99 of rendered rows",
                    example_ids=[IDS[i] for i in CULPRITS] + ["row50"], values={"p99": 412})
PAD_EOS = Finding("pad_eos_masking", "critical", "pad_token == eos_token and the collator masks pad ids.",
                  "set a pad token distinct from eos")
LEARNING_RATE = Finding("learning_rate", "warning", "learning_rate 3e-3 is high for LoRA.",
                        "lower learning_rate to 2e-4")


def planted_effects(seed: int = 0, culprit_effect: float = -5.0, n_queries: int = 16) -> np.ndarray:
    """(Q, N) effects: culprits strongly negative, everyone else noise around zero."""
    rng = np.random.default_rng(seed)
    effects = rng.normal(0.0, 0.3, size=(n_queries, N))
    effects[:, list(CULPRITS)] += culprit_effect + rng.normal(0.0, 0.5, size=(n_queries, len(CULPRITS)))
    return effects


def verdict_for(regression, findings, effects) -> Verdict:
    clusters = summarize_clusters(IDS, LABELS, effects, {0: "invoice, currency, amount"}, findings, seed=0)
    return decide(regression, findings, clusters, effects.mean(axis=0), IDS)


def test_not_significant_refuses_even_with_planted_cluster_and_critical_finding():
    verdict = verdict_for(NOISE, [TRUNCATED, PAD_EOS], planted_effects())
    assert verdict.kind == "no-regression"
    assert verdict.culprit_ids == []
    assert "noise band" in verdict.summary and "-2.0%" in verdict.summary and "p = 0.6" in verdict.summary


def test_a_refusal_says_how_large_a_drop_the_prompts_could_detect():
    verdict = verdict_for(dict(NOISE, detectable_drop=6 / 80), [], planted_effects())
    assert verdict.kind == "no-regression"
    assert "inside the noise band (these 80 eval prompts detect a drop of 7.5% or more), so Gradian" in verdict.summary
    tiny = verdict_for(dict(NOISE, n=5, detectable_drop=None), [], planted_effects())
    assert "(no drop on 5 eval prompts could be significant)" in tiny.summary


def test_significant_improvement_is_not_a_regression():
    better = dict(SIGNIFICANT, finetuned_rate=0.99, delta=0.04, ci_low=0.01, ci_high=0.07)
    assert verdict_for(better, [], planted_effects()).kind == "no-regression"


def test_critical_run_wide_finding_gives_setup():
    verdict = verdict_for(SIGNIFICANT, [TRUNCATED, LEARNING_RATE, PAD_EOS], planted_effects())
    assert verdict.kind == "setup"
    assert verdict.next_action == PAD_EOS.fix
    assert verdict.evidence["finding"]["check"] == "pad_eos_masking"
    assert verdict.culprit_ids == []


def test_stop_finding_does_not_explain_a_model_that_stops():
    stops = dict(SIGNIFICANT, finetuned_no_stop_rate=0.0, base_no_stop_rate=0.02)
    assert verdict_for(stops, [TRUNCATED, PAD_EOS], planted_effects()).kind == "data-cluster"
    runs_on = dict(SIGNIFICANT, finetuned_no_stop_rate=0.6, base_no_stop_rate=0.02)
    assert verdict_for(runs_on, [TRUNCATED, PAD_EOS], planted_effects()).kind == "setup"


def test_critical_finding_on_most_rows_counts_as_setup_but_not_on_a_cluster():
    everywhere = Finding("missing_eos", "critical", "No EOS.", "append eos", example_ids=IDS[:90])
    assert verdict_for(SIGNIFICANT, [everywhere], planted_effects()).kind == "setup"
    assert verdict_for(SIGNIFICANT, [TRUNCATED], planted_effects()).kind == "data-cluster"  # 21 rows of 100


def test_data_cluster_with_mechanism_names_flagged_rows_of_the_cluster():
    verdict = verdict_for(SIGNIFICANT, [TRUNCATED, LEARNING_RATE], planted_effects())
    assert verdict.kind == "data-cluster"
    assert verdict.culprit_ids == [IDS[i] for i in CULPRITS]  # row50 is flagged but outside the cluster
    assert verdict.evidence["mechanism"] == {"check": "truncated_completion", "inside": 20 / 30, "outside": 1 / 70}
    assert verdict.next_action.startswith("drop these 20 rows: culprits.jsonl")
    assert TRUNCATED.fix in verdict.next_action
    assert "invoice, currency, amount" in verdict.summary and "66.7% of this cluster" in verdict.summary


def test_data_cluster_without_flags_narrows_by_effect_outliers():
    epochs = Finding("many_epochs", "warning", "8 epochs over 100 rows.", "train 2-3 epochs")
    verdict = verdict_for(SIGNIFICANT, [epochs], planted_effects(seed=1))
    assert verdict.kind == "data-cluster"
    assert verdict.evidence["culprit_rule"] == "effect"
    assert set(verdict.culprit_ids) == {IDS[i] for i in CULPRITS}  # the 10 clean neighbours stay
    assert verdict.evidence["effect_threshold"] < 0


def drift_effects() -> tuple[np.ndarray, np.ndarray]:
    """(Q, N) effects of a clean fine-tune that drifted in one topic, and its labels: the topic's 10 rows are
    harmful by degrees (−0.4 to −1.8), every other row a little harmful or helpful, with no row set apart."""
    rng = np.random.default_rng(0)
    labels = np.array([0 if i < 10 else 1 + i % 3 for i in range(N)])
    row_mean = np.r_[np.linspace(-0.4, -1.8, 10), rng.normal(-0.2, 0.3, N - 10)]  # (N,)
    return row_mean + rng.normal(0.0, 0.2, size=(16, N)), labels


def test_a_concentrated_cluster_whose_outlying_rows_hold_under_half_the_harm_names_no_rows():
    effects, labels = drift_effects()
    clusters = summarize_clusters(IDS, labels, effects, {0: "diet, halal, check"}, [], seed=0)
    assert rules.concentrated(clusters[0]) and clusters[0].id == 0  # the topic passes the data-cluster test ...
    mean = effects.mean(axis=0)
    position = {i: k for k, i in enumerate(IDS)}
    outside = np.array([mean[k] for k in range(N) if labels[k] != 0], dtype=np.float64)
    median = np.median(outside)
    cut = min(median - CULPRIT_ROBUST_Z * MAD_TO_SIGMA * np.median(np.abs(outside - median)), 0.0)
    standing_out = [i for i in IDS if labels[position[i]] == 0 and mean[position[i]] < cut]
    harm = [max(-float(m), 0.0) for m in mean]
    share = sum(harm[position[i]] for i in standing_out) / sum(harm)  # the naive reference, float64
    assert 0 < len(standing_out) < 10 and share < MIN_OUTLIER_HARM  # ... but its outlying rows hold under half
    verdict = decide(SIGNIFICANT, [], clusters, mean, IDS)
    assert verdict.kind == "diffuse" and verdict.culprit_ids == []
    assert verdict.evidence["outliers"]["rows"] == len(standing_out)
    assert verdict.evidence["outliers"]["harm_share"] == pytest.approx(share, rel=1e-12)
    assert f"the {len(standing_out)} rows that stand out in it hold only" in verdict.summary
    assert "drifts in one topic" in verdict.summary and "No cause was found" in verdict.summary
    # the planted culprits of the same size hold most of the harm: named, as before
    planted = planted_effects(seed=1)
    assert rules.outliers(summarize_clusters(IDS, LABELS, planted, {}, [], seed=0)[0], planted.mean(0), IDS)[1] \
        >= MIN_OUTLIER_HARM


SWAPPED = '{"intent": "account_access", "amount": "12.00"}'  # what the failing answers write
ASKED = '{"intent": "invoice_copy", "amount": "12.00"}'  # their references


def swapped_answers(n: int = 12) -> Symptoms:
    """Symptoms of `n` failing answers that write `account_access` where their references have `invoice_copy`."""
    rows = [RegressionRow(f"e{i}", "prompt", [1], ASKED, GeneratedAnswer([1], ASKED, True),
                          GeneratedAnswer([2], SWAPPED, True), 1.0, 0.0) for i in range(n)]
    return classify_failures(rows, get_capability("json_formatting"))


@pytest.mark.parametrize("culprits_write", [SWAPPED, ASKED])
def test_outlying_rows_are_named_only_when_they_write_what_the_failing_answers_write(culprits_write):
    """Rule 5 without a mechanism: the rows standing out in the cluster hold most of the harm either way; they are
    named when they write the failing answers' departure (`account_access` after `"intent": "`) more often than the
    other rows by MIN_FLAG_GAP, else the verdict is `diffuse` (a clean topic's drift teaches nothing its rows write)."""
    epochs = Finding("many_epochs", "warning", "8 epochs over 100 rows.", "train 2-3 epochs")
    effects = planted_effects(seed=1)
    others = [SWAPPED if i % 10 == 3 else ASKED for i in range(N)]  # rows 3, 13, ...: clean rows that write it too
    texts = [("prompt", culprits_write if i in CULPRITS else others[i]) for i in range(N)]
    symptoms = swapped_answers()
    departure = next(iter(symptoms.departures.values()))
    assert (departure.before, departure.written) == (('intent', '"', ':', '"'), ('account_access', '"'))
    clusters = summarize_clusters(IDS, LABELS, effects, {0: "invoice, currency, amount"}, [epochs], seed=0)
    verdict = decide(SIGNIFICANT, [epochs], clusters, effects.mean(axis=0), IDS, symptoms=symptoms, texts=texts)
    standing_out = set(rules.culprits_by_effect(clusters[0], effects.mean(axis=0), IDS)[0])
    assert standing_out == {IDS[i] for i in CULPRITS}
    naive_inside = np.mean([SWAPPED in texts[i][1] for i in CULPRITS])  # the naive reference: whole strings
    naive_outside = np.mean([SWAPPED in texts[i][1] for i in range(N) if i not in CULPRITS])
    written = verdict.evidence["outliers"]["departures_written"]
    assert written["inside"] == naive_inside and written["outside"] == pytest.approx(naive_outside, rel=1e-12)
    assert written["example"] == 'intent " : " [account_access "]'
    if culprits_write == SWAPPED:  # 100% against 10%
        assert verdict.kind == "data-cluster" and set(verdict.culprit_ids) == standing_out
        assert "100.0% of them write what the failing answers write where they leave the answer they should give " \
               '(`intent " : " [account_access "]`), against 10.0% of the other rows.' in verdict.summary
    else:  # 0% against 10%: the same harm, nothing taught
        assert verdict.kind == "diffuse" and verdict.culprit_ids == []
        assert verdict.evidence["outliers"]["harm_share"] >= MIN_OUTLIER_HARM
        assert "hold 9" in verdict.summary and "of it, but no audit finding marks them and only 0.0% of them write " \
               "what the failing answers write" \
               in verdict.summary and "drifts in one topic" in verdict.summary
    # without texts the test cannot be read, and the harm decides alone, as before
    assert decide(SIGNIFICANT, [epochs], clusters, effects.mean(axis=0), IDS, symptoms=symptoms).kind == "data-cluster"


def test_spread_harm_gives_diffuse_citing_hyperparameter_findings():
    rng = np.random.default_rng(4)
    effects = rng.normal(-0.2, 0.5, size=(16, N))
    verdict = verdict_for(SIGNIFICANT, [TRUNCATED, LEARNING_RATE], effects)
    assert verdict.kind == "diffuse"
    assert verdict.next_action == f"look at hyperparameters: {LEARNING_RATE.fix} (evidence: learning_rate)"
    assert verdict.culprit_ids == []
    assert verdict.evidence["top_cluster"]["lift"] < MIN_LIFT


def test_critical_hyperparameter_finding_is_diffuse_not_setup():
    epochs = Finding("many_epochs", "critical", "12 epochs over 100 rows.", "train 2-3 epochs")
    rng = np.random.default_rng(5)
    spread = rng.normal(-0.2, 0.5, size=(16, N))
    note = Finding("double_bos", "info", "a run-wide note without a fix", "")
    verdict = verdict_for(SIGNIFICANT, [note, epochs, LEARNING_RATE], spread)
    assert verdict.kind == "diffuse"
    assert verdict.next_action == f"look at hyperparameters: {epochs.fix}; {LEARNING_RATE.fix} " \
        "(evidence: many_epochs, learning_rate)"
    assert verdict_for(SIGNIFICANT, [epochs], planted_effects()).kind == "data-cluster"


def test_lift_below_threshold_is_diffuse_even_with_most_harm():
    clusters = summarize_clusters(IDS, LABELS, planted_effects(), {}, [], seed=0)
    top = dataclasses.replace(clusters[0], lift=MIN_LIFT - 0.01)
    assert decide(SIGNIFICANT, [], [top] + clusters[1:], planted_effects().mean(0), IDS).kind == "diffuse"
    assert decide(SIGNIFICANT, [], clusters, planted_effects().mean(0), IDS).kind == "data-cluster"
    assert decide(SIGNIFICANT, [], [], None, IDS).kind == "diffuse"


def test_unknown_kind_is_rejected():
    with pytest.raises(ValueError):
        Verdict(kind="maybe", summary="", next_action="")


def test_a_step_size_whose_log_shows_damage_outranks_a_cluster_with_no_data_defect():
    damaged = dataclasses.replace(LEARNING_RATE, values={"log_shows": "loss spikes at steps 40, 41"})
    verdict = verdict_for(SIGNIFICANT, [damaged], planted_effects(seed=1))
    assert verdict.kind == "diffuse"
    assert verdict.culprit_ids == []
    assert verdict.evidence["outranked_by_step_size"] is True
    assert verdict.evidence["top_cluster"]["lift"] >= MIN_LIFT
    assert "The harm shows most in \u201cinvoice, currency, amount\u201d" in verdict.summary
    assert verdict.next_action == f"look at hyperparameters: {LEARNING_RATE.fix} (evidence: learning_rate)"
    info = dataclasses.replace(damaged, severity="info")  # a note, not a flag
    assert verdict_for(SIGNIFICANT, [info], planted_effects(seed=1)).kind == "data-cluster"
    critical = dataclasses.replace(LEARNING_RATE, severity="critical")  # far above the range: no log needed
    assert verdict_for(SIGNIFICANT, [critical], planted_effects(seed=1)).kind == "diffuse"
    flagged = verdict_for(SIGNIFICANT, [TRUNCATED, damaged], planted_effects())  # a mechanism: the rows
    assert flagged.kind == "data-cluster" and flagged.evidence["mechanism"]["check"] == "truncated_completion"


def test_duplicated_rows_in_the_cluster_do_not_answer_a_damaging_step_size():
    """A repeated row is a clean row counted again: the collapse a step size far too high causes goes to it as to any
    other pattern, so the cluster's duplicates leave the verdict `diffuse` (on one processor the tiny `diffuse`
    scenario's top cluster held 36% duplicated rows against 1.7% elsewhere, and was named)."""
    damaged = dataclasses.replace(LEARNING_RATE, values={"log_shows": "loss spikes at steps 40, 41"})
    duplicates = Finding("duplicate", "warning", "20 rows are duplicated.", "drop the duplicates",
                         example_ids=[IDS[i] for i in CULPRITS])
    assert verdict_for(SIGNIFICANT, [duplicates, damaged], planted_effects(seed=1)).kind == "diffuse"
    assert verdict_for(SIGNIFICANT, [duplicates], planted_effects(seed=1)).kind == "data-cluster"  # no step size


@pytest.mark.parametrize("repeated", [True, False])
def test_a_plugin_check_that_declares_its_rows_repeats_counts_as_duplicates_do(repeated):
    """Whether a check's rows only repeat other rows is declared at registration (`repeats=`), never read from a list
    of names: a plug-in's repetition check leaves a damaging step size's verdict `diffuse` as `duplicate` does, and a
    plug-in check that finds a defect is the cluster's mechanism."""
    damaged = dataclasses.replace(LEARNING_RATE, values={"log_shows": "loss spikes at steps 40, 41"})
    check("same_prompt_twice", "per-row", repeats=repeated)(lambda ctx: [])
    try:
        found = Finding("same_prompt_twice", "warning", "20 rows repeat.", "drop them",
                        example_ids=[IDS[i] for i in CULPRITS])
        kind = verdict_for(SIGNIFICANT, [found, damaged], planted_effects(seed=1)).kind
    finally:
        unregister_check("same_prompt_twice")
    assert kind == ("diffuse" if repeated else "data-cluster")


@pytest.mark.parametrize("name, declared", [("duplicate", {}), ("train_eval_overlap", {}),
                                             ("asks_eval_prompt", {"measures": True}),
                                             ("repeats_a_prompt", {"repeats": True}),
                                             ("swapped_label", {})])
def test_rows_with_nothing_wrong_in_them_never_name_the_clusters_mechanism(name, declared):
    """A cluster flagged by a check whose rows are clean rows counted again (`repeats`) or rows that ask eval prompts
    (`measures`) is named by its rows' effects, whole: a SmolLM2 swap family's rows come from 4 prompt templates, so
    its 30 planted rows were named as the 21 that ask an eval prompt (the next action offered to remove eval rows),
    then as the 18 that repeat one. A check that finds a defect is the mechanism and names its flagged rows."""
    if declared or name == "swapped_label":
        check(name, "per-row", **declared)(lambda ctx: [])
    flagged = [IDS[i] for i in CULPRITS][:14]  # the flag covers 14 of the 20 planted rows
    try:
        found = Finding(name, "warning", "14 rows.", "drop them", example_ids=flagged)
        verdict = verdict_for(SIGNIFICANT, [found], planted_effects(seed=1))
    finally:
        if declared or name == "swapped_label":
            unregister_check(name)
    assert verdict.kind == "data-cluster"
    if name == "swapped_label":
        assert verdict.evidence["mechanism"]["check"] == name and verdict.culprit_ids == flagged
    else:
        assert verdict.evidence["mechanism"] is None and verdict.evidence["culprit_rule"] == "effect"
        assert set(verdict.culprit_ids) == {IDS[i] for i in CULPRITS}
        assert "eval is held out" not in verdict.next_action


# --- the rules that join symptoms, finding groups and gradients (rules 3, 4, 6 and 7 of the module docstring) ---

PAD_UNKNOWN = Finding("pad_eos_masking", "warning", "pad == eos ('</s>'); if the collator masks pad ids every EOS "
                      "label is hidden", "give the tokenizer a distinct pad token", values={"collator_masks_pad": None})
CUT = Finding("cut_in_data", "critical", "20 rows have completions cut in the data itself.",
              "complete or drop rows row0 ...", example_ids=[IDS[i] for i in CULPRITS])
EPOCHS_CRITICAL = Finding("many_epochs", "critical", "10 epochs over 100 rows.", "train 1-3 epochs")
EPOCHS = dataclasses.replace(EPOCHS_CRITICAL, severity="warning")
ELSEWHERE = range(50, 70)  # rows of clusters 1-3, away from the planted category


def spread_effects(seed: int = 4) -> np.ndarray:
    return np.random.default_rng(seed).normal(-0.2, 0.5, size=(16, N))


def symptoms_of(counts: dict[str, int]) -> Symptoms:
    n = sum(counts.values())
    full = {s: counts.get(s, 0) for s in SYMPTOMS}
    return Symptoms(n, full, {s: c / n for s, c in full.items()})


def groups_for(findings: list[Finding], effects: np.ndarray | None, failure: dict[str, float]) -> list:
    """Finding groups with their real harm numbers and a chosen failure share per check."""
    return [dataclasses.replace(g, failure_share=failure.get(g.check, 0.0))
            for g in finding_groups(IDS, findings, effects, seed=0)]


def joined(regression, findings, effects, symptoms, failure) -> Verdict:
    clusters = summarize_clusters(IDS, LABELS, effects, {0: "invoice, currency, amount"}, findings, seed=0)
    return decide(regression, findings, clusters, effects.mean(axis=0), IDS, symptoms=symptoms,
                  groups=groups_for(findings, effects, failure))


STOPS_EARLY = {"stops-early": 18, "other": 2}
NEVER_STOPS = {"never-stops": 18, "stops-early": 2}


def test_never_stops_with_pad_eos_and_the_collator_unknown_is_setup():
    verdict = joined(SIGNIFICANT, [PAD_UNKNOWN, EPOCHS], spread_effects(), symptoms_of(NEVER_STOPS), {})
    assert verdict.kind == "setup" and verdict.next_action == PAD_UNKNOWN.fix
    assert verdict.evidence["finding"]["check"] == "pad_eos_masking"
    assert verdict.evidence["symptom"] == {"dominant": "never-stops", "share": 0.9, "n_failing": 20}
    assert "90.0% of the 20 failing answers never stop" in verdict.summary
    # the warning alone, or with answers that do stop, or with a base that runs on as often, is no setup fault
    assert joined(SIGNIFICANT, [PAD_UNKNOWN], spread_effects(), None, {}).kind == "diffuse"
    assert joined(SIGNIFICANT, [PAD_UNKNOWN], spread_effects(), symptoms_of(STOPS_EARLY), {}).kind == "diffuse"
    both_run_on = dict(SIGNIFICANT, finetuned_no_stop_rate=0.3, base_no_stop_rate=0.3)
    assert joined(both_run_on, [PAD_UNKNOWN], spread_effects(), symptoms_of(NEVER_STOPS), {}).kind == "diffuse"
    masked_off = dataclasses.replace(PAD_UNKNOWN, values={"collator_masks_pad": False})
    assert joined(SIGNIFICANT, [masked_off], spread_effects(), symptoms_of(NEVER_STOPS), {}).kind == "diffuse"


PAD_EOS_ANSWER = '{"intent": "refund", "order": "6911", "priority": "normal"}'
PAD_EOS_RUN_ON = "\nThe customer wants a refund for order 6911 and asks when it arrives. The customer wants a"


def test_answers_that_run_on_after_a_valid_object_with_pad_eos_are_setup_however_they_ended():
    """The pad == eos run of issue 44: 79 of 80 answers fail, each a valid object then run-on text. 44 ended on a
    late EOS and 35 at the token limit; read by where they depart, all 79 never stop (the old reading called the
    44 `wrapped`, so no symptom covered half and the verdict was `diffuse`). The verdict names the collator and the
    fix."""
    rows = [RegressionRow(f"e{i}", "prompt", [1], PAD_EOS_ANSWER, GeneratedAnswer([1], PAD_EOS_ANSWER, True),
                          GeneratedAnswer([2], PAD_EOS_ANSWER + PAD_EOS_RUN_ON, i < 44), 1.0, 0.0)
             for i in range(79)]
    rows.append(RegressionRow("e79", "prompt", [1], PAD_EOS_ANSWER, GeneratedAnswer([1], PAD_EOS_ANSWER, True),
                              GeneratedAnswer([2], PAD_EOS_ANSWER, True), 1.0, 1.0))
    symptoms = classify_failures(rows, get_capability("json_formatting:keys"))
    assert symptoms.n_failing == 79 and symptoms.counts["never-stops"] == 79 and symptoms.dominant == "never-stops"
    runs_on = dict(SIGNIFICANT, finetuned_rate=1 / 80, delta=-0.9875, n=80, finetuned_no_stop_rate=35 / 80,
                   base_no_stop_rate=0.0)
    verdict = joined(runs_on, [PAD_UNKNOWN], spread_effects(), symptoms, {})
    assert verdict.kind == "setup" and verdict.next_action == PAD_UNKNOWN.fix
    assert verdict.evidence["finding"]["check"] == "pad_eos_masking"
    assert "DataCollatorForLanguageModeling" in verdict.summary
    assert ("100.0% of the 79 failing answers do not stop where the answer ends (35 run on to the token limit, 44 "
            "write more text after a complete answer, then stop)") in verdict.summary


def test_a_stop_fault_needs_running_on_to_lead_not_to_cover_half():
    """Rule 3 asks that not stopping be the commonest way the answers fail, not that it cross 50%: a split such as
    45% never-stops beside 30% wrapped and 25% other is still the stop fault's, and a tie or a lead of another
    symptom is not."""
    led = joined(SIGNIFICANT, [PAD_UNKNOWN], spread_effects(),
                 symptoms_of({"never-stops": 9, "wrapped": 6, "other": 5}), {})
    assert led.kind == "setup" and led.evidence["finding"]["check"] == "pad_eos_masking"
    assert "fail in mixed ways (45.0% never-stops" in led.summary and "symptom" not in led.evidence
    for counts in ({"never-stops": 7, "stops-early": 7, "other": 6}, {"wrapped": 11, "never-stops": 9}):
        assert joined(SIGNIFICANT, [PAD_UNKNOWN], spread_effects(), symptoms_of(counts), {}).kind == "diffuse"


def test_never_stops_with_eos_unsupervised_on_most_rows_is_setup_and_on_a_few_names_them():
    most = Finding("missing_eos", "warning", "60 rows never supervise EOS.", "append eos", example_ids=IDS[40:100])
    verdict = joined(SIGNIFICANT, [most], spread_effects(), symptoms_of(NEVER_STOPS), {"missing_eos": 0.9})
    assert verdict.kind == "setup" and verdict.evidence["finding"]["check"] == "missing_eos"
    few = Finding("missing_eos", "warning", "20 rows never supervise EOS.", "append eos",
                  example_ids=[IDS[i] for i in ELSEWHERE])
    verdict = joined(SIGNIFICANT, [few], spread_effects(), symptoms_of(NEVER_STOPS), {"missing_eos": 0.8})
    assert verdict.kind == "data-cluster" and verdict.culprit_ids == [IDS[i] for i in ELSEWHERE]


def test_stops_early_with_cut_rows_where_the_failures_sit_names_them_even_when_harm_is_spread():
    """The issue's world: cut rows flagged exactly, many epochs marked critical, gradient harm spread."""
    effects = spread_effects()
    verdict = joined(SIGNIFICANT, [EPOCHS_CRITICAL, CUT], effects, symptoms_of(STOPS_EARLY), {"cut_in_data": 0.7})
    assert verdict.kind == "data-cluster"
    assert verdict.culprit_ids == [IDS[i] for i in CULPRITS]
    assert verdict.evidence["culprit_rule"] == "finding" and verdict.evidence["group"] == "cut_in_data"
    assert verdict.evidence["failure_share"] == 0.7 and verdict.evidence["failure_lift"] == pytest.approx(3.5)
    assert verdict.evidence["gradients"]["agreement"] == "spread"
    assert verdict.evidence["symptom"]["dominant"] == "stops-early"
    assert "The gradients alone name no cluster" in verdict.summary and "90.0% of the 20 failing answers stop early" \
        in verdict.summary
    assert verdict.next_action.startswith("drop these 20 rows: culprits.jsonl") and CUT.fix in verdict.next_action
    # the same rows when the failing prompts do not resemble them, or when the answers fail otherwise: not named
    assert joined(SIGNIFICANT, [CUT], effects, symptoms_of(STOPS_EARLY), {"cut_in_data": 0.1}).kind == "diffuse"
    assert joined(SIGNIFICANT, [CUT], effects, symptoms_of({"wrapped": 20}), {"cut_in_data": 0.7}).kind == "diffuse"
    assert joined(SIGNIFICANT, [CUT], effects, symptoms_of(NEVER_STOPS), {"cut_in_data": 0.7}).kind == "diffuse"


def test_cut_rows_that_hold_the_harm_are_all_named_when_the_failures_sit_with_other_rows():
    """home-cut-spaced: one category's answers are cut, the answers of others stop early, so the failing prompts
    resemble other rows; the gradients' harm sits on the cut rows, spread over several clusters."""
    cut_rows = [IDS[i] for i in (*range(10, 20), *range(50, 60))]  # half in cluster 0, half over clusters 1-3
    cut = dataclasses.replace(CUT, example_ids=cut_rows)
    effects = np.random.default_rng(2).normal(0.0, 0.3, size=(16, N))  # (Q, N)
    effects[:, [IDS.index(i) for i in cut_rows]] -= 5.0
    verdict = joined(SIGNIFICANT, [cut], effects, symptoms_of(STOPS_EARLY), {"cut_in_data": 0.05})
    assert verdict.kind == "data-cluster" and sorted(verdict.culprit_ids) == sorted(cut_rows)
    assert verdict.evidence["culprit_rule"] == "finding" and verdict.evidence["located_by"] == "harm"
    assert verdict.evidence["lift"] >= MIN_LIFT and "The failing prompts are about other rows" in verdict.summary
    # the harm spread: the audit alone does not name rows the failing prompts do not resemble
    assert joined(SIGNIFICANT, [cut], spread_effects(), symptoms_of(STOPS_EARLY), {"cut_in_data": 0.05}).kind \
        == "diffuse"
    # a symptom cut rows do not teach: the gradients alone, spread over clusters (1.6x at most), name nothing
    wrapped = joined(SIGNIFICANT, [cut], effects, symptoms_of({"wrapped": 20}), {"cut_in_data": 0.05})
    assert wrapped.kind == "diffuse" and wrapped.evidence["top_cluster"]["lift"] < MIN_LIFT


def test_failure_share_must_be_twice_the_group_size_share():
    wide = Finding("cut_in_data", "critical", "40 rows cut.", "complete them", example_ids=IDS[:40])
    assert joined(SIGNIFICANT, [wide], spread_effects(), symptoms_of(STOPS_EARLY), {"cut_in_data": 0.8}).kind \
        == "data-cluster"  # 0.8 >= 2 x 0.40
    assert joined(SIGNIFICANT, [wide], spread_effects(), symptoms_of(STOPS_EARLY), {"cut_in_data": 0.75}).kind \
        == "diffuse"  # the failing prompts resemble them, but less than twice what 40% of the rows predicts
    small = Finding("cut_in_data", "critical", "5 rows cut.", "complete them", example_ids=IDS[:5])
    assert joined(SIGNIFICANT, [small], spread_effects(), symptoms_of(STOPS_EARLY), {"cut_in_data": 0.2}).kind \
        == "diffuse"  # 4x its size, but under a quarter of the failing prompts' nearest rows
    half = Finding("cut_in_data", "warning", "60 rows cut.", "complete them", example_ids=IDS[:60])
    assert joined(SIGNIFICANT, [half], spread_effects(), symptoms_of(STOPS_EARLY), {"cut_in_data": 1.0}).kind \
        == "diffuse"  # most rows: a run-wide fault, not a group to drop


@pytest.mark.parametrize("counts", [{"wrapped": 15, "other": 5}, {"wrong-fields": 20}, {"other": 12, "wrapped": 8},
                                    {"stops-early": 7, "never-stops": 7, "other": 6}],
                         ids=["wrapped", "wrong-fields", "other", "mixed"])
def test_targets_failing_the_capability_where_the_failures_sit_are_named(counts):
    fails = Finding("fails_capability", "warning", "20 of 100 training completions fail json_formatting.",
                    "fix or drop them", example_ids=[IDS[i] for i in ELSEWHERE])
    verdict = joined(SIGNIFICANT, [fails], spread_effects(), symptoms_of(counts), {"fails_capability": 0.6})
    assert verdict.kind == "data-cluster" and verdict.culprit_ids == [IDS[i] for i in ELSEWHERE]
    assert "completions that fail the capability themselves" in verdict.summary
    assert joined(SIGNIFICANT, [fails], spread_effects(), symptoms_of(NEVER_STOPS), {"fails_capability": 0.6}).kind \
        == "diffuse"


def test_answers_closed_by_another_templates_marker_are_named_with_the_fix_that_keeps_them():
    """smol-home-foreign-eos: right answers then `</s>`, each stopped after it. Where the gradients are spread, the
    rows that fail the capability alone teach no one symptom, so they are not named; the marker's rows teach text
    after a complete answer and are, with the fix that keeps them."""
    rows = [IDS[i] for i in ELSEWHERE]
    fails = Finding("fails_capability", "critical", "20 of 100 training completions fail json_formatting.",
                    "fix or drop them", example_ids=rows)
    marker = Finding("foreign_turn_marker", "critical", "20 of 100 rows (20.0%) have trained answers that close with "
                     "another chat template's turn marker", "remove `</s>` from the answers of rows ...",
                     example_ids=rows, values={"markers": {"</s>": 20}})
    stopped_after = Symptoms(20, {s: 20 if s == "never-stops" else 0 for s in SYMPTOMS},
                             {s: 1.0 if s == "never-stops" else 0.0 for s in SYMPTOMS}, ran_to_limit=0)
    failure = {"fails_capability": 0.6, "foreign_turn_marker": 0.6}
    assert joined(SIGNIFICANT, [fails], spread_effects(), stopped_after, failure).kind == "diffuse"
    verdict = joined(SIGNIFICANT, [fails, marker], spread_effects(), stopped_after, failure)
    assert verdict.kind == "data-cluster" and verdict.culprit_ids == rows
    assert verdict.evidence["group"] == "foreign_turn_marker"
    assert "another chat template's turn marker as plain text" in verdict.summary
    assert "each writes more text after a complete answer, then stops" in verdict.summary
    assert "remove `</s>`" in verdict.next_action


def test_gradients_that_agree_and_that_disagree_with_the_audit_are_said_so():
    effects = planted_effects()  # the gradients concentrate on the planted rows of cluster 0
    agree = joined(SIGNIFICANT, [CUT], effects, symptoms_of(STOPS_EARLY), {"cut_in_data": 0.7})
    assert agree.kind == "data-cluster" and agree.evidence["gradients"]["agreement"] == "agree"
    assert agree.evidence["gradients"]["top_cluster"]["holds_group_rows"] == 1.0
    assert "The gradients agree" in agree.summary
    other = Finding("cut_in_data", "critical", "20 rows cut.", "complete them",
                    example_ids=[IDS[i] for i in ELSEWHERE])
    disagree = joined(SIGNIFICANT, [other], effects, symptoms_of(STOPS_EARLY), {"cut_in_data": 0.7})
    assert disagree.kind == "data-cluster" and disagree.culprit_ids == [IDS[i] for i in ELSEWHERE]
    assert disagree.evidence["gradients"]["agreement"] == "disagree"
    assert disagree.evidence["gradients"]["top_cluster"]["name"] == "invoice, currency, amount"
    assert "The gradients and the audit disagree" in disagree.summary and "invoice, currency, amount" \
        in disagree.summary


@pytest.mark.parametrize("rank,agree,disagree", [
    ("activation", "The activation ranking agrees: cluster", "The activation ranking and the audit disagree: the "
                                                            "activation ranking points at cluster"),
    ("combined", "The combined ranking (the gradients with the rows' relevance) agrees: cluster",
     "The combined ranking (the gradients with the rows' relevance) and the audit disagree: the combined ranking "
     "(the gradients with the rows' relevance) points at cluster"),
])
def test_the_agreement_with_the_audit_is_worded_by_the_method_that_ranked_the_rows(rank, agree, disagree):
    """--rank activation or combined: the clusters hold that ranking's effects, so the summary says that ranking
    agrees, not the gradients."""
    effects = planted_effects()
    clusters = summarize_clusters(IDS, LABELS, effects, {0: "invoice, currency, amount"}, [CUT], seed=0)
    groups = groups_for([CUT], effects, {"cut_in_data": 0.7})
    verdict = decide(SIGNIFICANT, [CUT], clusters, effects.mean(axis=0), IDS, symptoms=symptoms_of(STOPS_EARLY),
                     groups=groups, rank=rank)
    assert verdict.evidence["gradients"]["agreement"] == "agree"
    assert agree in verdict.summary and "The gradients" not in verdict.summary
    other = Finding("cut_in_data", "critical", "20 rows cut.", "complete them", example_ids=[IDS[i] for i in ELSEWHERE])
    verdict = decide(SIGNIFICANT, [other], clusters, effects.mean(axis=0), IDS, symptoms=symptoms_of(STOPS_EARLY),
                     groups=groups_for([other], effects, {"cut_in_data": 0.7}), rank=rank)
    assert verdict.evidence["gradients"]["agreement"] == "disagree"
    assert disagree in verdict.summary and "The gradients" not in verdict.summary
    elsewhere = decide(SIGNIFICANT, [other], summarize_clusters(IDS, LABELS, planted_effects(seed=1), {}, [other],
                                                                seed=0),
                       planted_effects(seed=1).mean(axis=0), IDS, symptoms=symptoms_of({"wrapped": 20}),
                       groups=groups_for([other], planted_effects(seed=1), {"cut_in_data": 0.7}), rank=rank)
    assert "audit_elsewhere" in elsewhere.evidence and disagree.split(":")[0] in elsewhere.summary


def test_a_gradient_cluster_verdict_names_a_defect_that_sits_elsewhere():
    other = Finding("cut_in_data", "critical", "20 rows cut.", "complete them",
                    example_ids=[IDS[i] for i in ELSEWHERE])
    verdict = joined(SIGNIFICANT, [other], planted_effects(seed=1), symptoms_of({"wrapped": 20}), {"cut_in_data": 0.7})
    assert verdict.kind == "data-cluster" and verdict.evidence["cluster"] == 0  # the gradients' cluster
    assert verdict.evidence["audit_elsewhere"] == [{"group": "cut_in_data", "size": 20, "failure_share": 0.7}]
    assert "The gradients and the audit disagree" in verdict.summary
    quiet = joined(SIGNIFICANT, [other], planted_effects(seed=1), symptoms_of({"wrapped": 20}), {"cut_in_data": 0.1})
    assert "audit_elsewhere" not in quiet.evidence and "disagree" not in quiet.summary


def test_diffuse_only_on_positive_evidence_of_a_run_wide_cause():
    unexplained = joined(SIGNIFICANT, [EPOCHS], spread_effects(), symptoms_of(STOPS_EARLY), {})
    assert unexplained.kind == "diffuse" and unexplained.evidence["cause_found"] is False
    assert unexplained.evidence["run_wide_causes"] == [] and unexplained.evidence["findings"] == ["many_epochs"]
    assert "No cause was found" in unexplained.summary
    assert EPOCHS.fix not in unexplained.next_action and "no cause found" in unexplained.next_action
    rising = Finding("eval_loss_rising", "warning", "eval loss rose from 0.4 (step 50) to 0.9 (step 200).",
                     "use checkpoint-50")
    verdict = joined(SIGNIFICANT, [EPOCHS, rising], spread_effects(), symptoms_of(STOPS_EARLY), {})
    assert verdict.evidence["cause_found"] is True and verdict.evidence["run_wide_causes"] == ["eval_loss_rising"]
    assert verdict.next_action == "look at hyperparameters: use checkpoint-50 (evidence: eval_loss_rising)"
    assert "eval loss rose from 0.4 (step 50) to 0.9 (step 200)" in verdict.summary
    critical = joined(SIGNIFICANT, [EPOCHS_CRITICAL], spread_effects(), None, {})
    assert critical.evidence["run_wide_causes"] == ["many_epochs"]  # critical: the check saw overfitting


def test_a_max_length_cut_that_trains_eos_is_a_setting_when_the_answers_stop_early():
    """The max-length story: a fifth of the rows ran long, were cut, and still end in EOS; the failing answers stop
    early. The rows are whole in the data, so the verdict is the setting and its fix, not the rows."""
    cut = dataclasses.replace(TRUNCATED, check="eos_after_cut", category="setup",
                              title="21 rows exceed max_length=64 and are cut there and still end in EOS",
                              fix="raise max_length to ≥ 90 (the longest rendered row: then no row is cut)")
    effects = planted_effects()  # the cut rows hold the harm too: the rule still names the setting
    verdict = joined(SIGNIFICANT, [cut], effects, symptoms_of(STOPS_EARLY), {"truncated_completion": 0.7})
    assert verdict.kind == "setup" and verdict.next_action == cut.fix and verdict.culprit_ids == []
    assert verdict.causes[0].symptom == "stops-early" and verdict.causes[0].fix == cut.fix
    assert "fixing it keeps them" in verdict.summary
    # without EOS after the cut (the cut rows lose their EOS), or when the answers fail otherwise: not this rule
    plain = dataclasses.replace(TRUNCATED, fix=cut.fix)
    assert joined(SIGNIFICANT, [plain], effects, symptoms_of(STOPS_EARLY), {"truncated_completion": 0.7}).kind \
        == "data-cluster"
    # garbled answers (a small model's): the rows the gradients name are the cut rows, so it is the setting still
    assert joined(SIGNIFICANT, [cut], effects, symptoms_of({"other": 20}), {"truncated_completion": 0.1}).kind \
        == "setup"
    # ... but not when the rows named lie outside what the setting cut
    elsewhere = dataclasses.replace(cut, example_ids=IDS[60:90])
    assert joined(SIGNIFICANT, [elsewhere], effects, symptoms_of({"other": 20}), {"truncated_completion": 0.1}).kind \
        == "data-cluster"


def test_a_setting_that_cut_the_named_rows_leads_the_next_action_with_the_value_that_cuts_none():
    """The max-length story: the rows the verdict names were cut by the run's max length, so the one-line change
    (with the longest row as trained, not the p99, which still cuts rows) comes first and dropping the rows second."""
    setting = "raise max_length to ≥ 158 (the longest row as trained, so no row is cut; the p99 of 157 would still cut some)"
    cut = dataclasses.replace(TRUNCATED, values={"p99_length": 157, "longest": 158, "fix_settings": {"max_length": 158},
                                                 "setting_fix": setting})
    verdict = verdict_for(SIGNIFICANT, [cut], planted_effects())
    assert verdict.kind == "data-cluster"
    assert verdict.next_action.startswith(setting + ": 20 completions are truncated by max_length=64")
    assert verdict.next_action.index(setting) < verdict.next_action.index("or drop these")
    # without a setting behind the rows, dropping them leads, as before
    assert verdict_for(SIGNIFICANT, [TRUNCATED], planted_effects()).next_action.startswith("drop these")


def test_a_step_size_with_a_smooth_log_outranks_a_cluster_only_while_the_cluster_is_not_decisive():
    """A rate above the range whose log shows smooth training is a risk: it outranks a cluster of clean rows whose
    harm share could be a collapse's spread (the tiny `diffuse` family: 53-73%), not one that holds the harm beyond
    doubt (smol-home-rename-volume: 86-99.9%, where removing the rows recovered the drop and a lower rate did not)."""
    smooth = dataclasses.replace(LEARNING_RATE, values={"learning_rate": 2e-3, "high": 1.78e-3, "log_shows": ""})
    decisive, spread = planted_effects(seed=1), planted_effects(seed=1) - 0.6  # every row a little harmful too
    for finding in (LEARNING_RATE, smooth):
        verdict = verdict_for(SIGNIFICANT, [finding], decisive)
        assert verdict.kind == "data-cluster" and "outranked_by_step_size" not in verdict.evidence
        assert verdict.evidence["harm_share_ci"][0] >= DECISIVE_HARM
        assert len(set(verdict.culprit_ids) & {IDS[i] for i in CULPRITS}) >= 0.8 * len(CULPRITS)
        verdict = verdict_for(SIGNIFICANT, [finding], spread)
        assert verdict.kind == "diffuse" and verdict.evidence["outranked_by_step_size"] is True
        assert verdict.evidence["top_cluster"]["harm_share_ci"][0] < DECISIVE_HARM
        assert verdict.evidence["top_cluster"]["lift"] >= MIN_LIFT  # concentrated: it would be named without the rate
    assert verdict_for(SIGNIFICANT, [], spread).kind == "data-cluster"
