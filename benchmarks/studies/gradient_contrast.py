"""The default's harmful positions contrasted with the base's own answers: a row's harm minus the harm of the base
model's answer to the same prompt, on every ranked run of a suite.

The default ranks row i by h(c_i), the harm along the failing answers' direction v of its completion c_i as trained
(`gradients.sides.position_harms_of`). Where the culprits' answers leave another category's shape (a dropped last
field), that category's clean rows teach the same closing tokens and rank beside them. The activation difference
does not mix them up: it scores what a row teaches beyond the base's own answer b_i. This study asks whether the
gradients do as well when read the same way:

    contrast_i = h(x_i, c_i) − h(x_i, b_i)     (N,)  both at the final adapter, along the same v

A clean row whose completion the base already gives has contrast 0; a culprit keeps its harm, less whatever harm
the base's answer carries. A row with no answer to compare (no prompt, nothing supervised) keeps h(c_i). The base's
answers are those `--rank activation` generated into `suite_quality.py --work` (reused); the cost is one more
extraction of every row, on the base's answers (generated here where no `--rank activation` left them). A run
`suite_quality.py` has not ranked is attributed first, as it would attribute it.

    python -m benchmarks.studies.gradient_contrast --work WORK --results R.json RUN_FOLDER ...

Prints one line per run, AUPRC of the planted rows for the default, the contrast and the activation difference.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import suite_quality
from benchmarks.studies import each_run, ranked_run
from gradian.data.render import IGNORE, Rendered
from gradian.scenarios.evaluate import auprc


def base_rendered(run: suite_quality._GradientRun) -> tuple[list[int], list[Rendered]]:
    """(the answerable rows, each one's prompt with the base's own answer as its supervised completion)."""
    from gradian.scores.activation import own_answers

    own = own_answers(run.model, run.tokenizer, run.audit, run.work / "activation",
                      batch_size=run.settings.batch_size)  # as the numbers in BENCHMARKS.md were generated
    rendered = [Rendered(run.audit.rendered[i].example_id, list(p) + list(a.ids), [IGNORE] * len(p) + list(a.ids),
                         len(p) + len(a.ids), len(p))
                for i, p, a in zip(own.rows, own.prompts, own.answers, strict=True)]
    return own.rows, rendered


def contrast_harms(run: suite_quality._GradientRun) -> tuple[np.ndarray, np.ndarray, float]:
    """((N,) the default's harm of each row, (N,) its contrast with the base's answer, the contrast's seconds)."""
    from gradian.scores.pairs import base_kind
    from gradian.scores.query import query_direction

    kind = suite_quality.default_variant().split(" · ")[0]
    direction = query_direction(run.model, run.pairs(kind), base_kind(kind))
    batch = run.settings.batch_size
    harm = run.extracted_harms(run.model, run.audit.rendered, direction, batch_size=batch)  # (N,)
    started = time.perf_counter()
    rows, rendered = base_rendered(run)
    contrast = harm.copy()
    contrast[rows] -= run.extracted_harms(run.model, rendered, direction, batch_size=batch)
    return harm, contrast, time.perf_counter() - started


def run_record(folder: Path, work: Path) -> dict | None:
    """The run's AUPRCs; `gradian attribute` runs into `work/attribute` first where `suite_quality.py` has not."""
    found = ranked_run(folder, work)
    if found is None:
        return None  # refused by the gate, or nothing planted: nothing was ranked
    run, truth, positive = found
    harm, contrast, seconds = contrast_harms(run)
    ingredients = work / "ingredients.npz"  # suite_quality's, where it ranked the run
    activation = np.load(ingredients)["activation"] if ingredients.exists() else None
    return {"run": folder.name, "split": truth["split"], "family": truth["family"], "culprits": int(positive.sum()),
            "default": auprc(harm, positive), "contrast": auprc(contrast, positive),
            "activation": auprc(activation, positive) if activation is not None else None,
            "contrast_seconds": round(seconds, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="suite_quality.py's --work folder")
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("folders", type=Path, nargs="+")
    args = parser.parse_args()
    each_run(run_record, args.folders, args.work, args.results)


if __name__ == "__main__":
    main()
