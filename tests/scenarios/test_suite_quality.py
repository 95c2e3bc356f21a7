"""The suite harness's metrics: AUPRC against scikit-learn, P@k, planted cluster first, causes named, epoch time."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.harness import suite_quality


@pytest.fixture(scope="module")
def harness():
    return suite_quality


def test_auprc_extremes(harness):
    positive = np.array([True, True, False, False, False])
    assert harness.auprc(np.array([5, 4, 3, 2, 1.0]), positive) == 1.0
    assert harness.auprc(np.array([1, 2, 3, 4, 5.0]), positive) == pytest.approx((1 / 4 + 2 / 5) / 2)
    assert harness.auprc(np.zeros(5), positive) == pytest.approx(0.4)  # one tie: precision = prevalence
    with pytest.raises(ValueError):
        harness.auprc(np.zeros(3), np.zeros(3, dtype=bool))


def test_precision_at_k_counts_the_culprits_among_the_top_k(harness):
    positive = np.array([True, False, True, False, False, True])
    scores = np.array([0.9, 0.8, 0.7, 0.1, 0.2, 0.3])
    assert harness.precision_at_k(scores, positive) == pytest.approx(2 / 3)  # k = 3: rows 0, 1, 2
    assert harness.precision_at_k(scores, positive, 1) == 1.0
    assert harness.precision_at_k(-scores, positive, 2) == 0.0  # rows 3, 4
    assert harness.precision_at_k(-scores, positive) == pytest.approx(1 / 3)  # rows 3, 4, 5


def test_cluster_first_and_causes_named(harness):
    labels = np.array([0, 0, 0, 1, 1, 1, 2, 2, 2, 2])
    positive = np.array([False, False, False, True, True, False, False, False, False, False])
    scores = np.array([0, 0.1, -0.1, 5, 4, 0.2, 0.1, 0, -0.2, 0.3])
    assert harness.cluster_first(scores, labels, positive) is True
    assert harness.cluster_first(-scores, labels, positive) is False
    ids = [f"t{i}" for i in range(10)]
    causes = [{"cause": "cut", "culprit_ids": ["t3", "t4"]}, {"cause": "fence", "culprit_ids": ["t8", "t0"]}]
    assert harness.causes_named(scores, ids, causes, k=3) == [True, False]
    assert harness.causes_named(np.array([0, 0, 0, 1, 0, 0, 0, 0, 3, 0.0]), ids, causes, k=2) == [True, True]


def test_epoch_seconds_from_trainer_state(harness, tmp_path):
    state = {"epoch": 4.0, "log_history": [{"loss": 1.0, "step": 5}, {"train_runtime": 10.0, "step": 20}]}
    (tmp_path / "trainer_state.json").write_text(json.dumps(state))
    assert harness.epoch_seconds(tmp_path) == 2.5
    assert harness.epoch_seconds(tmp_path / "missing") is None


def test_markdown_has_one_table_per_family_and_split(harness):
    method = {"auprc": 0.9, "precision_at_k": 0.8, "cluster_first": True, "causes_named": [], "backward_rows": 400,
              "forward_rows": 0, "seconds": 3.0, "epochs_worth": 2.0}
    records = [{"family": family, "split": split, "seed": seed, "verdict": "data-cluster",
                "methods": {"combined (default)": method, "random": {**method, "auprc": 0.1}}}
               for family, split in (("cut", "dev"), ("fence", "test")) for seed in (0, 1)]
    text = harness.markdown(records)
    assert text.count("### Summary") == 2 and "### cut (dev; seeds [0, 1]" in text and "### fence (test" in text
    assert "| combined (default) | 0.900 |" in text.split("### cut")[0]  # the dev summary, before the tables
    assert "| combined (default) | 0.900 | 0.800 | 2/2 | – | 400 | 0 | 2.0 |" in text
    assert text.index("| random |") < text.index("| combined (default) |")  # MAIN_METHODS order


def test_dev_rule_takes_the_best_dev_mean_unless_a_cheaper_one_is_within_the_margin(harness):
    def record(split, family, seed, methods):
        return {"split": split, "family": family, "seed": seed, "methods": {
            name: {"auprc": auprc, "backward_rows": rows, "epochs_worth": 1.0} for name, (auprc, rows) in methods.items()}}

    records = [record("dev", "a", 0, {"gradient · x · raw · TracIn-CP": (0.9, 2000), "combined · x · raw · final":
                                      (0.89, 400), "combined · y · raw · final": (0.7, 400), "TF-IDF (max)": (1.0, 0)}),
               record("dev", "b", 0, {"gradient · x · raw · TracIn-CP": (0.7, 2000), "combined · x · raw · final":
                                      (0.69, 400), "combined · y · raw · final": (0.5, 400), "TF-IDF (max)": (1.0, 0)}),
               record("test", "c", 0, {"combined · y · raw · final": (1.0, 400)}),
               record("dev", "c", 0, {"gradient · x · raw · TracIn-CP": (0.8, 2000), "combined · x · raw · final":
                                      (0.79, 400), "combined · y · raw · final": (0.6, 400), "TF-IDF (max)": (1.0, 0),
                                      "gradient · z · raw · TracIn-CP": (1.0, 2000)})]
    means = harness.family_means(records)
    assert means["gradient · x · raw · TracIn-CP"]["dev"] == {"mean": pytest.approx(0.8), "worst": 0.7, "families": 3,
                                                           "of": 3}
    assert "test" not in means["gradient · x · raw · TracIn-CP"]  # it ran on no test family
    assert harness.dev_rule(means) == "combined · x · raw · final"  # within 0.02 of the best at a fifth of the cost
    assert harness.dev_rule(means, margin=0.0) == "gradient · x · raw · TracIn-CP"  # baselines never chosen
    assert means["gradient · z · raw · TracIn-CP"]["dev"]["families"] == 1  # one of three: never chosen


def test_each_script_rewrites_only_its_own_region_of_the_page(tmp_path):
    from benchmarks.harness import page

    path = tmp_path / "BENCHMARKS.md"
    path.write_text("# B\n\nhand\n<!-- a: begin -->\nold a\n<!-- a: end -->\nmiddle\n<!-- b: begin -->\nold b\n"
                    "<!-- b: end -->\ntail\n")
    page.replace_region(path, "a", "new a\n")
    assert path.read_text() == ("# B\n\nhand\n<!-- a: begin -->\nnew a\n<!-- a: end -->\nmiddle\n<!-- b: begin -->\n"
                                "old b\n<!-- b: end -->\ntail\n")
    with pytest.raises(SystemExit, match="needs one"):
        page.replace_region(path, "c", "x")


def test_run_jobs_keeps_order_across_worker_processes(harness):
    """The suite's steps spread runs over processes; the results come back in the order asked, each reported once."""
    import operator

    from benchmarks.harness import jobs

    seen: list[int] = []
    asked = [(i, 10 * i) for i in range(5)]
    assert jobs.run_jobs(operator.add, asked, 2, seen.append) == [11 * i for i in range(5)]
    assert sorted(seen) == [11 * i for i in range(5)]
    assert jobs.run_jobs(operator.add, asked, 1) == [11 * i for i in range(5)]


