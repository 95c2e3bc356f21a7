"""Culprit recovery of every ranking method on built scenario folders, per family and split.

    python -m benchmarks.harness.suite_quality FOLDER [FOLDER ...] --work DIR [--results R.json] [--markdown R.md]

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
   gradients × the final adapter or TracIn-CP, each alone and combined; on the final adapter's raw gradients also
   each kind with rows ranked by their harmful positions (`· positions`, from the extraction's own backward as
   `gradian attribute` takes them, with RepSim from its forward: `extract_train_features(direction=,
   representations=)`, timed as a whole extraction) and by their harmful tokens (`· tokens`,
   `gradian.scores.token_harm.row_harms`, one more forward-mode pass);
4. without gradients: `--rank activation` (`gradian.scores.activation`), the same read from where each pair of
   answers departs (`activation (from departure)`, `activation_scores(from_departure=True)`), and its answer-length
   control (`baselines.length_control`, the same difference of differences with the answer's token length as its one
   feature), both reading the base's own answers to the training prompts, generated once into
   `DIR/<folder name>/activation/` (their cost counts that generation); and `gradient + activation`, the default
   gradient ranking's robust z plus the activation cosine's (the cost of both).

Metrics per method: AUPRC (planted culprits positive), P@k (k = number of culprits), planted cluster ranked first
(attribute's clusters, ranked by the sum of the method's positive robust z-scores), and per cause of a two-cause
run whether it is named (at least half its culprits in the top k). Cost: passes over training rows (backward,
forward-mode, plain forward), and
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
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import bergson_baseline, jobs
from gradian.scenarios.evaluate import auprc, planted  # the one AUPRC, the library's

QUERY_KINDS = ("naive", "contrastive", "contrastive-first", "repaired", "repaired-first", "departure", "departure-first")
HARM_ARRAYS = {"positions": "positions/{kind}", "tokens": "harm/{kind}"}  # `· <harm>` variant -> its rows' harm
DEPARTED = "activation (from departure)"  # the activation difference averaged from where the answers depart
MAIN_METHODS = ("random", "category oracle", "TF-IDF (max)", "TF-IDF (mean)", "BM25 (max)", "BM25 (mean)",
                "RepSim (max)", "RepSim (mean)", "gradient (row sum)", "combined (row sum)", "gradient (tokens)",
                "combined (tokens)", "gradient (default)",
                "combined (default)",
                "combined (max relevance)", "combined (mean relevance)", "combined, ungated", "activation",
                DEPARTED, "gradient + activation", "length control", "bergson")


# ---- metrics (tests/test_suite_quality.py) ----

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
    most = max(clusters, key=lambda c: (positive & (labels == c)).sum())
    return bool(most == max(clusters, key=lambda c: harm[labels == c].sum()))


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
    from benchmarks.harness.baselines import bm25_scores
    from gradian import attribute
    from gradian.scores import relevance as rel
    from gradian.scores.combine import repsim_relevance

    truth = json.loads((folder / "truth.json").read_text())
    settings = _settings(folder, work)
    out = Path(settings.out)
    clock = Clock()
    fresh = {"attribute": not (out / "report.json").exists(), "final": _fresh(work / "gradients")}
    report = clock.timed("attribute", lambda: attribute(settings).report)
    meta: dict[str, Any] = {
        "folder": str(folder), "scenario": truth["scenario"], "family": truth.get("family", truth["scenario"]),
        "split": truth.get("split", "unsplit"), "domain": truth.get("domain"), "seed": truth["seed"],
        "kind": truth["kind"], "epoch_seconds": epoch_seconds(folder / "run"), "n_culprits": len(truth["culprit_ids"]),
        "ranking_checks": report.get("ranking", {}).get("checks"),
        "attributed": bool(truth["culprit_ids"] and report["clusters"]), **_report_facts(out),
    }
    arrays: dict[str, np.ndarray] = {}
    if not meta["attributed"]:
        return {**meta, "seconds": clock.seconds, "fresh": fresh}, arrays

    run = _GradientRun(settings, work, clock)
    fresh["tracin"] = run.fresh_tracin
    run.effects(kinds, arrays)
    run.row_harms(kinds, arrays)
    meta["tracin_extractions"] = len(list((work / "gradients-checkpoints").glob("checkpoint-*")))

    query_ids = report["run"]["queries"]
    queries = [row for row in run.regression.rows if row.id in set(query_ids)]
    failing_prompts = [row.prompt for row in queries]
    texts = [e.text for e in run.audit.examples]
    arrays["sim/tfidf"] = clock.timed("tfidf", rel.tfidf_similarity, texts, failing_prompts)
    arrays["sim/bm25"] = clock.timed("bm25", bm25_scores, texts, failing_prompts)
    arrays["part/repsim/sim"] = clock.timed("repsim", repsim_relevance, run.model, run.audit.rendered, queries,
                                            batch_size=settings.batch_size)  # with sim/tfidf: relevance_parts
    run.without_gradients(queries, arrays)
    run.bergson(arrays)
    meta["categories"] = [e.raw.get("category") if isinstance(e.raw, dict) else None for e in run.audit.examples]
    return {**meta, "seconds": clock.seconds, "fresh": fresh}, arrays


def _settings(folder: Path, work: Path):
    from gradian.scenarios import attribute_settings

    return attribute_settings(folder, work / "attribute", rank="combined")


class _GradientRun:
    """The run's model, audit, regression (attribute's cache) and gradient stores, for the query-kind variants."""

    def __init__(self, settings: Any, work: Path, clock: Clock) -> None:
        from gradian.audit import diagnose
        from gradian.capabilities import get_capability
        from gradian.gradients.energy import share_budget
        from gradian.gradients.extract import GradientSettings
        from gradian.regression.loading import load_models
        from gradian.regression.measure import measure_regression
        from gradian.scores.tracin import checkpoint_weights

        out = Path(settings.out)
        self.work, self.clock, self.settings = work, clock, settings
        self.audit = diagnose(settings.dataset, base_model=settings.base_model, eval_dataset=settings.eval_dataset,
                              run=settings.run)
        self.model, self.tokenizer = load_models(self.audit.base_ref, settings.adapter, device="cpu")
        self.capability = get_capability(settings.capability)
        self.regression = measure_regression(self.model, self.tokenizer, self.audit.eval_examples, self.capability,
                                             self.audit.setup, out)  # cached
        gradient = GradientSettings(proj_dim=GradientSettings().proj_dim, seed=settings.seed,
                                    batch_size=settings.batch_size)
        self.gradient, _ = share_budget(self.model, self.audit.rendered, gradient, settings.proj_budget,
                                        cache=out / "projection-shares.json")  # as attribute shares it
        run = self.audit.run
        self.checkpoints = checkpoint_weights(settings.run) if run is not None and run.checkpoints else []
        self.fresh_tracin = bool(self.checkpoints) and _fresh(
            work / "gradients-checkpoints" / f"checkpoint-{self.checkpoints[0].step}")

    @cached_property
    def store(self) -> Any:
        """The final adapter's features of every row, extracted on first use (a study that needs none pays none)."""
        from gradian.gradients.extract import extract_train_features

        return self.clock.timed("extract final", extract_train_features, self.model, self.audit.rendered,
                                self.work / "gradients", settings=self.gradient)

    def effects(self, kinds: Sequence[str], arrays: dict[str, np.ndarray]) -> None:
        """Each kind's (N,) mean effect, raw and unit-normalised, on the final adapter and by TracIn-CP."""
        from gradian.scores.pairs import base_kind
        from gradian.scores.queries import query_features
        from gradian.scores.scoring import score_features
        from gradian.scores.tracin import tracin_cp_effects

        timed, audit = self.clock.timed, self.audit
        for kind in kinds:
            pairs = self.pairs(kind)
            q = timed(f"query {kind}", query_features, self.model, pairs, kind=base_kind(kind), settings=self.gradient)
            for unit in (True, False):
                norm = "unit" if unit else "raw"
                arrays[f"effect/{kind} · {norm} · final"] = timed(
                    f"score {kind} {norm}", score_features, self.store, q, unit_norm_train=unit).mean(axis=0)
                if self.checkpoints:
                    arrays[f"effect/{kind} · {norm} · TracIn-CP"] = timed(
                        f"tracin {kind} {norm}", tracin_cp_effects, self.model, audit.rendered, pairs,
                        self.checkpoints, self.work / "gradients-checkpoints", settings=self.gradient,
                        kind=base_kind(kind), unit_norm_train=unit, final_store=self.store).mean(axis=0)


    def extracted_harms(self, model: Any, rendered: Any, direction: list[Any], *, batch_size: int) -> np.ndarray:
        """(N,) the rows' harmful positions from an extraction given `direction` and the failing queries' states,
        as `gradian attribute` runs it: a whole extraction into a fresh store (what the default pays in place of the
        plain one and RepSim's forward pass)."""
        import tempfile

        from gradian.gradients.extract import extract_train_features
        from gradian.gradients.sides import position_harms_of
        from gradian.scores.query import query_states

        report = json.loads((Path(self.settings.out) / "report.json").read_text())
        queries = [row for row in self.regression.rows if row.id in set(report["run"]["queries"])]
        states = query_states(model, queries, batch_size=batch_size)
        with tempfile.TemporaryDirectory() as scratch:
            store = extract_train_features(model, rendered, Path(scratch), settings=self.gradient, direction=direction,
                                           representations=states)
            return position_harms_of(store, direction)

    def failing(self) -> list[Any]:
        """The regression rows of the failing queries `attribute` traced (its report's `run.queries`)."""
        report = json.loads((Path(self.settings.out) / "report.json").read_text())
        return [row for row in self.regression.rows if row.id in set(report["run"]["queries"])]

    def without_gradients(self, failing: list[Any], arrays: dict[str, np.ndarray]) -> None:
        """`--rank activation`'s (N,) cosines and the answer-length control's (N,) scores, the base's own answers
        generated once for both (timed apart: `base answers`)."""
        from benchmarks.harness.baselines import length_control
        from gradian.scores.activation import activation_scores

        where, batch = self.work / "activation", self.settings.batch_size
        found = self.clock.timed("activation", activation_scores, self.model, self.tokenizer, self.audit, failing,
                                 where, batch_size=batch)
        arrays["activation"] = found.cosine
        self.clock.seconds["activation"] -= found.generation_seconds
        self.clock.seconds["base answers"] = found.generation_seconds
        arrays["length control"] = self.clock.timed("length control", length_control, self.model, self.tokenizer,
                                                    self.audit, failing, where)
        self.departed_activation(failing, arrays)

    def departed_activation(self, failing: list[Any], arrays: dict[str, np.ndarray]) -> None:
        """`--rank activation`'s cosines with each difference read from where its two answers depart."""
        from gradian.scores.activation import activation_scores

        found = self.clock.timed(DEPARTED, activation_scores, self.model, self.tokenizer, self.audit, failing,
                                 self.work / "activation", batch_size=self.settings.batch_size, from_departure=True)
        arrays[DEPARTED] = found.cosine
        self.clock.seconds[DEPARTED] -= found.generation_seconds  # the base's answers: generated once, kept

    def bergson(self, arrays: dict[str, np.ndarray]) -> None:
        """bergson's own scores (`baselines` row `bergson`, `bergson_baseline`): the rows as trained against the mean
        gradient of the failing answers the fine-tune gave; nothing where bergson's venv is absent."""
        from benchmarks.harness.bergson_baseline import bergson_scores
        from gradian.scores.queries import answer_row

        failing = [answer_row(p.prompt_ids, p.negative_ids, None)  # loss on the answer the fine-tune gave
                   for p in self.pairs("naive") if p.negative_ids]
        found = bergson_scores(Path(self.settings.adapter), Path(self.audit.base_ref.path),
                               int(self.model.config.max_position_embeddings),
                               [(r.input_ids, r.labels) for r in self.audit.rendered], failing, self.work / "bergson")
        if found is not None:
            arrays["bergson"], self.clock.seconds["bergson"] = found

    def pairs(self, kind: str) -> list[Any]:
        from gradian.scores.pairs import query_pairs

        audit = self.audit
        return query_pairs(self.regression, self.capability, audit.eval_examples, self.tokenizer, audit.setup, kind,
                           self.model)

    def row_harms(self, kinds: Sequence[str], arrays: dict[str, np.ndarray]) -> None:
        """Each kind's (N,) harm of every row from its harmful tokens (`row_harms`): `harm/<kind>`, and from its
        harmful positions: `positions/<kind>`, the final adapter's; only those not in `arrays`."""
        from gradian.scores.pairs import base_kind
        from gradian.scores.query import query_direction
        from gradian.scores.token_harm import row_harms

        functions = {"positions": self.extracted_harms, "tokens": row_harms}
        for kind in kinds:
            todo = [harm for harm in HARM_ARRAYS if HARM_ARRAYS[harm].format(kind=kind) not in arrays]
            direction = query_direction(self.model, self.pairs(kind), base_kind(kind)) if todo else None
            for harm in todo:
                arrays[HARM_ARRAYS[harm].format(kind=kind)] = self.clock.timed(
                    f"{harm} {kind}", functions[harm], self.model, self.audit.rendered, direction,
                    batch_size=self.settings.batch_size)


