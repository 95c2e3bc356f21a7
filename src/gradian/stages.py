"""The stages of `attribute`, in order: plain objects in, plain objects out, each a resumable artifact in `out`.

    with output_folder(settings):  # created and locked for the run
        audit = run_audit(settings)  # findings.json
        model, tokenizer = load(settings, audit)
        prepared = prepare(settings, audit, model)  # optimizer.pt and checkpoints, read before anything long
        measured = regression(settings, audit, model, tokenizer)  # generations.jsonl
        query = queries(settings, audit, measured, model, tokenizer, prepared)  # failing rows' pairs, v, states
        extraction = extract(settings, audit, model, prepared=prepared, query=query)  # gradients/
        scores = score(settings, extraction, model, audit, query)  # scores.npy (memory map)
        ranking = rank(settings, scores, extraction, model, audit, query)  # ranking.json
        clusters = cluster(settings, audit, extraction.store, ranking.effects)
        result = report(settings, audit, measured, query=query, ranking=ranking, clusters=clusters,
                        extraction=extraction, model=model, tokenizer=tokenizer)  # report.json / .md / .html

`gradian.attribute` calls exactly these, in this order (and stops after `regression` inside the noise band:
`report(settings, audit, measured)`); run one by one they give the same report.

Under torch.distributed (`gradients.distributed`, the `ranks` argument) every process runs the audit and its shard
of `extract`; `regression` and `queries` compute on rank 0 and share with the others what extraction needs; the
stages after `extract` run on rank 0 alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from gradian.audit import DiagnoseResult, diagnose
from gradian.callback.capture import captured_store
from gradian.capabilities import get_capability
from gradian.clusters.cluster import Embedding, fit_clusters
from gradian.clusters.groups import candidate_groups
from gradian.clusters.naming import name_clusters
from gradian.clusters.summary import ClusterSummary, summarize_clusters
from gradian.curvature import fit_preconditioner
from gradian.curvature import parameter_scale as scale_of
from gradian.data.columns import ids_of, positions_of, texts_of
from gradian.errors import InputError
from gradian.files import atomic_write
from gradian.gradients.distributed import Ranks
from gradian.gradients.energy import share_budget
from gradian.gradients.extract import GradientSettings, ParameterScale, extract_train_features, project_sample
from gradian.gradients.sides import position_harms_of, repsim_of
from gradian.gradients.store import FeatureStore
from gradian.lock import output_lock
from gradian.regression.loading import load_models
from gradian.regression.measure import RegressionResult, measure_regression
from gradian.regression.symptoms import classify_failures
from gradian.report.rows import ExampleRows
from gradian.report.schema import Attribution, Context, build_report
from gradian.report.writers import write_report
from gradian.scores.combine import Ranking, rank_rows
from gradian.scores.pairs import base_kind, query_pairs
from gradian.scores.queries import QueryPair, query_features
from gradian.scores.query import Query, failing_queries, query_direction, query_states
from gradian.scores.scoring import effects_file, publish, score_features, total_effect
from gradian.scores.token_harm import harm_token, row_harms, token_harms
from gradian.scores.tracin import Checkpoint, checkpoint_stores, checkpoint_weights, tracin_cp_effects
from gradian.settings import AttributeSettings, ExtractSettings, row_harm_of
from gradian.verdict import Verdict, decide

Bar = Callable[[Iterable, str], Iterable]
FIT_CLUSTER_ROWS = 20000  # rows the clusters are fitted on; every row is then assigned (clusters.cluster)


class Prepared(NamedTuple):
    """The run files extraction reads, read before anything long runs."""

    scale: ParameterScale | None  # Adam's 1/√v̂ from optimizer.pt, for the adam preconditioner
    checkpoints: list[Checkpoint]  # what TracIn-CP sums over
    skipped: str | None  # why `--checkpoints auto` fell back to the final adapter


@dataclass
class Extraction:
    """What `extract` leaves: the final adapter's store and, for TracIn-CP, one store per checkpoint."""

    store: FeatureStore
    gradient: GradientSettings
    scale: ParameterScale | None
    checkpoints: list[Checkpoint] = field(default_factory=list)
    checkpoint_stores: list[FeatureStore] = field(default_factory=list)
    skipped: str | None = None  # why `--checkpoints auto` fell back to the final adapter

    @property
    def captured_steps(self) -> int:
        """`--checkpoints captured`: the steps whose captured gradients `store` sums (0 for an extracted store)."""
        return int(self.store.meta.get("captured", {}).get("steps", 0))

    @property
    def tracin(self) -> dict[str, Any]:
        return {"checkpoints": [{"step": c.step, "weight": c.weight} for c in self.checkpoints],
                "skipped": self.skipped, "captured_steps": self.captured_steps}


