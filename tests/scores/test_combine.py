"""The combined rank: its parts against naive references, and what it does on synthetic worlds with known culprits.

The worlds mimic what the gradient and similarity each get wrong: a category whose rows are mostly culprits and
partly clean neighbours (which the gradient ranks as the most helpful rows), and rows of other categories whose
large gradients align with the queries (which the gradient ranks above the culprits); and what relevance gets
wrong: failing prompts about another topic than the culprits' (a fence taught by one category makes the others
fail), or spread over every topic.
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import average_precision_score

from gradian.scores.combine import (
    AGREEMENT_TOP,
    RELEVANCE_SCALE,
    Relevance,
    agreement_auc,
    combine,
    gradient_ranking,
    relevance_check,
    robust_z,
)

N, CATEGORY, CULPRITS, LOUD = 300, 45, 36, 8


def world(seed: int, *, relevance_at: str = "category", culprits: int = CULPRITS, loud: int = LOUD,
          loudness: tuple[float, float] = (2.0, 5.0)):
    """(effects (Q, N), relevance list, culprit mask): rows 0..35 culprits, 36..44 their clean neighbours,
    45.. `loud` rows of other categories, the rest quiet. The relevant rows: the culprits' category, 45 quiet rows
    of another topic (`elsewhere`), or none (`spread`: the failing prompts are about everything)."""
    rng = np.random.default_rng(seed)
    harm = rng.normal(0, 1, N)
    harm[:culprits] += 2.5
    harm[culprits:CATEGORY] -= 4.0  # the clean neighbours: the most helpful rows
    harm[CATEGORY:CATEGORY + loud] += rng.uniform(*loudness, loud)  # unrelated rows whose gradients align
    effects = -harm[None, :] + rng.normal(0, 0.3, (12, N))  # (Q, N) negative = harmful
    related = np.zeros(N, dtype=bool)
    related[:CATEGORY] = relevance_at == "category"
    related[100:145] = relevance_at == "elsewhere"
    train = rng.normal(0, 0.05, N) + 0.5 * related
    positive = np.zeros(N, dtype=bool)
    positive[:culprits] = True
    return effects, [Relevance("text", train)], positive


def ap(score, positive):
    return average_precision_score(positive, score)


def test_robust_z_against_the_naive_formula():
    x = np.random.default_rng(0).standard_t(3, 501)
    z, median, scale = robust_z(x)
    assert median == pytest.approx(sorted(x)[250])
    assert scale == pytest.approx(1.4826 * sorted(abs(x - median))[250])
    np.testing.assert_allclose(z, (x - median) / scale)
    assert robust_z(np.r_[np.zeros(9), 5.0])[2] > 0  # MAD 0: falls back to the standard deviation


def test_agreement_auc_against_counting_pairs():
    """The share of (top, rest) pairs where the top row is the more relevant (ties half), in float64 loops."""
    rng = np.random.default_rng(3)
    harm, relevance = rng.normal(size=120), np.round(rng.normal(size=120), 1)  # rounded: ties
    k = max(5, round(AGREEMENT_TOP * 120))
    top = set(np.argsort(-harm)[:k].tolist())
    wins = [1.0 if relevance[i] > relevance[j] else 0.5 if relevance[i] == relevance[j] else 0.0
            for i in top for j in range(120) if j not in top]
    assert agreement_auc(relevance, harm) == pytest.approx(sum(wins) / len(wins), abs=1e-12)
    assert agreement_auc(relevance[:5], harm[:5]) == 0.5  # too few rows to split


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_combined_puts_the_culprits_first_where_neither_part_does(seed):
    effects, relevances, positive = world(seed)
    gradient = ap(-effects.mean(axis=0), positive)
    similarity = ap(relevances[0].train, positive)
    ranking = combine(effects, relevances)
    assert gradient < 0.75 and similarity < 0.9  # each part alone is fooled
    assert ap(ranking.score, positive) > 0.97
    assert ranking.checks["text"]["weight"] > 0.2
    # the effects the verdict reads rank the rows as the score does (their mean over queries to a float step)
    np.testing.assert_array_equal(np.argsort(ranking.effect, kind="stable"), np.argsort(-ranking.score, kind="stable"))
    np.testing.assert_allclose(ranking.effects.mean(axis=0), ranking.effect, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_half_clean_category_still_counts_its_relevance(seed):
    """Half the category clean and the most helpful rows of all, yet part of the top of the gradient's ranking
    lies in the category, so relevance counts."""
    effects, relevances, positive = world(seed, culprits=CATEGORY // 2)
    ranking = combine(effects, relevances)
    assert ranking.checks["text"]["weight"] > 0.15
    assert ap(ranking.score, positive) > 0.95 > ap(-effects.mean(axis=0), positive) + 0.3


@pytest.mark.parametrize("relevance_at", ["elsewhere", "spread"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_relevance_that_points_away_from_the_harm_does_not_drown_the_gradient(seed, relevance_at):
    """The failing prompts about another topic than the culprits', or about every topic: relevance counts nothing."""
    effects, relevances, positive = world(seed, relevance_at=relevance_at)
    ranking = combine(effects, relevances)
    assert ranking.checks["text"]["weight"] < 0.1
    assert ap(ranking.score, positive) >= ap(-effects.mean(axis=0), positive) - 0.02
    ungated = combine(effects, relevances, gated=False)
    assert ungated.checks["text"]["weight"] == 1.0
    if relevance_at == "elsewhere":  # counted fully, it would put the other topic's rows first
        assert ap(ungated.score, positive) < ap(ranking.score, positive) - 0.3