def default_variant() -> str:
    """The variant `gradian attribute` runs with its defaults today (TracIn-CP unless checkpoints are off)."""
    from dataclasses import fields

    from gradian.settings import AttributeSettings, row_harm_of

    default = {f.name: f.default for f in fields(AttributeSettings)}
    where = "final" if default["checkpoints"] == "off" else "TracIn-CP"
    name = f"{default['query']} · {'unit' if default['unit_norm_train'] else 'raw'} · {where}"
    harm = row_harm_of(default["row_harm"], default["preconditioner"], default["unit_norm_train"],
                       tracin=where == "TracIn-CP")
    return name if harm == "sum" else f"{name} · {harm}"


def variant_arrays(variant: str) -> tuple[str, str | None]:
    """The ingredients a gradient variant reads: its effect's key and, for `· positions` / `· tokens`, its harm's."""
    kind, *_, last = variant.split(" · ")
    if last not in HARM_ARRAYS:
        return f"effect/{variant}", None
    return f"effect/{variant.removesuffix(f' · {last}')}", HARM_ARRAYS[last].format(kind=kind)


def methods_of(meta: dict[str, Any], arrays: dict[str, np.ndarray], truth: dict[str, Any]) -> dict[str, tuple]:
    """name -> ((N,) score, higher = more suspect; cost) for every method, from the ingredients."""
    from gradian.scenarios.evaluate import category_oracle, random_scores
    from gradian.scores import relevance as rel
    from gradian.scores.combine import RELEVANCE_AGGREGATE, combine, relevances_from, robust_z

    n_rows, seconds = len(meta["ids"]), meta["seconds"]
    parts = {"tfidf": arrays["sim/tfidf"], "repsim": arrays["part/repsim/sim"]}  # what relevance_parts returns

    def relevance(how: str):
        return relevances_from(parts, how)

    free = {"backward_rows": 0, "forward_rows": 0, "seconds": 0.0}
    methods: dict[str, tuple] = {
        "random": (random_scores(n_rows, truth["seed"]), free),
        "category oracle": (category_oracle(meta["ids"], truth, truth["seed"], meta["categories"]), free),
    }
    for how in ("max", "mean"):
        methods[f"TF-IDF ({how})"] = (rel.aggregate(arrays["sim/tfidf"], how), {**free, "seconds": seconds["tfidf"]})
        methods[f"BM25 ({how})"] = (rel.aggregate(arrays["sim/bm25"], how), {**free, "seconds": seconds["bm25"]})
        methods[f"RepSim ({how})"] = (rel.aggregate(parts["repsim"], how),
                                      {**free, "forward_rows": n_rows, "seconds": seconds["repsim"]})
    if "activation" in arrays:  # both read the base's own answers, generated once: counted in each one's cost
        generation = seconds["base answers"]
        methods["activation"] = (arrays["activation"], {**free, "forward_rows": 2 * n_rows,
                                                        "seconds": seconds["activation"] + generation})
        methods["length control"] = (arrays["length control"], {**free, "seconds": seconds["length control"]
                                                                + generation})
    if DEPARTED in arrays:
        methods[DEPARTED] = (arrays[DEPARTED], {**free, "forward_rows": 2 * n_rows,
                                                "seconds": seconds[DEPARTED] + seconds["base answers"]})
    if "bergson" in arrays:  # its own backward over every row and the failing answers, in its own venv
        methods["bergson"] = (arrays["bergson"], {**free, "backward_rows": n_rows, "seconds": seconds["bergson"]})
    first_tracin = next((name for name in seconds if name.startswith("tracin ")), "")  # it extracted the stores
    gradients = {}  # name -> ((N,) mean effect, (N,) harm or None: −effect, cost)
    extra = {"positions": {"backward_rows": n_rows, "repsim_in_extraction": True},  # in the extraction's passes
             "tokens": {"forward_rows": n_rows, "forward_mode_rows": n_rows}}  # one more forward-mode pass
    for key in (k for k in arrays if k.startswith("effect/") and k != "effect/default"):  # older ones kept that
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
        gradients[name] = (arrays[key], None, cost)
        for harm, more in extra.items():  # its rows ranked by their harmful positions or tokens
            harm_key = variant_arrays(f"{name} · {harm}")[1]
            if where == "final" and norm == "raw" and harm_key in arrays:  # positions: an extraction in its place
                base = cost["seconds"] - (seconds["extract final"] if harm == "positions" else 0.0)
                gradients[f"{name} · {harm}"] = (arrays[key], arrays[harm_key], {
                    **cost, **more, "seconds": base + seconds[f"{harm} {kind}"]})
    default = default_variant()

    def plus_relevance(cost):  # RepSim's forward pass, unless the extraction's forward gave it
        if cost.get("repsim_in_extraction"):
            return cost
        return {**cost, "forward_rows": cost["forward_rows"] + n_rows, "seconds": cost["seconds"] + seconds["repsim"]}

    def gradient(effect, harm):
        return -effect if harm is None else harm

    for name, (mean_effect, harm, cost) in gradients.items():
        methods[f"gradient · {name}"] = (gradient(mean_effect, harm), cost)
        methods[f"combined · {name}"] = (combine(mean_effect[None, :], relevance(RELEVANCE_AGGREGATE), harm=harm).score,
                                         plus_relevance(cost))
    effect, harm, default_cost = gradients[default]
    methods["gradient (default)"] = methods[f"gradient · {default}"]
    methods["combined (default)"] = methods[f"combined · {default}"]
    other = next(how for how in ("max", "mean") if how != RELEVANCE_AGGREGATE)
    methods[f"combined ({other} relevance)"] = (combine(effect[None, :], relevance(other), harm=harm).score,
                                                plus_relevance(default_cost))
    methods["combined, ungated"] = (combine(effect[None, :], relevance(RELEVANCE_AGGREGATE), harm=harm,
                                            gated=False).score, plus_relevance(default_cost))
    if "activation" in methods:  # both rankings, each as its robust z, summed: the cost of both
        a_score, a_cost = methods["activation"]
        g_score, g_cost = methods["gradient (default)"]
        methods["gradient + activation"] = (robust_z(g_score)[0] + robust_z(a_score)[0],
                                            {k: a_cost.get(k, 0) + g_cost.get(k, 0)
                                             for k in (*free, "forward_mode_rows")})
    summed = variant_arrays(default)[0].removeprefix("effect/")  # every token summed, as before
    for label, variant in (("row sum", summed), ("tokens", f"{summed} · tokens")):
        if variant != default and f"combined · {variant}" in methods:
            methods[f"gradient ({label})"] = methods[f"gradient · {variant}"]
            methods[f"combined ({label})"] = methods[f"combined · {variant}"]
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
    positive = planted(ids, truth)
    labels, k, per_epoch = np.array(meta["labels"]), int(positive.sum()), meta["epoch_seconds"]
    record["methods"] = {
        name: {"auprc": auprc(s, positive), "precision_at_k": precision_at_k(s, positive, k),
               "cluster_first": cluster_first(s, labels, positive), "causes_named": causes_named(s, ids, causes, k),
               **cost, "epochs_worth": cost["seconds"] / per_epoch if per_epoch else None}
        for name, (s, cost) in methods_of(meta, arrays, truth).items()
    }
    return record