def test_dev_rule_counts_forward_mode_passes_then_the_epochs_worth(harness):
    """A forward-mode pass costs as a backward one does; at equal passes the lower median ÷ epoch wins."""
    def record(family, methods):
        return {"split": "dev", "family": family, "seed": 0, "methods": {
            name: {"auprc": auprc, "backward_rows": 400, "forward_mode_rows": tangent, "epochs_worth": worth}
            for name, (auprc, tangent, worth) in methods.items()}}

    records = [record(family, {"combined · x · raw · final · tokens": (0.90, 400, 1.1),
                               "combined · x · raw · final · positions": (0.89, 0, 0.4)}) for family in ("a", "b")]
    means = harness.family_means(records)
    assert means["combined · x · raw · final · tokens"]["derivative_rows"] == 800
    assert harness.dev_rule(means) == "combined · x · raw · final · positions"  # within 0.02, half the passes
    both = [record(family, {"combined · x · raw · final · tokens": (0.90, 0, 1.1),
                            "combined · x · raw · final · positions": (0.89, 0, 0.4)}) for family in ("a", "b")]
    assert harness.dev_rule(harness.family_means(both)) == "combined · x · raw · final · positions"  # ÷ epoch
    assert harness.dev_rule(harness.family_means(both), margin=0.0) == "combined · x · raw · final · tokens"