@dataclass
class Scores:
    effects: np.ndarray  # (Q, N) memory map of scores.npy
    pairs: list[QueryPair]


@dataclass
class Clusters:
    labels: np.ndarray  # (N,)
    summaries: list[ClusterSummary]
    embedding: Embedding  # handed to the report for the cluster map


@dataclass
class AttributeResult:
    verdict: Verdict
    report: dict[str, Any]
    paths: dict[str, Path]


@contextmanager
def output_folder(settings: ExtractSettings, ranks: Ranks | None = None) -> Iterator[Path]:
    """The output folder, created and locked for the run: rank 0 holds its lock, and a refusal there stops every
    rank (an unwritable folder fails at the lock)."""
    ranks = ranks or Ranks()
    out = settings.out_dir
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise InputError(f"cannot write there ({error.strerror}); choose another --out folder.", out) from None
    with ExitStack() as stack:
        ranks.main_only(lambda: stack.enter_context(output_lock(out)))
        yield out


def run_audit(settings: ExtractSettings, *, write: bool = True) -> DiagnoseResult:
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


def load(settings: ExtractSettings, audit: DiagnoseResult,
         ranks: Ranks | None = None) -> tuple[Any, Any]:
    """(the fine-tuned model, its tokenizer) on this process's device."""
    return load_models(audit.base_ref, adapter_dir(settings, audit), device=(ranks or Ranks()).device(settings.device))


def adapter_dir(settings: ExtractSettings, audit: DiagnoseResult) -> str:
    if settings.adapter:
        return settings.adapter
    if audit.run is not None and audit.run.adapter_dir is not None:
        return str(audit.run.adapter_dir)
    raise InputError("no adapter given; pass --adapter DIR (the folder with adapter_config.json).")


def prepare(settings: ExtractSettings, audit: DiagnoseResult, model: Any) -> Prepared:
    """The run files extraction reads (optimizer.pt, checkpoints), read early so a damaged one stops the run early."""
    return Prepared(parameter_scale(settings, audit, model), *tracin_checkpoints(settings, audit))


def regression(settings: AttributeSettings, audit: DiagnoseResult, model: Any, tokenizer: Any, *,
               bar: Bar | None = None, ranks: Ranks | None = None) -> RegressionResult | None:
    """Generate with the base and the fine-tuned model on the eval rows and measure the capability's drop (rank 0;
    None on the other ranks)."""
    return (ranks or Ranks()).main_only(lambda: _measure(settings, audit, model, tokenizer, bar))


def _measure(settings: AttributeSettings, audit: DiagnoseResult, model: Any, tokenizer: Any,
             bar: Bar | None) -> RegressionResult:
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


def attributes(settings: AttributeSettings, measured: RegressionResult | None, ranks: Ranks | None = None) -> bool:
    """Whether attribution goes on: the drop is outside the noise band, or `force`; rank 0's answer on every rank."""
    significant = measured.summary.to_dict().get("significant") if measured is not None else None
    return bool((ranks or Ranks()).broadcast(significant or settings.force))


