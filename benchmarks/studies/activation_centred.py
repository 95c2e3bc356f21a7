"""The activation difference with each row's difference centred on the mean over rows, on every ranked SmolLM2 run.

`--rank activation` scores a row by cos(d_i, v) (`gradian.scores.activation`). On the max-length runs most rows'
cosines are negative: every d_i shares what fine-tuning on the data teaches in general, and that mean points against
v. This study subtracts the mean d over the scored rows before the cosine and compares the AUPRC of the planted rows
with the plain cosine's, from the runs' kept ingredients (`suite_quality.py --work`: the base's answers are reused,
so each run costs four forward passes).

    python -m benchmarks.studies.activation_centred --work /work/smolq RUN_FOLDER ...

Writes benchmarks/results/smollm2_activation_centred.json and prints one line per run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from unittest import mock

import numpy as np

from benchmarks.harness import suite_quality
from benchmarks.studies import each_run
from gradian.gradients.sides import cosine
from gradian.scenarios.evaluate import auprc, planted
from gradian.scores import activation

RESULTS = Path(__file__).resolve().parents[1] / "results"


def centred_cosines(trained: np.ndarray, own: np.ndarray, direction: np.ndarray) -> np.ndarray:
    """(N,) cos(d_i − mean_j d_j, v): `activation.difference_cosines` with the rows' mean difference taken out."""
    differences = np.asarray(trained, dtype=np.float64) - np.asarray(own, dtype=np.float64)  # (N, d)
    differences -= differences.mean(axis=0, keepdims=True)
    return cosine(differences, np.asarray(direction, dtype=np.float64)[None, :])[:, 0]


def run_record(folder: Path, work: Path) -> dict | None:
    meta = json.loads((work / "ingredients.json").read_text())
    if not meta["attributed"]:
        return None  # refused by the gate: nothing was ranked
    truth = json.loads((folder / "truth.json").read_text())
    run = suite_quality._GradientRun(suite_quality._settings(folder, work), work, suite_quality.Clock())
    with mock.patch.object(activation, "difference_cosines", centred_cosines):
        found = activation.activation_scores(run.model, run.tokenizer, run.audit, run.failing(), work / "activation",
                                             batch_size=run.settings.batch_size)
    with np.load(work / "ingredients.npz") as arrays:
        plain = arrays["activation"]
    positive = planted(meta["ids"], truth)
    return {"run": folder.name, "split": truth["split"], "family": truth["family"],
            "centred": auprc(found.cosine, positive), "plain": auprc(plain, positive)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="suite_quality.py's --work folder")
    parser.add_argument("folders", type=Path, nargs="+")
    args = parser.parse_args()
    each_run(run_record, args.folders, args.work, RESULTS / "smollm2_activation_centred.json")


if __name__ == "__main__":
    main()