def test_the_rule_over_all_methods_takes_the_activation_difference_only_ahead_or_cheaper(harness):
    """`--rank activation` replaces the gradient choice when it beats it by more than the margin, or is within the
    margin at a lower ÷ epoch; where it did not run on every dev family the gradient choice stays."""
    def means(activation, worth, families=("a", "b")):
        records = [{"split": "dev", "family": family, "seed": 0, "methods": {
            "gradient · x · raw · final · positions": {"auprc": 0.90, "backward_rows": 400, "epochs_worth": 1.0},
            **({"activation": {"auprc": activation, "backward_rows": 0, "epochs_worth": worth}}
               if family in families else {})}} for family in ("a", "b")]
        return harness.family_means(records)

    gradient = "gradient · x · raw · final · positions"
    assert harness.rule_over_all(means(0.95, 2.0)) == "activation"  # ahead by more than 0.02, though dearer
    assert harness.rule_over_all(means(0.91, 2.0)) == gradient  # within 0.02 and dearer
    assert harness.rule_over_all(means(0.89, 0.5)) == "activation"  # within 0.02 and cheaper
    assert harness.rule_over_all(means(0.89, 0.0)) == "activation"  # a cost of 0 is the cheapest, not unmeasured
    assert harness.rule_over_all(means(0.85, 0.5)) == gradient  # cheaper, but behind by more than the margin
    assert harness.rule_over_all(means(1.0, 0.5, families=("a",))) == gradient  # not on every dev family

    def with_both(combined, worth=3.0):  # the combination costs what both cost
        found = means(0.91, 2.0)
        return harness.rule_over_all({**found, "gradient + activation": {
            **found["activation"], "dev": {**found["activation"]["dev"], "mean": combined}, "epochs_worth": worth}})
    assert with_both(0.95) == "gradient + activation"  # ahead of both by more than 0.02
    assert with_both(0.92) == gradient  # within 0.02 of the cheapest near the best, and dearer

    found = means(0.91, 2.0)  # the activation difference read from where the answers depart is weighed as well
    departed = {**found["activation"], "dev": {**found["activation"]["dev"], "mean": 0.95}}
    assert harness.rule_over_all({**found, harness.DEPARTED: departed}) == harness.DEPARTED


@pytest.mark.parametrize("default", ["naive · raw · final · positions", "naive · raw · final · tokens"])
def test_gradient_plus_activation_sums_each_rankings_robust_z_at_the_cost_of_both(harness, monkeypatch, default):
    """The combination against a naive float64 reference: (x − median) / (1.4826 · MAD) of the default gradient
    score and of the activation cosine, summed; its seconds and passes (forward-mode ones too, for a default that
    ranks by harmful tokens) are the two methods' together."""
    monkeypatch.setattr(harness, "default_variant", lambda: default)
    rng = np.random.default_rng(0)
    n_rows, n_queries = 12, 3
    ids = [f"t{i}" for i in range(n_rows)]
    seconds = {"tfidf": 0.1, "bm25": 0.1, "repsim": 1.0, "base answers": 5.0, "activation": 2.0,
               "length control": 0.1, "extract final": 3.0, "query naive": 0.5, "score naive raw": 0.1,
               "score naive unit": 0.1, "positions naive": 4.0, "tokens naive": 6.0}
    meta = {"ids": ids, "seconds": seconds, "categories": ["a"] * n_rows, "tracin_extractions": 0}
    arrays = {"sim/tfidf": rng.random((n_rows, n_queries)), "sim/bm25": rng.random((n_rows, n_queries)),
              "part/repsim/sim": rng.random((n_rows, n_queries)), "activation": rng.normal(size=n_rows),
              "length control": rng.normal(size=n_rows), "effect/naive · raw · final": rng.normal(size=n_rows),
              "effect/naive · unit · final": rng.normal(size=n_rows), "positions/naive": rng.normal(size=n_rows),
              "harm/naive": rng.normal(size=n_rows)}
    truth = {"seed": 0, "culprit_ids": ids[:3], "category_ids": ids}
    methods = harness.methods_of(meta, arrays, truth)

    def z(values):
        values = np.asarray(values, dtype=np.float64)
        median = np.median(values)
        return (values - median) / (1.4826 * np.median(np.abs(values - median)))

    gradient, g_cost = methods["gradient (default)"]
    activation, a_cost = methods["activation"]
    combined, cost = methods["gradient + activation"]
    np.testing.assert_allclose(combined, z(gradient) + z(activation), rtol=1e-12)
    assert cost["seconds"] == pytest.approx(g_cost["seconds"] + a_cost["seconds"])
    for passes in ("backward_rows", "forward_rows", "forward_mode_rows"):
        assert cost[passes] == g_cost.get(passes, 0) + a_cost.get(passes, 0)
    assert cost["forward_mode_rows"] == (n_rows if default.endswith("tokens") else 0)
