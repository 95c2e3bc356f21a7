"""Culprit recovery of every ranking method on built scenario folders, per family and split.

    python benchmarks/suite_quality.py FOLDER [FOLDER ...] --work DIR [--results R.json] [--markdown R.md]

Each FOLDER is a built scenario (`base/`, `run/`, `train.jsonl`, `eval.jsonl`, `truth.json` with at least
`scenario`, `kind`, `culprit_ids`, `category_ids`, `seed`; the suite adds `family`, `split`, `domain`, `capability`
and, for a two-cause run, `causes: [{cause, culprit_ids, category}]`). Per folder, in `DIR/<folder name>/`:

1. `gradian attribute --rank combined` once, with the defaults otherwise (its verdict, clusters and culprits; its
   generations are what every method below explains);
2. the training gradients of the final adapter, extracted once into the folder's own store and timed; TracIn-CP's
   per-checkpoint stores likewise, the first time a query needs them; every query kind reuses them;
3. methods, each a score per training row (higher = more suspect): random, the category oracle, TF-IDF, BM25 and
   RepSim (each row's max and mean over the failing queries), the gradient alone (the default query), the
   combined rank (`gradian.scores.combine`), and on top of it every query kind × raw or unit-normalised training
   gradients × the final adapter or TracIn-CP, each alone and combined.

Metrics per method: AUPRC (planted culprits positive), P@k (k = number of culprits), planted cluster ranked first
(attribute's clusters, ranked by the sum of the method's positive robust z-scores), and per cause of a two-cause
run whether it is named (at least half its culprits in the top k). Cost: backward passes over training rows, and
wall time ÷ the run's training time per epoch (`train_runtime` ÷ epochs of `trainer_state.json`), generation
excluded. What every method is computed from is kept in `DIR/<folder name>/ingredients.{json,npz}`: a rerun
reads it back and recomputes only the methods and metrics (so a change to the combination rule costs seconds);
a cost whose store was already there when timed is marked `fresh: false` in the record.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.metrics import average_precision_score

QUERY_KINDS = ("naive", "contrastive", "contrastive-first", "repaired", "repaired-first")
MAIN_METHODS = ("random", "category oracle", "TF-IDF (max)", "TF-IDF (mean)", "BM25 (max)", "BM25 (mean)",
                "RepSim (max)", "RepSim (mean)", "gradient (default)", "combined (default)",
                "combined (max relevance)", "combined (mean relevance)", "combined, ungated")


# ---- metrics (tests/test_suite_quality.py) ----

def auprc(scores: np.ndarray, positive: np.ndarray) -> float:
    """Average precision (scikit-learn's), the planted culprits positive, higher scores more suspect."""
    positive = np.asarray(positive, dtype=bool)
    if not positive.any():
        raise ValueError("no positive rows")
    return float(average_precision_score(positive, np.asarray(scores, dtype=np.float64)))


def precision_at_k(scores: np.ndarray, positive: np.ndarray, k: int | None = None) -> float:
    """Share of culprits among the k highest scores (k = number of culprits by default; ties in index order)."""
    positive = np.asarray(positive, dtype=bool)
    k = int(positive.sum()) if k is None else k
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    return float(positive[order[:k]].mean()) if k else float("nan")


def cluster_first(scores: np.ndarray, labels: np.ndarray, positive: np.ndarray) -> bool | None:
    """The cluster holding most culprits is the one with the largest sum of positive robust z-scores."""
    from gradian.scores.combine import robust_z

    labels, positive = np.asarray(labels), np.asarray(positive, dtype=bool)
    clusters = np.unique(labels)
    if len(clusters) == 0:
        return None
    harm = np.maximum(robust_z(scores)[0], 0.0)
    planted = max(clusters, key=lambda c: (positive & (labels == c)).sum())
    return bool(planted == max(clusters, key=lambda c: harm[labels == c].sum()))


def causes_named(scores: np.ndarray, ids: Sequence[str], causes: list[dict], k: int) -> list[bool]:
    """Per cause: at least half of its culprits rank among the k highest scores."""
    top = {ids[i] for i in np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")[:k]}
    return [len(top & set(c["culprit_ids"])) >= 0.5 * len(c["culprit_ids"]) for c in causes]


def epoch_seconds(run: Path) -> float | None:
    """The run's training wall time per epoch, from trainer_state.json's `train_runtime` and epochs."""
    try:
        state = json.loads((run / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return None
    runtime = next((row["train_runtime"] for row in reversed(state.get("log_history", [])) if "train_runtime" in row),
                   None)
    epochs = state.get("epoch") or state.get("num_train_epochs")
    return float(runtime) / float(epochs) if runtime and epochs else None


# ---- one folder: the ingredients (cached), then the methods and their metrics ----

class Clock:
    """Seconds spent per named piece of work."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def timed(self, name: str, call, *args, **kwargs):
        start = time.perf_counter()
        result = call(*args, **kwargs)
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
        return result


def _fresh(store_dir: Path) -> bool:
    """No complete store there yet: the extraction about to run is timed for real."""
    from gradian.gradients.store import FeatureStore

    try:
        return not FeatureStore(store_dir).complete
    except Exception:
        return True


def ingredients(folder: Path, work: Path, kinds: Sequence[str] = QUERY_KINDS) -> tuple[dict[str, Any],
                                                                                     dict[str, np.ndarray]]:
    """What every method is computed from, kept in WORK (`ingredients.json`, `ingredients.npz`) for reruns:
    attribute's report facts, each gradient variant's (N,) mean effect, the relevance matrices, and timings."""
    from gradian.attribute import attribute, base_kind, query_pairs
    from gradian.audit import diagnose
    from gradian.gradients.energy import share_budget
    from gradian.gradients.extract import GradientSettings, extract_train_features
    from gradian.regression.capabilities import get_capability
    from gradian.regression.loading import load_models
    from gradian.regression.measure import measure_regression
    from gradian.scores import relevance as rel
    from gradian.scores.combine import relevance_parts
    from gradian.scores.queries import query_features
    from gradian.scores.scoring import score
    from gradian.scores.tracin import checkpoint_weights, tracin_cp_effects
    from gradian.settings import AttributeSettings

    truth = json.loads((folder / "truth.json").read_text())
    out = work / "attribute"
    settings = AttributeSettings(
        base_model=str(folder / "base"), adapter=str(folder / "run"), run=str(folder / "run"),
        dataset=str(folder / "train.jsonl"), eval_dataset=str(folder / "eval.jsonl"),
        capability=truth.get("capability", "json_formatting"), out=str(out), rank="combined")
    clock = Clock()
    fresh = {"attribute": not (out / "report.json").exists(), "final": _fresh(work / "gradients")}
    report = clock.timed("attribute", lambda: attribute(settings).report)
    meta: dict[str, Any] = {
        "folder": str(folder), "scenario": truth["scenario"], "family": truth.get("family", truth["scenario"]),
        "split": truth.get("split", "unsplit"), "domain": truth.get("domain"), "seed": truth["seed"],
        "kind": truth["kind"], "verdict": report["verdict"]["kind"], "epoch_seconds": epoch_seconds(folder / "run"),
        "n_culprits": len(truth["culprit_ids"]), "ranking_checks": report.get("ranking", {}).get("checks"),
        "ids": [row["id"] for row in report["examples"]], "labels": [row["cluster"] for row in report["examples"]],
        "verdict_culprits": report["verdict"]["culprit_ids"], "query": settings.query,
        "attributed": bool(truth["culprit_ids"] and report["clusters"]),
    }
    arrays: dict[str, np.ndarray] = {}
    if not meta["attributed"]:
        return {**meta, "seconds": clock.seconds, "fresh": fresh}, arrays

    audit = diagnose(settings.dataset, base_model=settings.base_model, eval_dataset=settings.eval_dataset,
                     run=settings.run)
    model, tokenizer = load_models(audit.base_ref, settings.adapter, device="cpu")
    capability = get_capability(settings.capability)
    regression = measure_regression(model, tokenizer, audit.eval_examples, capability, audit.setup, out)  # cached
    gradient = GradientSettings(proj_dim=GradientSettings().proj_dim, seed=settings.seed, batch_size=settings.batch_size)
    gradient, _ = share_budget(model, audit.rendered, gradient, settings.proj_budget,  # as attribute shares it
                               cache=out / "projection-shares.json")
    store = clock.timed("extract final", extract_train_features, model, audit.rendered, work / "gradients",
                        settings=gradient)
    checkpoints = checkpoint_weights(settings.run) if audit.run is not None and audit.run.checkpoints else []
    fresh["tracin"] = _fresh(work / "gradients-checkpoints" / f"checkpoint-{checkpoints[0].step}") if checkpoints \
        else False
    for kind in kinds:
        pairs = query_pairs(regression, capability, audit.eval_examples, tokenizer, audit.setup, kind, model)
        q = clock.timed(f"query {kind}", query_features, model, pairs, kind=base_kind(kind), settings=gradient)
        for unit in (True, False):
            norm = "unit" if unit else "raw"
            arrays[f"effect/{kind} · {norm} · final"] = clock.timed(
                f"score {kind} {norm}", score, store, q, unit_norm_train=unit).mean(axis=0)
            if checkpoints:
                arrays[f"effect/{kind} · {norm} · TracIn-CP"] = clock.timed(
                    f"tracin {kind} {norm}", tracin_cp_effects, model, audit.rendered, pairs, checkpoints,
                    work / "gradients-checkpoints", settings=gradient, kind=base_kind(kind), unit_norm_train=unit,
                    final_store=store).mean(axis=0)
    meta["tracin_extractions"] = len(list((work / "gradients-checkpoints").glob("checkpoint-*")))
    arrays["effect/default"] = np.load(out / "scores.npy").mean(axis=0)  # attribute's own (the default query)

    query_ids = report["run"]["queries"]
    failing_prompts = [row.prompt for row in regression.rows if row.id in set(query_ids)]
    texts = [e.text for e in audit.examples]
    arrays["sim/tfidf"] = clock.timed("tfidf", rel.tfidf_similarity, texts, failing_prompts)
    arrays["sim/bm25"] = clock.timed("bm25", rel.bm25_scores, texts, failing_prompts)
    parts = clock.timed("repsim", relevance_parts, model, audit.examples, audit.rendered, regression.rows, query_ids,
                        batch_size=settings.batch_size)
    for kind, (sim, vectors, failing) in parts.items():
        arrays[f"part/{kind}/sim"], arrays[f"part/{kind}/eval"], arrays[f"part/{kind}/failing"] = sim, vectors, failing
    meta["categories"] = [e.raw.get("category") if isinstance(e.raw, dict) else None for e in audit.examples]
    meta["default_tracin"] = bool((report["run"].get("tracin_cp") or {}).get("checkpoints"))
    meta["unit_norm_train"] = settings.unit_norm_train
    return {**meta, "seconds": clock.seconds, "fresh": fresh}, arrays


def methods_of(meta: dict[str, Any], arrays: dict[str, np.ndarray], truth: dict[str, Any]) -> dict[str, tuple]:
    """name -> ((N,) score, higher = more suspect; cost) for every method, from the ingredients."""
    from gradian.scores import relevance as rel
    from gradian.scores.combine import RELEVANCE_AGGREGATE, combine, relevances_from

    n_rows, seconds = len(meta["ids"]), meta["seconds"]
    parts = {kind: (arrays[f"part/{kind}/sim"], arrays[f"part/{kind}/eval"], arrays[f"part/{kind}/failing"])
             for kind in ("tfidf", "repsim")}

    def relevance(how: str):
        return relevances_from(parts, how)

    free = {"backward_rows": 0, "forward_rows": 0, "seconds": 0.0}
    methods: dict[str, tuple] = {
        "random": (rel.random_scores(n_rows, truth["seed"]), free),
        "category oracle": (rel.category_oracle(meta["ids"], truth, truth["seed"], meta["categories"]), free),
    }
    for how in ("max", "mean"):
        methods[f"TF-IDF ({how})"] = (rel.aggregate(arrays["sim/tfidf"], how), {**free, "seconds": seconds["tfidf"]})
        methods[f"BM25 ({how})"] = (rel.aggregate(arrays["sim/bm25"], how), {**free, "seconds": seconds["bm25"]})
        methods[f"RepSim ({how})"] = (rel.aggregate(parts["repsim"][0], how),
                                      {**free, "forward_rows": n_rows, "seconds": seconds["repsim"]})
    first_tracin = next((name for name in seconds if name.startswith("tracin ")), "")  # it extracted the stores
    gradients = {}
    for key in (k for k in arrays if k.startswith("effect/") and k != "effect/default"):
        name = key.removeprefix("effect/")
        kind, norm, where = name.split(" · ")
        if where == "final":
            cost = {"backward_rows": n_rows, "forward_rows": 0, "seconds": seconds["extract final"]
                    + seconds[f"query {kind}"] + seconds[f"score {kind} {norm}"]}
        else:
            own = f"tracin {kind} {norm}"
            cost = {"backward_rows": n_rows * (1 + meta["tracin_extractions"]), "forward_rows": 0,
                    "seconds": seconds["extract final"] + seconds[first_tracin]
                    + (seconds[own] if own != first_tracin else 0.0)}
        gradients[name] = (arrays[key], cost)
    default = f"{meta['query']} · {'unit' if meta['unit_norm_train'] else 'raw'} · " \
              f"{'TracIn-CP' if meta['default_tracin'] else 'final'}"
    default_cost = gradients[default][1] if default in gradients else {**free, "seconds": float("nan")}

    def plus_relevance(cost):
        return {**cost, "forward_rows": n_rows, "seconds": cost["seconds"] + seconds["repsim"]}

    effect = arrays["effect/default"][None, :]
    methods["gradient (default)"] = (-effect[0], default_cost)
    other = next(how for how in ("max", "mean") if how != RELEVANCE_AGGREGATE)
    methods["combined (default)"] = (combine(effect, relevance(RELEVANCE_AGGREGATE)).score,
                                     plus_relevance(default_cost))
    methods[f"combined ({other} relevance)"] = (combine(effect, relevance(other)).score, plus_relevance(default_cost))
    methods["combined, ungated"] = (combine(effect, relevance(RELEVANCE_AGGREGATE), gated=False).score,
                                    plus_relevance(default_cost))
    for name, (mean_effect, cost) in gradients.items():
        methods[f"gradient · {name}"] = (-mean_effect, cost)
        methods[f"combined · {name}"] = (combine(mean_effect[None, :], relevance(RELEVANCE_AGGREGATE)).score,
                                         plus_relevance(cost))
    return methods


def evaluate(meta: dict[str, Any], arrays: dict[str, np.ndarray], truth: dict[str, Any]) -> dict[str, Any]:
    """The folder's record: its facts and every method's metrics and cost."""
    record = {k: v for k, v in meta.items() if k not in ("ids", "labels", "categories", "verdict_culprits")}
    causes = truth.get("causes") or []
    named = set(meta["verdict_culprits"])
    record["verdict_causes_named"] = [len(named & set(c["culprit_ids"])) >= 0.5 * len(c["culprit_ids"])
                                      for c in causes]
    if not meta["attributed"]:
        return {**record, "methods": {}}
    ids = meta["ids"]
    positive = np.array([i in set(truth["culprit_ids"]) for i in ids])
    labels, k, per_epoch = np.array(meta["labels"]), int(positive.sum()), meta["epoch_seconds"]
    record["methods"] = {
        name: {"auprc": auprc(s, positive), "precision_at_k": precision_at_k(s, positive, k),
               "cluster_first": cluster_first(s, labels, positive), "causes_named": causes_named(s, ids, causes, k),
               **cost, "epochs_worth": cost["seconds"] / per_epoch if per_epoch else None}
        for name, (s, cost) in methods_of(meta, arrays, truth).items()
    }
    return record


def folder_record(folder: Path, work: Path, kinds: Sequence[str] = QUERY_KINDS) -> dict[str, Any]:
    """Ingredients from WORK when a run already left them, else computed (and kept); then evaluated."""
    truth = json.loads((folder / "truth.json").read_text())
    meta_path, arrays_path = work / "ingredients.json", work / "ingredients.npz"
    if meta_path.exists() and arrays_path.exists():
        meta = json.loads(meta_path.read_text())
        with np.load(arrays_path) as stored:
            arrays = {key: stored[key] for key in stored.files}
    else:
        work.mkdir(parents=True, exist_ok=True)
        meta, arrays = ingredients(folder, work, kinds)
        np.savez(arrays_path, **arrays)
        meta_path.write_text(json.dumps(meta, indent=1, default=float))
    return evaluate(meta, arrays, truth)


# ---- tables ----

def summary(groups: dict[tuple[str, str], list[dict]]) -> list[str]:
    """Per split, the main methods' AUPRC per family (mean over seeds), side by side."""
    lines = []
    for split in sorted({split for split, _ in groups}):
        families = [(f, rows) for (s, f), rows in sorted(groups.items())
                    if s == split and any(r["methods"] for r in rows)]
        if not families:
            continue
        lines += [f"### Summary, {split}: AUPRC per family (mean over seeds)", "",
                  "| method | " + " | ".join(f for f, _ in families) + " |", "|---|" + "---|" * len(families)]
        for name in MAIN_METHODS:
            cells = [np.mean([r["methods"][name]["auprc"] for r in rows if name in r.get("methods", {})] or [np.nan])
                     for _, rows in families]
            if np.all(np.isnan(cells)):
                continue
            lines.append(f"| {name} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
        lines.append("")
    return lines


def markdown(records: list[dict[str, Any]]) -> str:
    """One table per family and split: every method's mean AUPRC, P@k, cluster-first and causes named, and cost."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for record in records:
        groups.setdefault((record["split"], record["family"]), []).append(record)
    lines = ["÷ epoch: the method's wall time (generation excluded) over the run's own training time per epoch, "
             "both on the machine that ran them; a store already extracted when timed is marked in the JSON "
             "(`fresh`).", "", *summary(groups)]
    for (split, family), rows in sorted(groups.items()):
        scored = [r for r in rows if r["methods"]]
        seeds = sorted(r["seed"] for r in rows)
        verdicts = ", ".join(f"{r['verdict']}" for r in sorted(rows, key=lambda r: r["seed"]))
        lines += [f"### {family} ({split}; seeds {seeds}; verdicts {verdicts})", "",
                  "| method | AUPRC | P@k | planted cluster first | causes named | backward rows | forward rows | "
                  "÷ epoch |", "|---|---|---|---|---|---|---|---|"]
        names = list(dict.fromkeys(n for r in scored for n in r["methods"]))
        for name in sorted(names, key=lambda n: (n not in MAIN_METHODS, MAIN_METHODS.index(n) if n in MAIN_METHODS
                                                 else 0, n)):
            picked = [r["methods"][name] for r in scored if name in r["methods"]]
            firsts = [m["cluster_first"] for m in picked if m["cluster_first"] is not None]
            named = [c for m in picked for c in m["causes_named"]]
            worth = [m["epochs_worth"] for m in picked if m["epochs_worth"] is not None]
            lines.append(
                f"| {name} | {np.mean([m['auprc'] for m in picked]):.3f} | "
                f"{np.mean([m['precision_at_k'] for m in picked]):.3f} | {sum(firsts)}/{len(firsts)} | "
                f"{f'{sum(named)}/{len(named)}' if named else '–'} | "
                f"{np.mean([m['backward_rows'] for m in picked]):.0f} | "
                f"{np.mean([m['forward_rows'] for m in picked]):.0f} | "
                f"{f'{np.mean(worth):.1f}' if worth else '–'} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--work", type=Path, required=True, help="one sub-folder per scenario folder, resumable")
    parser.add_argument("--results", type=Path, help="JSON of every record (default: WORK/results.json)")
    parser.add_argument("--markdown", type=Path, help="the tables (default: WORK/results.md)")
    parser.add_argument("--kinds", nargs="+", default=list(QUERY_KINDS), choices=QUERY_KINDS,
                        help="query kinds of the variants (each raw and unit, final adapter and TracIn-CP)")
    args = parser.parse_args(argv)
    records = []
    for folder in args.folders:
        record = folder_record(folder.resolve(), args.work / folder.resolve().name, args.kinds)
        print(json.dumps({k: record[k] for k in ("scenario", "seed", "verdict")} | {
            "combined": record["methods"].get("combined (default)", {}).get("auprc"),
            "gradient": record["methods"].get("gradient (default)", {}).get("auprc")}), flush=True)
        records.append(record)
    (args.results or args.work / "results.json").write_text(json.dumps(records, indent=1, default=float))
    (args.markdown or args.work / "results.md").write_text(markdown(records) + "\n")
    print(markdown(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