def _report_facts(out: Path) -> dict[str, Any]:
    """The verdict, row ids and clusters of the report in `out` (read again at every evaluation: a later
    `attribute` into it, with today's defaults, replaces the ones the ingredients were kept with); nothing when it
    is of a schema older than examples.jsonl."""
    from gradian.report.rows import EXAMPLES_FILE, read_examples

    if not (out / EXAMPLES_FILE).exists():
        return {}
    report, rows = json.loads((out / "report.json").read_text()), read_examples(out)
    return {"verdict": report["verdict"]["kind"], "verdict_culprits": report["verdict"]["culprit_ids"],
            "ids": [row["id"] for row in rows], "labels": [row["cluster"] for row in rows]}


def folder_record(folder: Path, work: Path, kinds: Sequence[str] = QUERY_KINDS) -> dict[str, Any]:
    """Ingredients from WORK when a run already left them, else computed (and kept); then evaluated."""
    truth = json.loads((folder / "truth.json").read_text())
    meta_path, arrays_path = work / "ingredients.json", work / "ingredients.npz"
    if meta_path.exists() and arrays_path.exists():
        if not (work / "attribute" / "report.json").exists():  # removed to rerun with today's Gradian: cached stages
            from gradian import attribute

            attribute(_settings(folder, work))
        meta = json.loads(meta_path.read_text()) | _report_facts(work / "attribute")
        with np.load(arrays_path) as stored:
            arrays = {key: stored[key] for key in stored.files}
        missing = [k for k in kinds if meta["attributed"] and f"effect/{k} · unit · final" not in arrays]
        no_harms = [k for k in kinds if meta["attributed"]
                    and any(key.format(kind=k) not in arrays for key in HARM_ARRAYS.values())]
        no_activation = meta["attributed"] and "activation" not in arrays
        no_departed = meta["attributed"] and not no_activation and DEPARTED not in arrays
        no_bergson = meta["attributed"] and "bergson" not in arrays and bergson_baseline.interpreter() is not None
        if missing or no_harms or no_activation or no_departed or no_bergson:  # what this folder's ingredients lack: only that is computed, then kept
            clock = Clock()
            run = _GradientRun(_settings(folder, work), work, clock)
            run.effects(missing, arrays)
            run.row_harms(no_harms, arrays)
            if no_activation:
                run.without_gradients(run.failing(), arrays)
            if no_departed:
                run.departed_activation(run.failing(), arrays)
            if no_bergson:
                run.bergson(arrays)
            meta["seconds"] |= {k: v for k, v in clock.seconds.items() if k != "extract final"}
            np.savez(arrays_path, **arrays)
            meta_path.write_text(json.dumps(meta, indent=1, default=float))
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