def test_where_loud_rows_fill_the_gradients_top_relevance_gets_no_weight():
    """The rule's blind spot, kept on purpose: when rows of other topics fill the gradient's whole top share
    (AGREEMENT_TOP), the check cannot see the category's relevance agree, and the ranking stays the gradient's."""
    effects, relevances, positive = world(0, loud=round(AGREEMENT_TOP * N) + 5, loudness=(4.0, 7.0))
    ranking = combine(effects, relevances)
    assert ranking.checks["text"]["weight"] < 0.05
    assert ap(ranking.score, positive) == pytest.approx(ap(-effects.mean(axis=0), positive), abs=0.02)


def test_relevance_with_no_weight_leaves_the_effects_unchanged():
    """A constant relevance (every row alike) picks out nothing: weight 0, the gradient's ranking exactly."""
    effects, [relevance], _ = world(0)
    flat = Relevance("text", np.full(N, 0.3))
    assert relevance_check(flat, -effects.mean(axis=0)) == {"auc": 0.5, "rho": 0.0, "weight": 0.0}
    ranking = combine(effects, [flat])
    np.testing.assert_allclose(ranking.effects, effects)
    np.testing.assert_allclose(ranking.score, gradient_ranking(effects).score)


def test_the_score_is_harm_plus_lambda_times_the_weighted_relevance():
    """score = z(harm) + λ · Σ w z(relevance) / max(1, Σ w), against the formula written out."""
    effects, [relevance], _ = world(1)
    ranking = combine(effects, [relevance])
    weight = ranking.checks["text"]["weight"]
    harm = -effects.mean(axis=0)
    z = lambda x: (x - np.median(x)) / (1.4826 * np.median(np.abs(x - np.median(x))))  # noqa: E731
    np.testing.assert_allclose(ranking.score, z(harm) + RELEVANCE_SCALE * weight * z(relevance.train) / max(1, weight))


def test_weights_above_one_in_total_are_averaged_so_relevance_stays_bounded():
    effects, [relevance], _ = world(1)
    ungated = combine(effects, [relevance], gated=False)
    twice = combine(effects, [relevance, Relevance("again", relevance.train)], gated=False)
    np.testing.assert_allclose(twice.score, ungated.score)
    assert set(twice.row_fields()) == {"gradient_effect", "rank_score", "relevance_text", "relevance_again"}
    assert twice.to_dict()["rank"] == "combined"


