"""The combined rank's two constants, λ and the agreement check's top share, measured over the suite's data-cause runs.

    python -m benchmarks.harness.ranking_rule WORK/<family>-seed<n> [...] [--markdown OUT.md]

Each argument is a folder `benchmarks/harness/suite_quality.py` left (its `ingredients.{json,npz}` and `attribute/` report).
For the default gradient variant (`gradian attribute`'s query, raw or unit, final adapter, rows' harm by their
harmful positions or tokens, or summed), every rule below is
computed from the cached effects and relevances (seconds): the gradient alone, relevance counted fully (ungated),
and the agreement-gated rule at λ ∈ {1, 2, 3, 4, 6, 8, 16} × top ∈ {5%, 10%}. Mean culprit AUPRC per split, each
family the mean of its seeds, as `suite_quality.py` averages. The constants are chosen on dev (the highest dev
mean); test is printed beside it and chooses nothing.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from benchmarks.harness import suite_quality
from gradian.scenarios.evaluate import auprc

SCALES = (1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0)
TOPS = (0.05, 0.10)


def rules() -> dict[str, dict | None]:
    """name -> combine() keyword arguments (None: the gradient alone)."""
    from gradian.scores.combine import RELEVANCE_SCALE

    named: dict[str, dict | None] = {"gradient alone": None,
                                     f"ungated (every kind at w = 1), λ = {RELEVANCE_SCALE:g}": {"gated": False}}
    for top in TOPS:
        for scale in SCALES:
            named[f"agreement, top {top:.0%}, λ = {scale:g}"] = {"scale": scale, "top": top}
    return named


def run_scores(work: Path) -> tuple[str, str, dict[str, float]] | None:
    """(split, family, rule name -> AUPRC) of one suite run, or None when it was not attributed."""
    from gradian.scores.combine import RELEVANCE_AGGREGATE, combine, relevances_from

    meta = json.loads((work / "ingredients.json").read_text()) | suite_quality._report_facts(work / "attribute")
    if not meta["attributed"]:
        return None
    truth = json.loads((Path(meta["folder"]) / "truth.json").read_text())
    effect_key, harm_key = suite_quality.variant_arrays(suite_quality.default_variant())
    with np.load(work / "ingredients.npz") as stored:
        effect = stored[effect_key]  # (N,)
        harm = stored[harm_key] if harm_key is not None else None  # (N,) the harmful part
        parts = {"tfidf": stored["sim/tfidf"], "repsim": stored["part/repsim/sim"]}
    positive = np.isin(meta["ids"], truth["culprit_ids"])
    relevances = relevances_from(parts, RELEVANCE_AGGREGATE)
    scores = {name: (-effect if harm is None else harm) if kwargs is None
              else combine(effect[None, :], relevances, harm=harm, **kwargs).score for name, kwargs in rules().items()}
    return meta["split"], meta["family"], {name: auprc(s, positive) for name, s in scores.items()}


def table(works: Sequence[Path]) -> str:
    runs: dict[tuple[str, str], list[dict[str, float]]] = defaultdict(list)
    for work in works:
        got = run_scores(work)
        if got is not None:
            runs[got[:2]].append(got[2])
    means = {split: {name: float(np.mean([np.mean([r[name] for r in rs]) for (s, _), rs in runs.items() if s == split]))
                     for name in rules()} for split in ("dev", "test")}
    best = max((n for n in rules() if n.startswith("agreement")), key=lambda n: means["dev"][n])
    lines = ["| rule | dev: mean AUPRC | test: mean AUPRC |", "|---|---|---|"]
    lines += [f"| {name}{' **(chosen)**' if name == best else ''} | {means['dev'][name]:.3f} | {means['test'][name]:.3f} |"
              for name in rules()]
    seeds = sorted({len(rs) for rs in runs.values()})
    return "\n".join(lines) + f"\n\nFamilies: {len(runs)} ({seeds} seeds each). Chosen on dev: {best}.\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("works", nargs="+", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    text = table(args.works)
    if args.markdown:
        args.markdown.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