def family_means(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per method: per split, the mean AUPRC over families (each family the mean of its seeds) and the worst family;
    the mean backward rows per run and the median ÷ epoch. TracIn-CP runs only where the run kept checkpoints,
    so `families` of `of` says over how many families a mean is."""
    per: dict[tuple[str, str, str], list[float]] = {}
    cost: dict[str, list[dict[str, Any]]] = {}
    families = {split: {r["family"] for r in records if r["split"] == split and r["methods"]}
                for split in {r["split"] for r in records}}
    for r in records:
        for name, m in r["methods"].items():
            per.setdefault((name, r["split"], r["family"]), []).append(m["auprc"])
            cost.setdefault(name, []).append(m)
    out: dict[str, dict[str, Any]] = {}
    for name in cost:
        row: dict[str, Any] = {}
        for split, names in families.items():
            means = [float(np.mean(per[(name, split, f)])) for f in sorted(names) if (name, split, f) in per]
            if means:
                row[split] = {"mean": float(np.mean(means)), "worst": min(means), "families": len(means),
                              "of": len(names)}
        worth = [m["epochs_worth"] for m in cost[name] if m["epochs_worth"] is not None]
        out[name] = {**row, "backward_rows": float(np.mean([m["backward_rows"] for m in cost[name]])),
                     "derivative_rows": float(np.mean([m["backward_rows"] + m.get("forward_mode_rows", 0)
                                                       for m in cost[name]])),
                     "epochs_worth": float(np.median(worth)) if worth else None}
    return out


def on_every_dev_family(method: dict[str, Any]) -> bool:
    dev = method.get("dev")
    return bool(dev) and dev["families"] == dev["of"]


def cheapest_near_best(ranked: dict[str, dict[str, Any]], margin: float, cost: Any) -> str:
    """The highest mean dev AUPRC; among those within `margin` of it, the lowest `cost(method)` (a tuple), then
    the higher mean."""
    best = max(m["dev"]["mean"] for m in ranked.values())
    near = [n for n, m in ranked.items() if m["dev"]["mean"] >= best - margin]
    return min(near, key=lambda n: (*cost(ranked[n]), -ranked[n]["dev"]["mean"]))


def dev_rule(means: dict[str, dict[str, Any]], margin: float = 0.02) -> str:
    """BENCHMARKS.md's rule for defaults: among the gradient-based rankings run on every dev family, the highest
    mean dev AUPRC; one within `margin` of it that costs less wins (the cheapest such): fewer passes over the rows
    that take a derivative (backward or forward-mode), then the lower median ÷ epoch."""
    ranked = {n: m for n, m in means.items() if n.startswith(("gradient ·", "combined ·")) and on_every_dev_family(m)}
    return cheapest_near_best(ranked, margin, lambda m: (m["derivative_rows"], m["epochs_worth"] or 0.0))


def rule_over_all(means: dict[str, dict[str, Any]], margin: float = 0.02) -> str:
    """The rule over all methods (issue 47): `dev_rule`'s gradient choice against `--rank activation`, the one
    without gradients (over whole answers, and from where they depart), and `gradient + activation`, the two
    combined, by the same rule with the median ÷ epoch as the cost (the activation difference's generation of the
    base's answers counted): another wins when ahead by more than `margin`, or within `margin` at a lower ÷ epoch.
    One that did not run on every dev family is not chosen."""
    gradient = dev_rule(means, margin)
    ranked = {n: means[n] for n in (gradient, "activation", DEPARTED, "gradient + activation")
              if n in means and on_every_dev_family(means[n])}
    return cheapest_near_best(ranked, margin,
                              lambda m: (np.inf if m["epochs_worth"] is None else m["epochs_worth"],))


def means_table(records: list[dict[str, Any]]) -> list[str]:
    """The means over families beside each other, best dev first, and the dev rule's choice."""
    means = family_means(records)
    lines = ["### Means over families (each family the mean of its seeds)", "",
             "| method | dev: mean AUPRC | dev: worst family | test: mean AUPRC | test: worst family | "
             "backward + forward-mode rows per run (mean) | ÷ epoch (median) |", "|---|---|---|---|---|---|---|"]
    def cell(m: dict[str, Any], split: str, key: str) -> str:
        if split not in m:
            return "–"
        part = m[split]
        return f"{part[key]:.3f}" + ("" if part["families"] == part["of"] else f" ({part['families']} of {part['of']})")

    order = sorted(means, key=lambda n: (n not in MAIN_METHODS[:8], -means[n].get("dev", {}).get("mean", -1)))
    for name in order:
        m = means[name]
        worth = "–" if m["epochs_worth"] is None else f"{m['epochs_worth']:.1f}"
        lines.append(f"| {name} | {cell(m, 'dev', 'mean')} | {cell(m, 'dev', 'worst')} | {cell(m, 'test', 'mean')} | "
                     f"{cell(m, 'test', 'worst')} | {m['derivative_rows']:.0f} | {worth} |")
    if any("dev" in m for n, m in means.items() if n.startswith(("gradient ·", "combined ·"))):
        lines += ["", f"The dev rule's choice: **{dev_rule(means)}**; over all methods, the activation difference "
                  f"included: **{rule_over_all(means)}**.", ""]
    return lines


def summary_tables(records: list[dict[str, Any]]) -> list[str]:
    """The per-family summaries of both splits and the means over families, with the dev rule's choice."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for record in records:
        groups.setdefault((record["split"], record["family"]), []).append(record)
    return ["÷ epoch: the method's wall time (generation excluded) over the run's own training time per epoch, "
            "both on the machine that ran them; a store already extracted when timed is marked in the JSON "
            "(`fresh`).", "", *summary(groups), *means_table(records)]


def markdown(records: list[dict[str, Any]]) -> str:
    """One table per family and split: every method's mean AUPRC, P@k, cluster-first and causes named, and cost."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for record in records:
        groups.setdefault((record["split"], record["family"]), []).append(record)
    lines = summary_tables(records)
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
    parser.add_argument("--jobs", type=int, default=jobs.default_jobs(), help="folders at once (default: CPUs)")
    args = parser.parse_args(argv)

    def done(record: dict[str, Any]) -> None:
        print(json.dumps({k: record[k] for k in ("scenario", "seed", "verdict")} | {
            "combined": record["methods"].get("combined (default)", {}).get("auprc"),
            "gradient": record["methods"].get("gradient (default)", {}).get("auprc")}), flush=True)

    records = jobs.run_jobs(folder_record, [(f.resolve(), args.work / f.resolve().name, tuple(args.kinds))
                                            for f in args.folders], args.jobs, done)
    (args.results or args.work / "results.json").write_text(json.dumps(records, indent=1, default=float))
    (args.markdown or args.work / "results.md").write_text(markdown(records) + "\n")
    print(markdown(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
