"""`--rank activation`: the cosine of activation differences against naive float64 references, the base answers kept
in the output folder, the refusal where it cannot run, and the planted rows of a truncated cluster on top."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from bad_inputs.corpus import attribute_args
from bad_inputs.fixtures import assert_one_line_error, error_line, gradian, workspace  # noqa: F401
from bad_inputs.workspace import eval_rows, write_jsonl
from conftest import make_tiny_model
from gradian.scores import activation as act
from gradian.scores.combine import rank_rows


def test_the_score_is_the_cosine_of_the_rows_difference_with_the_mean_failing_difference():
    """v = mean_q (failing_q − intended_q), d_i = trained_i − own_i, score_i = cos(d_i, v): checked against a
    plain-Python float64 loop on float32 inputs; a row whose two states are equal scores 0."""
    rng = np.random.default_rng(7)
    n_rows, n_queries, dim = 9, 4, 6
    trained, own = (rng.normal(size=(n_rows, dim)).astype(np.float32) for _ in range(2))
    failing, intended = (rng.normal(size=(n_queries, dim)).astype(np.float32) for _ in range(2))
    own[3] = trained[3]  # d_3 = 0

    v = [sum(float(failing[q, j]) - float(intended[q, j]) for q in range(n_queries)) / n_queries for j in range(dim)]
    expected = []
    for i in range(n_rows):
        d = [float(trained[i, j]) - float(own[i, j]) for j in range(dim)]
        norms = math.sqrt(sum(x * x for x in d)) * math.sqrt(sum(x * x for x in v))
        expected.append(sum(a * b for a, b in zip(d, v, strict=True)) / norms if norms > 0 else 0.0)

    direction = act.behaviour_direction(failing, intended)
    np.testing.assert_allclose(direction, v, rtol=0, atol=1e-12)
    scores = act.difference_cosines(trained, own, direction)
    assert scores.dtype == np.float64
    np.testing.assert_allclose(scores, expected, rtol=0, atol=1e-12)
    assert scores[3] == 0.0


@pytest.mark.parametrize("batch_size", [1, 3])
def test_hidden_states_averaged_over_the_answer_tokens_at_a_layer(tiny_tokenizer, batch_size):
    """Each sequence alone, its flagged tokens averaged at `layer`, float64; padding and unflagged tokens never leak
    into the mean, and a sequence with no flagged token gets zeros."""
    from gradian.scores.relevance import mean_hidden_states

    model = make_tiny_model(tiny_tokenizer, seed=4, dtype=torch.float64).eval()
    rng = np.random.default_rng(1)
    sequences = [rng.integers(3, len(tiny_tokenizer), size=n).tolist() for n in (6, 11, 4, 8)]
    flags = [[t >= 2 for t in range(6)], [t % 3 == 0 for t in range(11)], [False] * 4, [t == 7 for t in range(8)]]
    for layer in (1, 2):
        expected = []
        for sequence, flagged in zip(sequences, flags, strict=True):
            with torch.no_grad():
                hidden = model(input_ids=torch.tensor([sequence]), output_hidden_states=True).hidden_states[layer][0]
            chosen = hidden[torch.tensor(flagged)]
            expected.append(chosen.mean(dim=0).numpy() if len(chosen) else np.zeros(hidden.shape[1]))
        got = mean_hidden_states(model, sequences, batch_size=batch_size, layer=layer, positions=flags)
        np.testing.assert_allclose(got, np.stack(expected), rtol=0, atol=1e-10)


@pytest.mark.parametrize(("one", "other", "kept_one", "kept_other"), [
    ([1, 2, 3, 4, 5], [1, 2, 3, 9, 9, 9], [3, 4], [3, 4, 5]),  # departs at the answer's second token
    ([1, 2, 3, 4], [1, 2, 3, 4, 7, 8], [3], [4, 5]),  # one stops where the other goes on: its last token kept
    ([1, 2, 3, 4], [1, 2, 3, 4], [3], [3]),  # the same answer: each keeps its last token
    ([1, 5, 3, 4], [1, 2, 3, 4], [2, 3], [2, 3]),  # prompts differ (another rendering): the whole answers
])
def test_the_differences_read_from_where_the_answers_depart(one, other, kept_one, kept_other):
    """Two sequences whose answers start at token 2: each keeps its answer tokens from the first token where the two
    differ, and a side with none there keeps its last answer token."""
    def answer(ids):
        return ids, [t >= 2 for t in range(len(ids))]

    def naive(ids, with_ids):
        first = len(ids)
        for t in range(len(ids)):
            if t >= len(with_ids) or ids[t] != with_ids[t]:
                first = t
                break
        kept = [t for t in range(2, len(ids)) if t >= first]
        return kept or [len(ids) - 1]

    (_, a), (_, b) = act.departed(answer(one), answer(other))
    assert [t for t, flag in enumerate(a) if flag] == kept_one == naive(one, other)
    assert [t for t, flag in enumerate(b) if flag] == kept_other == naive(other, one)


def test_the_layer_is_the_middle_one(tiny_tokenizer):
    assert act.activation_layer(make_tiny_model(tiny_tokenizer, num_hidden_layers=4)) == 2
    assert act.activation_layer(make_tiny_model(tiny_tokenizer, num_hidden_layers=5)) == 2


def test_the_agreement_compares_the_two_top_k():
    effect = np.r_[-np.ones(30), np.ones(370)]  # 400 rows, 30 with a negative gradient effect
    assert act.agreement_size(effect) == 20  # at most 5% of the rows
    assert act.agreement_size(np.r_[-np.ones(2), np.ones(38)]) == 5  # at least 5
    assert act.agreement_size(-np.ones(3)) == 3  # never more than there are rows
    score, other = np.arange(10.0), np.r_[np.arange(8.0), -1.0, -2.0]  # tops {9, 8, 7} and {7, 6, 5}
    assert act.top_overlap(score, other, 3) == pytest.approx(1 / 3)
    assert act.top_overlap(score, score, 4) == 1.0


def test_the_activation_ranking_levels_the_gradient_effects_to_its_cosine():
    """score = the cosine; the effects keep which queries each row hurts and move to the cosine's order, so
    ranking by effect is ranking by the cosine; ranking.json says the layer, the cost and the agreement."""
    rng = np.random.default_rng(3)
    effects = rng.normal(size=(4, 60))  # (Q, N)
    scores = act.ActivationScores(rng.uniform(-1, 1, size=60), 1, 4, 60, 1.5, 0.25, False)
    ranking = rank_rows("activation", effects, None, None, [], activation=scores)
    assert ranking.rank == "activation"
    np.testing.assert_array_equal(ranking.score, scores.cosine)
    assert np.corrcoef(ranking.effect, scores.cosine)[0, 1] == pytest.approx(-1.0, abs=1e-9)
    np.testing.assert_allclose(ranking.effects.mean(axis=0), ranking.effect, atol=1e-12)
    np.testing.assert_allclose(ranking.effects - ranking.effects.mean(axis=0), effects - effects.mean(axis=0),
                               atol=1e-12)
    saved = ranking.to_dict()
    assert saved["activation"]["layer"] == 1 and saved["activation"]["generation_seconds"] == 1.5
    assert saved["agreement"]["k"] == act.agreement_size(effects.mean(axis=0))
    assert 0 <= saved["agreement"]["overlap"] <= 1


def _spy(monkeypatch) -> list[int]:
    """Count the prompts the base-answers stage generates for (a list of each call's prompt count)."""
    import gradian.regression.base_answers as answers

    calls: list[int] = []
    real = answers.generate

    def counted(model, tokenizer, prompts, **kwargs):
        calls.append(len(prompts))
        return real(model, tokenizer, prompts, **kwargs)

    monkeypatch.setattr(answers, "generate", counted)
    return calls


def test_a_rerun_into_the_same_folder_reuses_the_base_answers(workspace, gradian, tmp_path, monkeypatch):  # noqa: F811
    """`attribute --rank activation` end to end on the tiny world: the first run generates the base's answer to each
    training prompt once, into base_answers/; a second run into the same --out generates none and ranks the same."""
    calls = _spy(monkeypatch)
    out = tmp_path / "out"
    args = attribute_args(workspace, out, extra=("--rank", "activation", "--force"))
    first = gradian(args)
    assert first.exit_code == 0, first.output[-3000:]
    assert calls == [8]  # the 8 training prompts, in one call
    ranking = json.loads((out / "ranking.json").read_text())
    assert ranking["rank"] == "activation" and ranking["activation"]["base_answers_cached"] is False
    assert ranking["activation"]["layer"] == 1 and ranking["activation"]["n_rows"] == 8
    assert len(list((out / "base_answers").glob("*.jsonl"))) == 1

    second = gradian(args)
    assert second.exit_code == 0, second.output[-3000:]
    assert calls == [8], "the second run generated again"
    again = json.loads((out / "ranking.json").read_text())
    assert again["activation"]["base_answers_cached"] is True
    assert again["rows"]["rank_score"] == ranking["rows"]["rank_score"]
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["rank"] == "activation" and report["ranking"]["rank"] == "activation"
    assert report["ranking"]["agreement"] == again["agreement"]
    assert "Rows ranked by how each row's completion moves" in (out / "report.md").read_text()


def test_activation_without_a_reference_on_any_failing_row_is_refused(workspace, gradian, tmp_path,  # noqa: F811
                                                                      monkeypatch):
    """No failing eval row has a reference answer: exit 2 with one sentence, before the gradients and before any
    base answer is generated."""
    calls = _spy(monkeypatch)
    prompts_only = write_jsonl(tmp_path / "eval.jsonl", [{"id": r["id"], "prompt": r["prompt"]} for r in eval_rows()])
    out = tmp_path / "out"
    result = gradian(attribute_args(workspace, out, eval_dataset=prompts_only, extra=("--rank", "activation",
                                                                                      "--force")))
    assert_one_line_error(result, "--rank activation")
    assert error_line(result) == (
        "Error: --rank activation contrasts the fine-tune's failing answers with the eval rows' reference answers, "
        "and no failing eval row has one; add reference answers (a completion) to the eval rows, or use --rank "
        "gradient.")
    assert calls == [] and not (out / "gradients").exists()


@pytest.mark.slow
def test_activation_rank_puts_the_planted_rows_of_a_truncated_cluster_on_top(scenario, attributed_copy, tmp_path):
    """The cheapest data-cluster scenario: most rows of one category end mid-object, and the fine-tune stops
    early. Their completions as trained move the base's middle-layer state the way the failing answers do.

    Measured on seed 0 (the final adapter, as the default): AUPRC 1.000 by the cosine, every planted row at 0.93 to
    0.95 and no clean row above 0.37; the gradient default also 1.000 on the same world, the category oracle 0.703.
    0.95 allows about two clean rows among the planted ones. The verdict, the clusters and the report read the
    gradient effects leveled to the cosine, and must still find the data cluster.
    """
    from dataclasses import replace

    from gradian import attribute
    from gradian.report.rows import read_examples
    from gradian.scenarios import attribute_settings
    from gradian.scenarios.evaluate import auprc, oracle_auprc, planted

    folder = scenario("truncated-cluster", 0)
    truth = json.loads((folder / "truth.json").read_text())
    out = attributed_copy("truncated-cluster", tmp_path / "activation")  # its generations and gradients reused
    attribute(replace(attribute_settings(folder, out), rank="activation"))
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["rank"] == "activation" == report["ranking"]["rank"]
    rows = read_examples(out)
    ids = [row["id"] for row in rows]
    positive = planted(ids, truth)
    by_cosine = auprc(np.array([row["rank_score"] for row in rows]), positive)
    by_effect = auprc(-np.array([row["effect"] for row in rows]), positive)
    assert by_cosine >= 0.95 and by_cosine > oracle_auprc(ids, truth), by_cosine
    assert by_effect == pytest.approx(by_cosine, abs=1e-9)  # the effects were leveled to the cosine's order
    assert report["verdict"]["kind"] == "data-cluster", report["verdict"]["summary"]
    named = set(report["verdict"]["culprit_ids"])
    assert len(named & set(truth["culprit_ids"])) >= 0.9 * len(named)
    activation = report["ranking"]["activation"]
    assert activation["layer"] == 1 and activation["n_rows"] == len(rows) and activation["n_queries"] > 0
    assert activation["generation_seconds"] > 0 and activation["activation_seconds"] > 0
    assert report["ranking"]["agreement"]["overlap"] > report["ranking"]["agreement"]["chance"]
