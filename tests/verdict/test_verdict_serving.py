"""The `serving` verdict: a drop only the served answers show is the serving stack's, never the training rows'."""

from __future__ import annotations

from test_verdict import IDS, LABELS, NOISE, SIGNIFICANT, TRUNCATED, planted_effects, verdict_for

from gradian.clusters.summary import summarize_clusters
from gradian.verdict import KINDS, decide
from gradian.verdict.thresholds import SERVING_ONLY_SHARE
from gradian.verdict.wording import difference_fix

MAX_TOKENS = {"rule": "max_new_tokens", "evidence": {"max_new_tokens": 16, "longest_reference": 40,
                                                     "example_id": "e3", "n_rows": 12}}
STOP = {"rule": "stop_token", "evidence": {"n_rows": 9, "example_id": "e1", "trained_eos_id": 151645,
                                           "served_eos_ids": [151643]}}


def served_block(regression, training, differences=()):
    return {"outputs": "served.jsonl", "base_outputs": None, "base_source": "gradian", "model": "export",
            "regression": regression, "training": {k: training[k] for k in ("delta", "ci_low", "ci_high",
                                                                            "p_value", "significant")},
            "served_only_delta": regression["delta"] - training["delta"],
            "differences": [{**d, "fix": difference_fix(d)} for d in differences]}


def decide_served(training, served, findings=(), effects=None):
    effects = planted_effects() if effects is None else effects
    clusters = summarize_clusters(IDS, LABELS, effects, {0: "invoice, currency, amount"}, list(findings), seed=0)
    return decide(training, list(findings), clusters, effects.mean(axis=0), IDS, served=served)


def test_serving_is_a_verdict_kind():
    assert "serving" in KINDS


def test_a_served_drop_the_training_path_does_not_show_is_serving_with_each_fix():
    verdict = decide_served(NOISE, served_block(SIGNIFICANT, NOISE, [STOP, MAX_TOKENS]), [TRUNCATED])
    assert verdict.kind == "serving"
    assert verdict.culprit_ids == []  # no training row is blamed for the serving stack's drop
    assert [(c.kind, c.name) for c in verdict.causes] == [("serving", "stop_token"), ("serving", "max_new_tokens")]
    assert "trained end token is id 151645, the served stop tokens are [151643]" in verdict.summary
    assert verdict.next_action == (
        "add the trained end token 151645 to generation_config.json's eos_token_id (and the server's stop tokens); "
        "raise max_new_tokens in generation_config.json (and the server's limit) from 16 to at least 41")
    assert verdict.evidence["differences"] == ["stop_token", "max_new_tokens"]
    assert verdict.evidence["served"]["delta"] == SIGNIFICANT["delta"]


def test_a_much_smaller_training_drop_is_still_serving():
    small = dict(SIGNIFICANT, finetuned_rate=0.80, delta=-SERVING_ONLY_SHARE * 0.40 + 0.01, ci_high=-0.05)
    assert decide_served(small, served_block(SIGNIFICANT, small)).kind == "serving"
    alike = dict(SIGNIFICANT, finetuned_rate=0.70, delta=-0.25, ci_high=-0.1)
    assert decide_served(alike, served_block(SIGNIFICANT, alike)).kind != "serving"


def test_a_data_cause_served_correctly_keeps_its_data_verdict_and_says_the_served_only_part():
    without = verdict_for(SIGNIFICANT, [], planted_effects())
    served = dict(SIGNIFICANT, finetuned_rate=0.50, delta=-0.45)
    verdict = decide_served(SIGNIFICANT, served_block(served, SIGNIFICANT))
    assert verdict.kind == without.kind == "data-cluster"
    assert verdict.culprit_ids == without.culprit_ids
    assert "As served the drop is -45.0% (p = 1e-06); -5.0% of it is served-only" in verdict.summary
    assert abs(verdict.evidence["served_only_delta"] + 0.05) < 1e-9


def test_no_served_drop_leaves_the_training_verdict_unchanged():
    for training in (NOISE, SIGNIFICANT):
        without = verdict_for(training, [TRUNCATED], planted_effects())
        verdict = decide_served(training, served_block(NOISE, training), [TRUNCATED])
        assert (verdict.kind, verdict.summary, verdict.culprit_ids) == (without.kind, without.summary,
                                                                          without.culprit_ids)


def test_serving_with_nothing_found_says_what_to_compare():
    verdict = decide_served(NOISE, {**served_block(SIGNIFICANT, NOISE), "model": None})
    assert verdict.kind == "serving" and verdict.causes == []
    assert "pass --served-model to diff the export" in verdict.summary
    assert "served dtype" in verdict.next_action


GUESSED_BOS = {"rule": "double_bos", "evidence": {"n_rows": 12, "example_id": "e0", "where": "tokenizer",
                                                  "bos_token": "<s>", "bos_token_id": 1}}


def test_a_bos_doubled_only_by_a_guess_about_the_server_is_named_only_when_nothing_shown_explains_the_drop():
    """A template that writes BOS doubles it only on a server that tokenizes the rendered text with special tokens:
    the export cannot show which, so a stop token the export does show is the cause named alone."""
    verdict = decide_served(NOISE, served_block(SIGNIFICANT, NOISE, [STOP, GUESSED_BOS]))
    assert [c.name for c in verdict.causes] == ["stop_token"]
    assert "BOS" not in verdict.summary and "add_special_tokens" not in verdict.next_action
    alone = decide_served(NOISE, served_block(SIGNIFICANT, NOISE, [GUESSED_BOS]))
    assert [c.name for c in alone.causes] == ["double_bos"] and "add_special_tokens=False" in alone.next_action
    template = dict(GUESSED_BOS, evidence={**GUESSED_BOS["evidence"], "where": "template"})
    both = decide_served(NOISE, served_block(SIGNIFICANT, NOISE, [STOP, template]))
    assert [c.name for c in both.causes] == ["stop_token", "double_bos"]  # written twice by the template: shown