@pytest.mark.slow
def test_combined_rank_puts_the_planted_rows_on_top_of_a_truncated_cluster(scenario, attributed_copy, tmp_path):
    """`attribute --rank combined` end to end on the cheapest data-cluster scenario: the planted rows on top, above
    the category oracle and no worse than either part alone, and the report carries both parts per row.

    Measured on seed 0 (benchmarks/harness/suite_quality.py, repaired-first on the final adapter): combined 1.000, category
    oracle 0.703, TF-IDF alone 0.971; 0.99 allows one clean row among the culprits, so a combination whose relevance
    drowned the gradient (TF-IDF ranks clean neighbours among the culprits) fails it.
    """
    import json
    from dataclasses import replace

    from gradian import attribute
    from gradian.report.rows import read_examples
    from gradian.scenarios import attribute_settings
    from gradian.scenarios.evaluate import oracle_auprc, planted

    folder = scenario("truncated-cluster", 0)
    truth = json.loads((folder / "truth.json").read_text())
    out = attributed_copy("truncated-cluster", tmp_path / "combined")  # its generations and gradients reused
    attribute(replace(attribute_settings(folder, out), rank="combined"))  # on the final adapter, as the default
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["rank"] == "combined" and report["settings"]["checkpoints"] == "off"
    rows = read_examples(out)
    ids = [row["id"] for row in rows]
    positive = planted(ids, truth)
    combined = ap(-np.array([row["effect"] for row in rows]), positive)
    parts = {name: ap(sign * np.array([row[name] for row in rows]), positive)
             for name, sign in (("gradient_effect", -1), ("relevance_tfidf", 1), ("relevance_repsim", 1))}
    assert combined >= 0.99 and combined > oracle_auprc(ids, truth), (combined, parts)
    assert all(combined >= auprc - 0.005 for auprc in parts.values()), (combined, parts)
    assert report["ranking"]["rank"] == "combined" and report["ranking"]["checks"]["tfidf"]["weight"] > 0.5
    effect_vs_score = np.corrcoef([row["effect"] for row in rows], [row["rank_score"] for row in rows])[0, 1]
    assert effect_vs_score == pytest.approx(-1.0, abs=1e-9)  # the effect is the score in effect units
    named = set(report["verdict"]["culprit_ids"])
    assert report["verdict"]["kind"] == "data-cluster" and len(named & set(truth["culprit_ids"])) >= 0.9 * len(named)
    assert (out / "ranking.json").exists()


@pytest.mark.parametrize("rank", ["combined", "gradient"])
def test_a_row_harm_of_its_own_sets_the_order_and_the_effects_follow_it(rank):
    """With `harm` (the harmful positions' or tokens' part), the score is z(harm) (+ relevance), each row's effects keep which
    queries it hurts and move, as a whole, to its score in effect units; harm = −(mean effect) changes nothing."""
    effects, relevances, _ = world(2)
    harm = np.random.default_rng(5).gamma(2.0, size=N)  # (N,) positive, as Σ_t max(0, ·) is
    make = (lambda **kw: combine(effects, relevances, **kw)) if rank == "combined" else \
        (lambda **kw: gradient_ranking(effects, **kw))
    plain, own = make(), make(harm=harm, row_harm="positions")
    z = lambda x: (x - np.median(x)) / (1.4826 * np.median(np.abs(x - np.median(x))))  # noqa: E731
    weights = [relevance_check(r, harm)["weight"] if rank == "combined" else 0.0 for r in relevances]
    shift = RELEVANCE_SCALE * sum(w * z(r.train) for w, r in zip(weights, relevances, strict=True)) \
        / max(1.0, sum(weights))
    np.testing.assert_allclose(own.score, z(harm) + shift)  # the checks read this harm, not the mean effect
    effect = effects.mean(axis=0)
    median, scale = np.median(-effect), 1.4826 * np.median(np.abs(-effect - np.median(-effect)))
    np.testing.assert_allclose(own.effects.mean(axis=0), -(median + scale * own.score), atol=1e-12)
    np.testing.assert_allclose(own.effects - own.effects.mean(axis=0), effects - effect, atol=1e-12)  # per query
    assert own.row_harm == "positions" and plain.row_harm == "sum" and "row_harm" not in plain.row_fields()
    np.testing.assert_array_equal(own.row_fields()["row_harm"], harm)
    same = make(harm=-effect)
    np.testing.assert_allclose(same.score, plain.score)
    np.testing.assert_allclose(same.effects, plain.effects, atol=1e-12)


def test_auto_row_harm_reads_its_harmful_part_only_on_the_final_adapters_raw_gradients():
    from gradian.settings import AUTO_ROW_HARM, row_harm_of

    assert AUTO_ROW_HARM in ("positions", "tokens")
    assert row_harm_of("auto", "identity", False, tracin=False) == AUTO_ROW_HARM
    assert row_harm_of("auto", "identity", False, tracin=True) == "sum"  # TracIn-CP effects: summed
    assert row_harm_of("auto", "kfac", False, tracin=False) == "sum"
    assert row_harm_of("auto", "identity", True, tracin=False) == "sum"
    for given in ("positions", "tokens", "sum"):
        assert row_harm_of(given, "identity", False, tracin=False) == given
