"""The stages of `attribute` as functions a notebook or a cluster job calls: plain objects in, plain objects out.

    audit = run_audit(settings)                                         # findings.json
    model, tokenizer = load_models(audit.base_ref, settings.adapter)
    measured = regression(settings, audit, model, tokenizer)            # generations.jsonl (rank 0)
    pairs = query_pairs(measured, capability, audit.eval_examples, tokenizer, audit.setup, settings.query, model)
    extraction = extract(ExtractSettings.of(settings), audit, model)    # gradients/ (every rank)
    scores = score(settings, extraction, model, audit, pairs)           # scores.npy (memory map)
    clusters = cluster(settings, audit, extraction.store, scores.effects)
    result = report(settings, audit, measured.summary.to_dict(), scores, clusters, extraction)  # report.*

(`from gradian import attribute` runs them all; `from gradian.stages import regression, extract, score, cluster,
report` one at a time.)

Each stage writes its resumable artifact into the output folder; under torch.distributed (`gradients.distributed`)
`extract` is the one stage every process runs, the others run on rank 0.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gradian.audit import DiagnoseResult, diagnose
from gradian.clusters.cluster import Embedding, fit_clusters
from gradian.clusters.naming import name_clusters
from gradian.clusters.summary import ClusterSummary, summarize_clusters
from gradian.data.columns import ids_of, texts_of
from gradian.errors import InputError
from gradian.files import atomic_write
from gradian.gradients.distributed import Ranks
from gradian.gradients.energy import share_budget
from gradian.gradients.extract import (
    GradientSettings,
    ParameterScale,
    extract_train_features,
    make_projector,
    project_sample,
)
from gradian.gradients.factors import fit_factors
from gradian.gradients.sides import position_harms_of, repsim_of
from gradian.gradients.store import FeatureStore
from gradian.regression.capabilities import get_capability
from gradian.regression.measure import RegressionResult, measure_regression
from gradian.scores.pairs import base_kind
from gradian.scores.preconditioners import Preconditioner, adam, make_preconditioner
from gradian.scores.queries import QueryPair, query_features
from gradian.scores.scoring import effects_file, publish
from gradian.scores.scoring import score as score_features
from gradian.scores.tracin import Checkpoint, checkpoint_stores, checkpoint_weights, tracin_cp_effects
from gradian.settings import AttributeSettings, ExtractSettings

if TYPE_CHECKING:
    import torch

    from gradian.attribute import AttributeResult

Bar = Callable[[Iterable, str], Iterable]
FIT_CLUSTER_ROWS = 20000  # rows the clusters are fitted on; every row is then assigned (clusters.cluster)


@dataclass
class Extraction:
    """What `extract` leaves: the final adapter's store and, for TracIn-CP, one store per checkpoint."""

    store: FeatureStore
    gradient: GradientSettings
    scale: ParameterScale | None
    checkpoints: list[Checkpoint] = field(default_factory=list)
    checkpoint_stores: list[FeatureStore] = field(default_factory=list)
    skipped: str | None = None  # why `--checkpoints auto` fell back to the final adapter
    harm: np.ndarray | None = None  # (N,) the rows' harmful positions along the direction extraction was given
    repsim: np.ndarray | None = None  # (N, Q) the rows' RepSim to the query states extraction was given

    @property
    def tracin(self) -> dict[str, Any]:
        return {"checkpoints": [{"step": c.step, "weight": c.weight} for c in self.checkpoints],
                "skipped": self.skipped}


@dataclass
class Scores:
    effects: np.ndarray  # (Q, N) memory map of scores.npy
    pairs: list[QueryPair]


@dataclass
class Clusters:
    labels: np.ndarray  # (N,)
    summaries: list[ClusterSummary]
    embedding: Embedding  # handed to the report for the cluster map


def run_audit(settings: AttributeSettings | ExtractSettings, *, write: bool = True) -> DiagnoseResult:
    """The audit (renders every row as trained); findings.json when `write`."""
    audit = diagnose(settings.dataset, base_model=settings.base_model,
                     eval_dataset=getattr(settings, "eval_dataset", None), run=settings.run, config=settings.config,
                     capability=getattr(settings, "capability", None))  # `gradian extract` scores no capability
    if write:
        write_json(settings.out_dir / "findings.json", {"findings": [f.to_dict() for f in audit.findings],
                                                        "tokenizer_source": tokenizer_source(audit)})
    return audit


def tokenizer_source(audit: DiagnoseResult) -> dict[str, Any] | None:
    """Which tokenizer the audit read (the run's saved one, else the base model's), for findings and the report."""
    return audit.tokenizer_source.to_dict() if audit.tokenizer_source is not None else None


