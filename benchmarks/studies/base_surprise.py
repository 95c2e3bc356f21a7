"""The default's harmful positions, each weighted by how little the base model expected the row's token there.

At the final adapter every row is fitted, so a culprit and a clean row of a shape it shares push the weights alike
at the position where both close the object (a dropped field: tiny tickets-drop-small-bpe, BENCHMARKS.md "A dropped
field that leaves another category's shape"). What sets the culprit apart is that the base would not have closed
there: its row teaches something new at that token, the clean row teaches what the base already does. The
activation difference reads this by holding each row against the base's own answer; here it is read from one
forward of the base (the adapter off) over the rows as trained, no generation:

    harm(i) = Σ_s max(0, h_{i,s}) · w_{i,s}        h_{i,s}: position s's part of vᵀ∇L_i (`scores.token_harm`)

    w_{i,s} = 1 − p_base(y_{s+1} | y_≤s)   "miss"      (the base's loss derivative at the token, in [0, 1])
    w_{i,s} = −log p_base(y_{s+1} | y_≤s)  "surprisal"

Positions with no supervised next token (the prompt) keep weight 1 ("…, prompt 1") or 0 ("…, prompt 0"). The
plain sum (w = 1) is the default's harm, recomputed here as a check. Writes each run's harms to
`WORK/<run>/base_surprise.npz`; the activation difference and the length control come from `suite_quality.py`'s
ingredients where it ranked the run.

    python -m benchmarks.studies.base_surprise --work WORK --results R.json RUN_FOLDER ...
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.studies import each_run, ranked_run
from gradian.data.render import IGNORE
from gradian.scenarios.evaluate import auprc

BASELINES = ("activation", "length control", "positions/naive", "part/repsim/sim", "sim/tfidf")


def position_parts(run, direction: list[torch.Tensor]) -> list[tuple[np.ndarray, np.ndarray] | None]:
    """Per trained row (None for a dropped one): ((T,) h_s summed over the LoRA matrices, (T,) p_base of the next
    label at s, NaN where it is not supervised)."""
    from gradian.gradients.extract import trained_logits
    from gradian.scores.token_harm import position_effects

    model, rendered = run.model, run.audit.rendered
    out: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(rendered)
    for positions, batch, h in position_effects(model, rendered, direction, batch_size=run.settings.batch_size):
        labels = batch["labels"]  # (B, T), the first label of each row IGNORE
        kept = (labels[:, 1:] != IGNORE).any(0).nonzero().squeeze(1)  # (K,) positions s whose label s + 1 is trained
        with torch.no_grad(), model.disable_adapter():
            logits, following = trained_logits(model, batch)  # (B, K, V) at those positions, (B, K) their labels
        p_kept = logits.double().log_softmax(-1).gather(-1, following.clamp(min=0).unsqueeze(-1)).squeeze(-1).exp()
        p = torch.full(labels.shape, float("nan"), dtype=torch.float64)  # (B, T): NaN where s predicts no label
        p[:, kept] = torch.where(following != IGNORE, p_kept, torch.full_like(p_kept, float("nan")))
        mask = batch["attention_mask"].bool()
        for b, i in enumerate(positions):
            out[i] = (h[b].double()[mask[b]].cpu().numpy(), p[b][mask[b]].cpu().numpy())
    return out


def weighted(parts: list, weight: str, prompt: float) -> np.ndarray:
    """(N,) Σ_s max(0, h_s) w_s of every row (0 for a dropped row)."""
    harms = np.zeros(len(parts))
    for i, found in enumerate(parts):
        if found is None:
            continue
        h, p = found
        w = {"plain": np.ones_like(p), "miss": 1.0 - p, "surprisal": -np.log(np.clip(p, 1e-30, 1.0))}[weight]
        w = np.where(np.isnan(p), prompt, w)
        harms[i] = float((np.clip(h, 0.0, None) * w).sum())
    return harms


def run_record(folder: Path, work: Path, saved: bool = False) -> dict | None:
    """The run's AUPRC for each weighting, alone and combined with relevance as `--rank combined` combines it, beside
    suite_quality's baselines where it ranked the run; `saved`: the harms this study wrote before, none computed."""
    from gradian.scenarios.evaluate import planted

    if saved:
        if not (work / "base_surprise.npz").exists():
            return None
        truth = json.loads((folder / "truth.json").read_text())
        ids = json.loads((work / "ingredients.json").read_text())["ids"]
        positive, harms, seconds = planted(ids, truth), dict(np.load(work / "base_surprise.npz")), None
    else:
        found = ranked_run(folder, work)
        if found is None:
            return None
        run, truth, positive = found
        harms, seconds = surprise_harms(run)
        np.savez(work / "base_surprise.npz", **harms)
    ingredients = work / "ingredients.npz"
    known = dict(np.load(ingredients)) if ingredients.exists() else {}
    combined = {f"combined, {name}": _combined(known, harm) for name, harm in harms.items()} if known else {}
    return {"run": folder.name, "split": truth["split"], "family": truth["family"], "culprits": int(positive.sum()),
            **{name: auprc(h, positive) for name, h in {**harms, **combined}.items()},
            **{name: auprc(_max(known[name]), positive) for name in BASELINES if name in known},
            "seconds": seconds}


def surprise_harms(run) -> tuple[dict[str, np.ndarray], float]:
    """({weighting: (N,) harm}, seconds of the pass) of a ranked run, along the default query's direction."""
    from benchmarks.harness import suite_quality
    from gradian.scores.pairs import base_kind
    from gradian.scores.query import query_direction

    kind = suite_quality.default_variant().split(" · ")[0]
    started = time.perf_counter()
    direction = query_direction(run.model, run.pairs(kind), base_kind(kind))
    parts = position_parts(run, direction)
    seconds = round(time.perf_counter() - started, 2)
    harms = {"plain": weighted(parts, "plain", 1.0)}
    for weight in ("miss", "surprisal"):
        for prompt in (1.0, 0.0):
            harms[f"{weight}, prompt {prompt:g}"] = weighted(parts, weight, prompt)
    return harms, seconds


def _combined(known: dict[str, np.ndarray], harm: np.ndarray) -> np.ndarray:
    """(N,) `--rank combined`'s score with `harm` as the rows' harm (suite_quality's relevance parts)."""
    from gradian.scores.combine import RELEVANCE_AGGREGATE, combine, relevances_from

    parts = {"tfidf": known["sim/tfidf"], "repsim": known["part/repsim/sim"]}
    effect = known["effect/naive · raw · final"]
    return combine(effect[None, :], relevances_from(parts, RELEVANCE_AGGREGATE), harm=harm).score


def _max(scores: np.ndarray) -> np.ndarray:
    """(N,) a row's score: its largest over the failing queries where there is one per query ((N, Q): the maxes)."""
    return scores.max(axis=1) if scores.ndim == 2 else scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="suite_quality.py's --work folder")
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--saved", action="store_true", help="score the harms a run of this study saved")
    parser.add_argument("folders", type=Path, nargs="+")
    args = parser.parse_args()
    each_run(lambda folder, work: run_record(folder, work, args.saved), args.folders, args.work, args.results)


if __name__ == "__main__":
    main()
