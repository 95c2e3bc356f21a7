"""On the scenario world: truncated-cluster is a significant regression, null is inside the noise band.

Scenario folders are built once and kept in pytest's cache, keyed by a hash of the scenario code, so a
rerun (or another test module using the same key) skips the minutes of fine-tuning.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gradian.capabilities import get_capability
from gradian.capabilities.repair import parse_object
from gradian.data.base_model import resolve_base_model
from gradian.data.examples import read_dataset
from gradian.data.setup import TrainingSetup
from gradian.regression.loading import load_models
from gradian.regression.measure import measure_regression

pytestmark = pytest.mark.slow  # the first run fine-tunes two scenarios (minutes on 2 cores)


def _measure(folder: Path, out: Path):
    model, tokenizer = load_models(resolve_base_model(folder / "base"), folder / "run", device="cpu")
    examples = read_dataset(folder / "eval.jsonl", eval_set=True)
    measured = json.loads((folder / "measured.json").read_text())
    result = measure_regression(model, tokenizer, examples, "json_formatting", TrainingSetup(), out,
                                max_new_tokens=measured["max_new_tokens"], batch_size=32)
    return result, measured, {example.id: example.raw["category"] for example in examples}


def test_truncated_cluster_is_a_significant_regression(scenario, tmp_path):
    folder = scenario("truncated-cluster")
    result, measured, category = _measure(folder, tmp_path)
    summary = result.summary
    assert summary.significant and summary.verdict == "regression", result.explain()
    assert summary.ci_low <= summary.delta <= summary.ci_high < 0 and summary.p_value < 0.01
    # Same greedy decoding as the scenario's own measurement (which pads nothing): the same validity.
    assert summary.base_rate == pytest.approx(measured["base"]["overall"]["validity"], abs=0.02)
    assert summary.finetuned_rate == pytest.approx(measured["finetuned"]["overall"]["validity"], abs=0.02)
    affected = json.loads((folder / "truth.json").read_text())["affected_category"]
    failures = result.failures()
    assert sum(category[row.id] == affected for row in failures) >= 0.8 * len(failures)
    # The planted mechanism: the fine-tuned model stops mid-object, and the repair continues right there.
    capability = get_capability("json_formatting")
    stopped_early = [row for row in failures if row.finetuned.stopped]
    assert len(stopped_early) >= 0.8 * len(failures)
    for row in stopped_early:
        repaired = capability.repair(row.finetuned.text, row.reference)
        assert capability.score(repaired, row.reference) == 1.0
        complete = parse_object(row.finetuned.text).fields
        assert repaired.startswith(row.finetuned.text[: complete[-1].end if complete else 1])


def test_null_is_inside_the_noise_band(scenario, tmp_path):
    result, _, _ = _measure(scenario("null"), tmp_path)
    assert not result.summary.significant and result.summary.verdict == "no-regression"
    assert result.summary.ci_high >= 0
    text = result.explain()  # refused: a drop inside the noise band, or no drop at all (Δ 0 on the null run)
    assert text.endswith("so Gradian does not attribute.") or "better" in text or "not worse" in text, text