Prepared = tuple[ParameterScale | None, list[Checkpoint], str | None]


def prepare(settings: AttributeSettings | ExtractSettings, audit: DiagnoseResult, model: Any) -> Prepared:
    """The run files extraction reads (optimizer.pt, checkpoints), read early so a damaged one stops the run early."""
    return (parameter_scale(settings, audit, model), *tracin_checkpoints(settings, audit))


def regression(settings: AttributeSettings, audit: DiagnoseResult, model: Any, tokenizer: Any, *,
               bar: Bar | None = None) -> RegressionResult:
    """Generate with the base and the fine-tuned model on the eval rows and measure the capability's drop."""
    ticks = bar(range(2 * len(audit.eval_examples or [])), "generating") if bar is not None else None
    steps = iter(ticks) if ticks is not None else None

    def advance(n: int = 1) -> None:  # measure_regression says how many answers each batch finished
        for _ in range(n):
            next(steps, None)  # type: ignore[arg-type]

    try:
        return measure_regression(
            model, tokenizer, audit.eval_examples or [], get_capability(settings.capability), audit.setup,
            settings.out_dir, max_new_tokens=settings.max_new_tokens, batch_size=settings.batch_size,
            progress=advance if steps is not None else None,
            seed=settings.seed, min_effect=settings.min_effect,
        )
    finally:
        getattr(ticks, "close", lambda: None)()


def extract(settings: ExtractSettings, audit: DiagnoseResult, model: Any, *, ranks: Ranks | None = None,
            bar: Bar | None = None, prepared: Prepared | None = None,
            direction: list[torch.Tensor] | None = None, representations: np.ndarray | None = None) -> Extraction:
    """The training rows' features (final adapter, then every TracIn-CP checkpoint), this process's shard of each;
    with `direction`, each row's harmful positions along it from the final adapter's backward (`Extraction.harm`),
    with `representations` (the failing queries' states), each row's RepSim to them from its forward (`.repsim`);
    both read back on rank 0 only, the one that ranks.

    Rank 0 computes the projection shares and broadcasts them with the energy pass's projected rows; every rank
    writes its files of each store; a barrier after each store, so every rank returns complete stores.
    """
    ranks = ranks or Ranks()
    out = settings.out_dir
    scale, checkpoints, skipped = prepared or prepare(settings, audit, model)
    gradient = GradientSettings(proj_dim=settings.proj_dim if settings.proj_dim is not None else
                                GradientSettings().proj_dim, seed=settings.seed, batch_size=settings.batch_size,
                                shard_rows=settings.shard_rows)

    def shares() -> tuple[GradientSettings, Any]:
        shared, sampled = share_budget(model, audit.rendered, gradient, settings.proj_budget, scale=scale,
                                       progress=wrap(bar, "projection shares"), cache=out / "projection-shares.json")
        return shared, (project_sample(model, audit.rendered, sampled, shared, scale) if sampled else None)

    gradient, projected = ranks.main_only(shares, share=True)  # type: ignore[misc]
    extract_train_features(model, audit.rendered, out / "gradients", settings=gradient, shard=ranks.shard,
                           progress=wrap(bar, "gradients"), scale=scale, sampled=projected, direction=direction,
                           representations=representations)
    del projected
    ranks.barrier()
    store = FeatureStore(out / "gradients")  # every rank's files written
    stores = checkpoint_stores(model, audit.rendered, checkpoints, out / "gradients-checkpoints", settings=gradient,
                               shard=ranks.shard, progress=wrap(bar, "checkpoint gradients"), final_store=store,
                               barrier=ranks.barrier) if checkpoints else []
    harm = position_harms_of(store, direction) if direction is not None and ranks.is_main else None  # rank 0 ranks
    repsim = repsim_of(store, representations) if representations is not None and ranks.is_main else None
    return Extraction(store, gradient, scale, checkpoints, stores, skipped, harm, repsim)


def score(settings: AttributeSettings, extraction: Extraction, model: Any, audit: DiagnoseResult,
               pairs: list[QueryPair], *, bar: Bar | None = None) -> Scores:
    """(Q, N) effects streamed into scores.npy (a memory map), with scores.json beside it."""
    out, store = settings.out_dir, extraction.store
    effects = effects_file(out / "scores.npy", len(pairs), store.n_rows)
    kind = base_kind(settings.query)
    if extraction.checkpoints:
        tracin_cp_effects(model, audit.rendered, pairs, extraction.checkpoints, out / "gradients-checkpoints",
                          settings=extraction.gradient, kind=kind, unit_norm_train=settings.unit_norm_train,
                          stores=extraction.checkpoint_stores, out=effects)
    else:
        queries = query_features(model, pairs, kind=kind, settings=extraction.gradient)
        preconditioner = preconditioner_of(settings, model, audit, extraction.gradient, bar)
        score_features(store, queries, preconditioner=preconditioner, unit_norm_train=settings.unit_norm_train,
                       out=effects)
    effects = publish(effects, out / "scores.npy")
    write_json(out / "scores.json", {"ids": list(store.ids), "queries": [p.eval_id for p in pairs],
                                     "query": settings.query, "preconditioner": settings.preconditioner,
                                     "checkpoints": extraction.tracin["checkpoints"],
                                     "checkpoints_skipped": extraction.skipped})
    return Scores(effects, pairs)