def queries(settings: AttributeSettings, audit: DiagnoseResult, measured: RegressionResult | None, model: Any,
            tokenizer: Any, prepared: Prepared, *, ranks: Ranks | None = None) -> Query:
    """The failing eval rows' query pairs, the query direction v and their hidden states, made once (`scores.query`):
    rank 0 computes them and shares what the other ranks' extraction takes along; how a row's harm is read is
    decided here (`settings.row_harm_of`)."""
    ranks = ranks or Ranks()
    captured = settings.checkpoints == "captured"
    row_harm = row_harm_of(settings.row_harm, settings.preconditioner, settings.unit_norm_train,
                           tracin=bool(prepared.checkpoints) or captured)

    def pairs_of() -> list[QueryPair]:
        assert measured is not None  # rank 0 measured it
        pairs = query_pairs(measured, get_capability(settings.capability), audit.eval_examples or [], tokenizer,
                            audit.setup, settings.query, model)
        if not pairs:
            raise InputError("no failing eval row has a correct answer to contrast with (no reference, and the base "
                             "model fails too); add reference answers to the eval set.", settings.eval_dataset)
        return pairs

    pairs = ranks.main_only(pairs_of) or []
    failing = failing_queries(measured, pairs) if measured is not None else []
    # v: the direction of the rows' harm and the report's tokens; every process needs it where its extraction's
    # backward gives the rows' harmful positions
    direction = ranks.main_only(lambda: query_direction(model, pairs, base_kind(settings.query)),
                                share=row_harm == "positions")
    # the failing queries' hidden states: the extraction's forward gives every row's RepSim to them (captured
    # gradients come with no forward: the ranking then takes RepSim in a pass of its own)
    states = ranks.main_only(lambda: query_states(model, failing, batch_size=settings.batch_size),
                             share=True) if settings.rank == "combined" and not captured else None
    return Query(pairs, failing, row_harm, direction, states)


def extract(settings: ExtractSettings, audit: DiagnoseResult, model: Any, *, ranks: Ranks | None = None,
            bar: Bar | None = None, prepared: Prepared | None = None, query: Query | None = None) -> Extraction:
    """The training rows' features (final adapter, then every TracIn-CP checkpoint), this process's shard of each;
    with a `query`, its side stores too: each row's harmful positions along `query.harm_direction` from the final
    adapter's backward, and each row's RepSim to `query.states` from its forward (`gradients.sides`).

    Rank 0 computes the projection shares and broadcasts them with the energy pass's projected rows; every rank
    writes its files of each store; a barrier after each store, so every rank returns complete stores.
    """
    ranks = ranks or Ranks()
    out = settings.out_dir
    if settings.checkpoints == "captured":
        return captured_extraction(settings, audit, ranks)
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
                           progress=wrap(bar, "gradients"), scale=scale, sampled=projected,
                           direction=query.harm_direction if query is not None else None,
                           representations=query.states if query is not None else None)
    del projected
    ranks.barrier()
    store = FeatureStore(out / "gradients")  # every rank's files written
    stores = checkpoint_stores(model, audit.rendered, checkpoints, out / "gradients-checkpoints", settings=gradient,
                               shard=ranks.shard, progress=wrap(bar, "checkpoint gradients"), final_store=store,
                               barrier=ranks.barrier) if checkpoints else []
    return Extraction(store, gradient, scale, checkpoints, stores, skipped)


def captured_extraction(settings: ExtractSettings, audit: DiagnoseResult, ranks: Ranks) -> Extraction:
    """`--checkpoints captured`: each row's gradients as GradianCallback(capture=True) took them in training, summed
    over the steps it trained at (`callback.capture.captured_store`), in place of an extraction pass."""
    run = audit.run
    if run is None or run.path is None:
        raise InputError("--checkpoints captured reads the run folder's gradian_capture/; pass --run DIR.",
                         settings.adapter)
    path, record, out = run.path, run.record, settings.out_dir / "gradients-captured"
    ranks.main_only(lambda: captured_store(path, ids_of(audit.examples), out, record))
    ranks.barrier()
    store = FeatureStore(out)  # its settings hold the capture's projection: the queries are projected alike
    return Extraction(store, GradientSettings.from_dict(store.meta["gradient"]), None)


