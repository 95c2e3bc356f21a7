"""The default's harmful positions read along the way from the base to the fine-tune: v and every row's harm with
the adapter's B matrices scaled by s in {1, 3/4, 1/2, 1/4, 0} (s = 0: the base model's function, in the adapter's
learned A subspace), on every ranked run of a suite.

At the final adapter every row is fitted, the culprits and the clean rows of a shape they share alike, so their
gradients along the failing answers' direction v differ only by what the context adds. At the base's function a row
the base already answers carries a small gradient, and a row that teaches something new a large one: what the row
pushed the weights toward when training began (TracIn's first checkpoint, without the run saving one).

    harm_s(i) = Σ_t max(0, v_sᵀ ∇ℓ_t(x_i; θ_s))     θ_s: B ← s·B      (N,)

With B = 0 the gradient of every A is 0 and the B gradients carry it. `path` sums the harms at s = 1, 3/4, 1/2 and
1/4, each over its own mean (TracIn over points of the way, where the run saved no checkpoint). Each point costs one
extraction of every row and the queries' backward. Writes each run's harms to `WORK/<run>/base_point.npz`.

    python -m benchmarks.studies.base_point --work WORK --results R.json RUN_FOLDER ...
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import suite_quality
from benchmarks.studies import each_run, ranked_run
from gradian.gradients.point import adapter_point
from gradian.scenarios.evaluate import auprc

SCALES = (1.0, 0.75, 0.5, 0.25, 0.0)


def harms_at(run: suite_quality._GradientRun, scale: float) -> tuple[np.ndarray, float]:
    """((N,) every row's harmful-position harm with B scaled by `scale`, seconds)."""
    from gradian.scores.pairs import base_kind
    from gradian.scores.query import query_direction

    kind = suite_quality.default_variant().split(" · ")[0]
    started = time.perf_counter()
    with adapter_point(run.model, scale):
        direction = query_direction(run.model, run.pairs(kind), base_kind(kind))
        harm = run.extracted_harms(run.model, run.audit.rendered, direction, batch_size=run.settings.batch_size)
    return harm, time.perf_counter() - started


def run_record(folder: Path, work: Path, scales: tuple[float, ...] = SCALES) -> dict | None:
    """The run's AUPRCs at each point; `gradian attribute` runs into `work/attribute` first where it has not."""
    found = ranked_run(folder, work)
    if found is None:
        return None  # refused by the gate, or nothing planted: nothing was ranked
    run, truth, positive = found
    harms, seconds = {}, {}
    for scale in scales:
        harms[f"s={scale:g}"], seconds[f"s={scale:g}"] = harms_at(run, scale)
    path = [h / max(h.mean(), 1e-30) for name, h in harms.items() if name != "s=0"]  # the path's points after 0
    ingredients = work / "ingredients.npz"  # suite_quality's, where it ranked the run
    activation = np.load(ingredients)["activation"] if ingredients.exists() else None
    np.savez(work / "base_point.npz", **harms)
    return {"run": folder.name, "split": truth["split"], "family": truth["family"], "culprits": int(positive.sum()),
            **{name: auprc(h, positive) for name, h in harms.items()}, "path": auprc(sum(path), positive) if len(path) == 4 else None,
            "activation": auprc(activation, positive) if activation is not None else None,
            "seconds": {k: round(v, 2) for k, v in seconds.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="suite_quality.py's --work folder")
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--scales", type=float, nargs="+", default=list(SCALES), help="the points s (default: all)")
    parser.add_argument("folders", type=Path, nargs="+")
    args = parser.parse_args()
    each_run(lambda folder, work: run_record(folder, work, tuple(args.scales)), args.folders, args.work, args.results)


if __name__ == "__main__":
    main()