def cluster(settings: AttributeSettings, audit: DiagnoseResult, features: FeatureStore | np.ndarray | None,
            effects: np.ndarray) -> Clusters:
    """Clusters fitted on a sample of the rows (text and gradient features), named on it, every row assigned."""
    texts = texts_of(audit.examples)  # two string columns, read a chunk of rows at a time
    fitted = fit_clusters(texts, features, n_clusters=settings.n_clusters, seed=settings.seed,
                          fit_rows=FIT_CLUSTER_ROWS)
    sample = fitted.embedding.sample
    names = name_clusters([texts[i] for i in sample], fitted.labels[sample])  # c-TF-IDF on the sample
    summaries = summarize_clusters(ids_of(audit.examples), fitted.labels, effects, names, audit.findings,
                                   seed=settings.seed)
    return Clusters(fitted.labels, summaries, fitted.embedding)


def report(settings: AttributeSettings, audit: DiagnoseResult, summary: dict[str, Any], scores: Scores | None = None,
           clusters: Clusters | None = None, extraction: Extraction | None = None) -> AttributeResult:
    """The verdict and the report files (report.json / .md / .html, examples.jsonl, culprits) of `attribute`."""
    from gradian.attribute import _finish  # attribute's last step; imported here, attribute imports this module

    return _finish(settings, audit, summary, scores.effects if scores is not None else None, clusters,
                   scores.pairs if scores is not None else None, extraction.tracin if extraction is not None else None)


def parameter_scale(settings: AttributeSettings | ExtractSettings, audit: DiagnoseResult,
                    model: Any) -> ParameterScale | None:
    if settings.preconditioner != "adam":
        return None
    if audit.run is None or audit.run.optimizer_path is None:
        raise InputError("the adam preconditioner needs the run's optimizer.pt; pass --run with a checkpoint folder.",
                         settings.run or settings.adapter)
    return adam(audit.run.optimizer_path, model)


def preconditioner_of(settings: AttributeSettings, model: Any, audit: DiagnoseResult, gradient: GradientSettings,
                      bar: Bar | None) -> Preconditioner:
    """The scoring-side P; K-FAC and EK-FAC first fit their Kronecker factors in one pass over the training rows."""
    factors = projector = None
    if settings.preconditioner in ("kfac", "ekfac"):
        projector = make_projector(model, gradient)
        factors = fit_factors(model, audit.rendered, projector, gradient, progress=wrap(bar, "curvature"))
    return make_preconditioner(settings.preconditioner, factors=factors, projector=projector, damping=settings.damping)


def tracin_checkpoints(settings: AttributeSettings | ExtractSettings,
                       audit: DiagnoseResult) -> tuple[list[Checkpoint], str | None]:
    """The checkpoints TracIn-CP sums over, and why none are used when `auto` falls back to the final adapter.

    `auto` uses them when the run has them and the preconditioner is identity: on the benchmark they recover the
    culprits a converged model no longer shows (its culprits' gradients are small once their failure is learned).
    """
    if settings.checkpoints == "off":
        return [], None
    run_path = audit.run.path if audit.run is not None else None
    if settings.checkpoints == "auto":
        if settings.preconditioner != "identity":
            return [], f"TracIn-CP uses the identity preconditioner, not {settings.preconditioner}"
        if run_path is None or audit.run is None or not audit.run.checkpoints:
            return [], "no run folder with checkpoint-*/ folders"
        try:
            return checkpoint_weights(run_path), None
        except InputError as error:
            return [], str(error)
    if run_path is None:
        raise InputError("--checkpoints on needs the run folder with its checkpoint-*/ folders; pass --run DIR.",
                         settings.adapter)
    return checkpoint_weights(run_path), None


def write_json(path: Path, data: Any) -> None:
    atomic_write(path, json.dumps(data, indent=2, default=str))


def wrap(bar: Bar | None, label: str) -> Callable[[Iterable], Iterable] | None:
    return None if bar is None else (lambda items: bar(items, label))
