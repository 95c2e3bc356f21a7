"""Effects that do not tell the rows apart: exactly equal, a float step apart, all zero, or NaN.

On one processor a tiny world's rows got one mean effect to the last digit, on another they were one float step
apart, and the report's histogram raised "Too many bins for data range" after all the work was done. Each case here
builds the report (and the verdict) from effects made to be so, and checks what the user sees: no crash, a sentence
that every row scored the same, no row named from the noise, and a ranking whose ties follow the row's position.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_report import SIGNIFICANT, effects_for, write_dataset

from bad_inputs.corpus import attribute_args
from bad_inputs.fixtures import gradian, workspace  # noqa: F401
from gradian.clusters.cluster import cluster_examples
from gradian.clusters.naming import name_clusters
from gradian.clusters.summary import summarize_clusters
from gradian.data.examples import read_dataset
from gradian.report.schema import Attribution, Context, build_report
from gradian.report.writers import render_html, render_markdown, write_report
from gradian.scores.combine import gradient_ranking
from gradian.scores.scoring import NonFiniteEffects, check_finite, distinct
from gradian.verdict import decide

MEAN = 18.033322504766385  # the tiny world's effect, and the value one float step above it
NEXT = float(np.nextafter(MEAN, np.inf))


def per_query(row_means: np.ndarray, n_queries: int = 4, seed: int = 0) -> np.ndarray:
    """(Q, N) effects that differ from query to query and whose mean over queries is `row_means` (to a float
    step): what the tiny world gave."""
    noise = np.random.default_rng(seed).normal(0.0, 2.0, size=(n_queries, len(row_means)))
    return noise - noise.mean(axis=0) + row_means[None, :]


class World:
    """The report tests' 60 ticket rows, clustered, with the clusters summarised from `effects` (Q, N)."""

    def __init__(self, folder, effects_of) -> None:
        culprits = write_dataset(folder / "train.jsonl")
        self.examples = read_dataset(folder / "train.jsonl")
        self.ids = [e.id for e in self.examples]
        texts = [(e.prompt_text, e.completion_text) for e in self.examples]
        self.labels = cluster_examples(texts, seed=0)
        self.effects = effects_of(self.ids, culprits)  # (Q, N)
        self.summaries = summarize_clusters(self.ids, self.labels, self.effects, name_clusters(texts, self.labels),
                                            [], seed=0)


def cases(n: int) -> dict[str, np.ndarray]:
    alternating = np.where(np.arange(n) % 2 == 0, MEAN, NEXT)
    return {"equal": np.full(n, MEAN), "one-ulp": alternating, "zero": np.zeros(n), "negative": np.full(n, -MEAN)}


@pytest.mark.parametrize("case", ["equal", "one-ulp", "zero", "negative"])
def test_a_report_on_effects_that_do_not_tell_rows_apart(case, tmp_path):
    """No histogram over a zero range, the report says every row scored the same, and no row is named."""
    effects = None

    def same(ids, culprits):
        nonlocal effects
        effects = np.tile(cases(len(ids))[case], (4, 1))  # (Q, N): every query the same, the mean exactly the row's
        return effects

    run = World(tmp_path, same)
    row_means = effects[0]
    verdict = decide(SIGNIFICANT, [], run.summaries, row_means, run.ids)
    assert verdict.kind != "data-cluster" and not verdict.culprit_ids  # the noise names no row
    report = build_report(SIGNIFICANT, verdict, [], run.examples, attribution=Attribution(effects, run.labels),
                          context=Context(seed=0))
    assert report["effects"]["distinct"] is False
    assert "effect_histogram" not in report["charts"]
    assert report["top_rows"] == []
    paths = write_report(tmp_path / "out", report, run.examples)
    said = "the gradients do not tell the rows apart, so no row is named from them"
    assert "Every training row scored the same effect" in paths["report.md"].read_text(encoding="utf-8")
    assert said in paths["report.md"].read_text(encoding="utf-8")
    assert 'id="effects-same"' in paths["report.html"].read_text(encoding="utf-8")
    # ranked by --rank activation: the effects are that ranking's, and the sentence names it
    ranked = {**report, "ranking": {"rank": "activation", "row_harm": "sum", "checks": {}}}
    for text in (render_markdown(ranked), render_html(ranked)):
        assert "the activation ranking does not tell the rows apart, so no row is named from it" in text
        assert said not in text
    assert json.loads(paths["report.json"].read_text(encoding="utf-8"))["effects"]["distinct"] is False


