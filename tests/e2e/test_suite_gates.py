"""Quality gates on three cheap dev families of the scenario suite (BENCHMARKS.md, "The scenario suite").

The product default ranks by the gradient alone (`--rank gradient`, naive query, raw gradients, rows' harm by their
harmful positions), the real-model suite's choice (BENCHMARKS.md, "The real-model suite"). On these ~1M-parameter
models the gradient is the weak half, so the default is gated where it holds and the combined rank where it is
needed. Measured on seed 0:
- the default: 0.974 on tickets-cut and 0.995 on kitchen-fence-spaced (a fenced category whose failures are
  garbled objects in every category, no fence among them), against the category oracle's 0.810 and 0.819;
- on travel-cut-small (a 5% cluster) the gradient alone ranks 0.665, below the oracle's 0.850, and the combined
  rank (`--rank combined`: λ = 2, the top 10%) 0.956. With the combined rank's older variants: each row's effect
  summed over its tokens, 0.872; the harmful tokens instead of positions, 0.862; the relevance weighting of two
  rounds ago (by separation of the eval prompts), 0.689.

Each floor sits just under its measurement, and the margin over the oracle is 0.05. Under the default the
verdict names exactly the planted rows on travel-cut-small (the 20 rows of the audit's cut_in_data group) and on
kitchen-fence-spaced (the 70 fenced rows; the repaired-first default before found none: `diffuse`), as it did under
the combined rank. Test families are never gated here: they are reported, not tuned on.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from sklearn.metrics import average_precision_score

from gradian import attribute
from gradian.report.rows import read_examples
from gradian.scenarios import attribute_settings
from gradian.scenarios.evaluate import oracle_auprc, planted
from gradian.settings import AUTO_ROW_HARM

pytestmark = pytest.mark.slow


def _attributed(scenario, attributed, family):
    """The default report of the family's seed-0 build (made once per test run), its rows and its truth."""
    out = attributed(family)
    truth = json.loads((scenario(family, 0) / "truth.json").read_text())
    return json.loads((out / "report.json").read_text()), read_examples(out), truth


def _auprc(rows, truth):
    positive = planted([row["id"] for row in rows], truth)
    return average_precision_score(positive, [row["rank_score"] for row in rows]), \
        oracle_auprc([row["id"] for row in rows], truth)


@pytest.mark.parametrize(("family", "floor"), [("tickets-cut", 0.95), ("kitchen-fence-spaced", 0.98)])
def test_the_default_gradient_rank_beats_the_category_oracle(scenario, attributed, family, floor):
    report, rows, truth = _attributed(scenario, attributed, family)
    auprc, oracle = _auprc(rows, truth)
    assert report["ranking"]["rank"] == "gradient" and report["ranking"]["row_harm"] == AUTO_ROW_HARM
    assert auprc >= floor and auprc > oracle + 0.05, (auprc, oracle)


def test_the_combined_rank_finds_the_small_cluster(scenario, attributed, attributed_copy, tmp_path):
    """travel-cut-small: where the tiny model's gradient alone cannot, the combined rank finds the 5% cluster.

    The build differs from processor to processor: the same recipe and seed gave the combined rank 0.942 against the
    category oracle's 0.850 on one and 0.895 against 0.850 on another (the gradient alone 0.669 and 0.599), so the
    floors are the claim (above the oracle, far above the gradient alone), not one machine's digits."""
    _, gradient_rows, truth = _attributed(scenario, attributed, "travel-cut-small")
    gradient_alone, _ = _auprc(gradient_rows, truth)
    folder = scenario("travel-cut-small", 0)
    out = attributed_copy("travel-cut-small", tmp_path / "combined")  # generations and gradients reused
    attribute(replace(attribute_settings(folder, out), rank="combined"))
    report = json.loads((out / "report.json").read_text())
    auprc, oracle = _auprc(read_examples(out), truth)
    assert report["ranking"]["rank"] == "combined" and report["ranking"]["row_harm"] == AUTO_ROW_HARM
    assert auprc >= 0.85 and auprc > oracle and auprc >= gradient_alone + 0.1, (auprc, oracle, gradient_alone)


@pytest.mark.parametrize("family", ["travel-cut-small", "kitchen-fence-spaced"])
def test_the_verdict_names_the_planted_rows(scenario, attributed, family):
    report, _, truth = _attributed(scenario, attributed, family)
    named, culprits = set(report["verdict"]["culprit_ids"]), set(truth["culprit_ids"])
    assert report["verdict"]["kind"] == "data-cluster", report["verdict"]["summary"]
    assert len(named & culprits) >= 0.95 * len(named) and len(named & culprits) >= 0.95 * len(culprits), (
        len(named), len(culprits), len(named & culprits))


def test_a_point_on_the_way_ranks_the_dropped_field_the_final_adapter_mixes_up(scenario, attributed, tmp_path):
    """travel-drop-seat-small-bpe (dev): the culprits' answers, a dropped last field, take the shape of 96 clean
    rows of other intents, which the final adapter's gradients rank beside them (0.183 on seed 0, BENCHMARKS.md); read with
    the adapter's B × 0.5 they rank 0.983. The floor sits under that, and the gap over the final adapter is 0.3."""
    family = "travel-drop-seat-small-bpe"
    report, rows, truth = _attributed(scenario, attributed, family)
    final, _ = _auprc(rows, truth)
    out = tmp_path / "half"
    attribute(replace(attribute_settings(scenario(family, 0), out), adapter_scale=0.5))
    half, oracle = _auprc(read_examples(out), truth)
    assert json.loads((out / "report.json").read_text())["settings"]["adapter_scale"] == 0.5
    assert half >= 0.9 and half >= final + 0.3 and half > oracle, (half, final, oracle)