def score(settings: AttributeSettings, extraction: Extraction, model: Any, audit: DiagnoseResult, query: Query, *,
          bar: Bar | None = None) -> Scores:
    """(Q, N) effects streamed into scores.npy (a memory map), with scores.json beside it."""
    out, store, pairs = settings.out_dir, extraction.store, query.pairs
    effects = effects_file(out / "scores.npy", len(pairs), store.n_rows)
    kind = base_kind(settings.query)
    if extraction.checkpoints:
        tracin_cp_effects(model, audit.rendered, pairs, extraction.checkpoints, out / "gradients-checkpoints",
                          settings=extraction.gradient, kind=kind, unit_norm_train=settings.unit_norm_train,
                          stores=extraction.checkpoint_stores, out=effects)
    else:
        features = query_features(model, pairs, kind=kind, settings=extraction.gradient)
        preconditioner = fit_preconditioner(settings.preconditioner, model, audit.rendered, extraction.gradient,
                                            damping=settings.damping, progress=wrap(bar, "curvature"))
        score_features(store, features, preconditioner=preconditioner, unit_norm_train=settings.unit_norm_train,
                       out=effects)
    effects = publish(effects, out / "scores.npy")
    write_json(out / "scores.json", {"ids": list(store.ids), "queries": [p.eval_id for p in pairs],
                                     "query": settings.query, "preconditioner": settings.preconditioner,
                                     "checkpoints": extraction.tracin["checkpoints"],
                                     "checkpoints_skipped": extraction.skipped})
    return Scores(effects, pairs)


def rank(settings: AttributeSettings, scores: Scores, extraction: Extraction, model: Any, audit: DiagnoseResult,
         query: Query, *, bar: Bar | None = None) -> Ranking:
    """The rows ranked (`scores.combine`): by their harm, read as `query.row_harm` names it, and with `--rank
    combined` by their relevance to the failing eval rows too; ranking.json."""
    repsim = repsim_of(extraction.store, query.states) if query.states is not None else None  # (N, Q)
    ranking = rank_rows(settings.rank, scores.effects, model, audit, query.failing,
                        harm=harm_of_rows(settings, query, extraction, model, audit, bar), row_harm=query.row_harm,
                        repsim=repsim, batch_size=settings.batch_size)
    write_json(settings.out_dir / "ranking.json", ranking.to_dict())
    return ranking


def harm_of_rows(settings: AttributeSettings, query: Query, extraction: Extraction, model: Any,
                 audit: DiagnoseResult, bar: Bar | None = None) -> np.ndarray | None:
    """(N,) each row's harm as `query.row_harm` names it: its harmful positions (from extraction's backward), its
    harmful tokens (one forward-mode pass, `scores.token_harm`); None for `sum`, the harm then −(mean effect)."""
    if query.row_harm == "sum" or query.direction is None:
        return None
    if query.row_harm == "positions":
        return position_harms_of(extraction.store, query.direction)
    return row_harms(model, audit.rendered, query.direction, batch_size=settings.batch_size, bar=bar)


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


