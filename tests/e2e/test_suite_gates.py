"""Quality gates on three cheap dev families of the scenario suite (BENCHMARKS.md, "The scenario suite").

Measured there on seed 0 with the defaults (naive query, raw gradients, combined rank with λ = 2 and the top 10%,
rows' harm by their harmful positions): combined AUPRC 0.999 on tickets-cut, 0.914 on travel-cut-small (a 5%
cluster) and 0.999 on kitchen-fence-spaced (a fenced category whose failures are garbled objects in every
category, no fence among them), against the category oracle's 0.810, 0.850 and 0.819. Each floor sits just under
its measurement and fails what came before: with each row's effect summed over its tokens kitchen-fence-spaced
reaches 0.969 (its fenced rows' JSON bodies pay back their fences) and travel-cut-small 0.872; with the harmful
tokens instead of positions travel-cut-small reaches 0.862, with the weighting of relevance two rounds ago (by
separation of the eval prompts) 0.689, and the gradient alone 0.599. The margin over the oracle is 0.05: with
today's constants travel-cut-small beats the oracle by 0.064 (0.090 at last round's λ = 3, top 5%). On
travel-cut-small the verdict names exactly the 20 planted rows from the audit's cut_in_data group; on
kitchen-fence-spaced exactly the 70 fenced rows (the repaired-first default before it found none: `diffuse`). Test
families are never gated here: they are reported, not tuned on.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.metrics import average_precision_score

from gradian.report.rows import read_examples
from gradian.scenarios.evaluate import oracle_auprc
from gradian.settings import AUTO_ROW_HARM

pytestmark = pytest.mark.slow


def _attributed(scenario, attributed, family):
    """The default report of the family's seed-0 build (made once per test run), its rows and its truth."""
    out = attributed(family)
    truth = json.loads((scenario(family, 0) / "truth.json").read_text())
    return json.loads((out / "report.json").read_text()), read_examples(out), truth


@pytest.mark.parametrize(("family", "floor"), [("tickets-cut", 0.95), ("travel-cut-small", 0.90),
                                               ("kitchen-fence-spaced", 0.98)])
def test_combined_rank_beats_the_category_oracle(scenario, attributed, family, floor):
    report, rows, truth = _attributed(scenario, attributed, family)
    positive = np.array([row["id"] in set(truth["culprit_ids"]) for row in rows])
    auprc = average_precision_score(positive, [row["rank_score"] for row in rows])
    oracle = oracle_auprc([row["id"] for row in rows], truth)
    assert report["ranking"]["rank"] == "combined" and report["ranking"]["row_harm"] == AUTO_ROW_HARM
    assert auprc >= floor and auprc > oracle + 0.05, (auprc, oracle)


@pytest.mark.parametrize("family", ["travel-cut-small", "kitchen-fence-spaced"])
def test_the_verdict_names_the_planted_rows(scenario, attributed, family):
    report, _, truth = _attributed(scenario, attributed, family)
    named, planted = set(report["verdict"]["culprit_ids"]), set(truth["culprit_ids"])
    assert report["verdict"]["kind"] == "data-cluster", report["verdict"]["summary"]
    assert len(named & planted) >= 0.95 * len(named) and len(named & planted) >= 0.95 * len(planted), (
        len(named), len(planted), len(named & planted))