def test_a_spread_of_effects_still_draws_its_histogram_and_names_rows(tmp_path):
    """The control: effects that do differ keep the histogram (over their own range) and the harmful rows."""
    run = World(tmp_path, effects_for)
    effects = run.effects
    verdict = decide(SIGNIFICANT, [], run.summaries, effects.mean(axis=0), run.ids)
    report = build_report(SIGNIFICANT, verdict, [], run.examples, attribution=Attribution(effects, run.labels))
    histogram = report["charts"]["effect_histogram"]
    assert report["effects"]["distinct"] is True and sum(histogram["counts"]) == len(run.ids)
    assert histogram["edges"][0] == pytest.approx(report["effects"]["min"])
    assert report["top_rows"]


def test_harm_that_tells_no_row_apart_leaves_the_rows_their_own_effects():
    """The tiny world's cause: no row touched a harmful position (harm 0 everywhere), and leveling the effects to
    that harm gave all 8 rows one mean effect. The ranking now keeps the gradient's own mean effects and says why."""
    row_means = np.array([20.4, 13.5, 17.6, 20.5, 16.3, 16.9, 20.8, 18.5])
    effects = per_query(row_means)  # (4, 8)
    ranking = gradient_ranking(effects, harm=np.zeros(8), row_harm="positions")
    assert distinct(ranking.effect)
    np.testing.assert_allclose(ranking.effect, row_means, rtol=1e-12)
    assert ranking.row_harm == "sum" and ranking.harm is None and "tells no row apart" in ranking.note


def test_rows_of_equal_harm_get_exactly_equal_effects_and_keep_their_order():
    """Rows whose harm is equal get the same reported effect to the bit (so no processor orders them differently),
    and a stable sort of those effects lists them in dataset order."""
    row_means = np.linspace(-3.0, 5.0, 12)  # (N,)
    harm = np.array([4.0, 0.0, 0.0, 1.0, 0.0, 4.0, 0.0, 2.0, 0.0, 0.0, 1.0, 0.0])
    ranking = gradient_ranking(per_query(row_means, n_queries=7), harm=harm, row_harm="positions")
    for value in np.unique(harm):
        tied = ranking.effect[harm == value]
        assert np.all(tied == tied[0]), (value, tied)
    order = np.argsort(ranking.effect, kind="stable")
    assert order.tolist() == [0, 5, 7, 3, 10, 1, 2, 4, 6, 8, 9, 11]
    # the (Q, N) effects still average to the reported effect, within float steps of it
    np.testing.assert_allclose(ranking.effects.mean(axis=0), ranking.effect, rtol=1e-12, atol=1e-12)


def test_distinct_against_a_naive_float64_reference():
    rng = np.random.default_rng(3)
    for _ in range(200):
        scale = 10.0 ** rng.integers(-6, 7)
        values = scale * (1 + rng.integers(0, 3, size=6) * rng.choice([1e-15, 1e-6]))  # a few ulps or 1e-6 apart
        expected = (max(values) - min(values)) > 1e-9 * max(abs(v) for v in values)
        assert distinct(values) == expected
    assert not distinct(np.zeros(5)) and not distinct(np.array([1.0]))


def test_non_finite_effects_are_an_internal_error():
    effects = np.ones((3, 5))
    check_finite(effects)
    effects[1, 2] = np.nan
    effects[0, 4] = np.inf
    with pytest.raises(NonFiniteEffects, match="2 of 5 training rows have effects that are not finite"):
        check_finite(effects)


def test_nan_effects_end_attribute_with_exit_3_and_a_log(workspace, gradian, monkeypatch, tmp_path):  # noqa: F811
    """NaN effects stop `attribute` as an internal error: exit 3, one sentence with the log's path, no traceback
    (never exit 1, which a CI job would read as findings)."""
    import gradian.stages.ranking as ranking

    def nan_scores(*args, out, **kwargs):
        out[:] = np.nan
        return out

    monkeypatch.setenv("GRADIAN_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setattr(ranking, "score_features", nan_scores)
    result = gradian(attribute_args(workspace, tmp_path / "out", extra=("--force",)))
    assert result.exit_code == 3, result.output[-2000:]
    assert "Traceback" not in result.output and "effects that are not finite" in result.stderr
    assert "the traceback is in " + str(tmp_path / "logs") in result.stderr