def report(settings: AttributeSettings, audit: DiagnoseResult, measured: RegressionResult | None, *,
           query: Query | None = None, ranking: Ranking | None = None, clusters: Clusters | None = None,
           extraction: Extraction | None = None, model: Any = None, tokenizer: Any = None) -> AttributeResult:
    """The verdict and the report files (report.json / .md / .html, examples.jsonl, culprits) of `attribute`:
    the regression alone inside the noise band, else the ranking's effects, the clusters and, given the model and
    its tokenizer, the token where each top row does most harm along `query.direction`."""
    ids = ids_of(audit.examples)  # a StringColumn: no list of N ids
    summary = measured.summary.to_dict() if measured is not None else {}
    effects = ranking.effects if ranking is not None else None  # (Q, N)
    effect = None if effects is None else total_effect(effects)  # (N,)
    labels = clusters.labels if clusters is not None else None
    failing = measured.failures() if measured is not None else []
    symptoms = classify_failures(failing, get_capability(settings.capability)) if measured is not None else None
    groups = candidate_groups(audit.examples, audit.findings, effects, clusters.summaries if clusters else None,
                              [row.prompt for row in failing], seed=settings.seed)
    summaries = groups.clusters  # the same clusters, each with where the failures sit
    verdict = decide(summary, audit.findings, summaries, effect, list(ids), symptoms=symptoms, groups=groups.groups)
    attribution = None if effects is None else Attribution(
        effects, labels, summaries or [], clusters.embedding if clusters is not None else None, ranking=ranking)
    run = {"setup": audit.setup.to_dict(), "queries": [p.eval_id for p in query.pairs] if query else [],
           "tracin_cp": extraction.tracin if extraction is not None else None,
           "tokenizer_source": tokenizer_source(audit)}
    built = build_report(summary, verdict, audit.findings, audit.examples, attribution=attribution,
                         symptoms=symptoms, groups=groups,
                         context=Context(settings=settings.to_dict(), run=run, seed=settings.seed))
    if query is not None and query.direction is not None and model is not None and built["top_rows"]:
        found = harm_tokens(settings, audit, query.direction, model, tokenizer, [row["id"] for row in built["top_rows"]])
        for row in built["top_rows"]:
            row["harm_token"] = found[row["id"]]
    rows = ExampleRows.of(ids, effect, labels, audit.findings, verdict.culprit_ids,
                          ranking.row_fields() if ranking is not None else None)
    paths = write_report(settings.out_dir, built, audit.examples, rows)
    return AttributeResult(verdict, built, paths)


def harm_tokens(settings: AttributeSettings, audit: DiagnoseResult, direction: Any, model: Any, tokenizer: Any,
                ids: list[str]) -> dict[str, dict[str, Any] | None]:
    """The token where each of these rows does most harm along `direction` (`scores.token_harm`)."""
    rows = [audit.rendered[int(i)] for i in positions_of(ids_of(audit.examples), ids)]
    harms = token_harms(model, rows, direction, batch_size=settings.batch_size)
    return {row.example_id: harm_token(tokenizer, row, harm) for row, harm in zip(rows, harms, strict=True)}


def parameter_scale(settings: ExtractSettings, audit: DiagnoseResult,
                    model: Any) -> ParameterScale | None:
    """Adam's scale from the run's optimizer.pt for `--preconditioner adam` (`curvature.adam`), else None."""
    return scale_of(settings.preconditioner, audit.run.optimizer_path if audit.run is not None else None, model,
                    settings.run or settings.adapter)


def tracin_checkpoints(settings: ExtractSettings,
                       audit: DiagnoseResult) -> tuple[list[Checkpoint], str | None]:
    """The checkpoints TracIn-CP sums over, and why none are used when `auto` falls back to the final adapter.

    `auto` uses them when the run has them and the preconditioner is identity: on the benchmark they recover the
    culprits a converged model no longer shows (its culprits' gradients are small once their failure is learned).
    """
    if settings.checkpoints in ("off", "captured"):
        return [], None
    run_path = audit.run.path if audit.run is not None else None
    if settings.checkpoints == "auto":
        if settings.preconditioner != "identity":
            return [], f"TracIn-CP uses the identity preconditioner, not {settings.preconditioner}"
        if run_path is None or audit.run is None or not audit.run.checkpoints:
            return [], "no run folder with checkpoint-*/ folders"
        try:
            return checkpoint_weights(run_path, audit.run.record), None
        except InputError as error:
            return [], str(error)
    if run_path is None:
        raise InputError("--checkpoints on needs the run folder with its checkpoint-*/ folders; pass --run DIR.",
                         settings.adapter)
    return checkpoint_weights(run_path, audit.run.record if audit.run is not None else None), None


def write_json(path: Path, data: Any) -> None:
    atomic_write(path, json.dumps(data, indent=2, default=str))


def wrap(bar: Bar | None, label: str) -> Callable[[Iterable], Iterable] | None:
    return None if bar is None else (lambda items: bar(items, label))
