"""`attribute`: audit → regression → gradients → scores → clusters → report, each stage resumable in `out`.

A thin facade over the stages (the CLI calls `attribute(settings, progress)`; so can a notebook). Each stage
writes its artifact into the output folder; a rerun reuses cached generations and the gradient store.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gradian.audit import DiagnoseResult, diagnose
from gradian.clusters.cluster import cluster_examples
from gradian.clusters.groups import candidate_groups
from gradian.clusters.naming import name_clusters
from gradian.clusters.summary import ClusterSummary, summarize_clusters
from gradian.data.examples import Example
from gradian.data.render import render_with_answer
from gradian.data.setup import TrainingSetup
from gradian.errors import InputError
from gradian.files import atomic_write
from gradian.gradients.energy import share_budget
from gradian.gradients.extract import GradientSettings, extract_train_features, make_projector
from gradian.gradients.factors import fit_factors
from gradian.lock import output_lock
from gradian.regression.capabilities import Capability, get_capability, passed
from gradian.regression.loading import load_models
from gradian.regression.measure import RegressionResult, RegressionRow, measure_regression
from gradian.regression.symptoms import classify_failures
from gradian.report.schema import build_report
from gradian.report.verdict import Verdict, decide
from gradian.report.writers import write_report
from gradian.scores.combine import Ranking, rank_rows
from gradian.scores.departure import departure_answers
from gradian.scores.preconditioners import Preconditioner, adam, make_preconditioner
from gradian.scores.queries import QueryPair, query_features
from gradian.scores.scoring import score, total_effect
from gradian.scores.tracin import Checkpoint, checkpoint_weights, tracin_cp_effects
from gradian.settings import AttributeSettings

Say = Callable[[str], None]
Bar = Callable[[Iterable, str], Iterable]


@dataclass
class AttributeResult:
    verdict: Verdict
    report: dict[str, Any]
    paths: dict[str, Path]


def attribute(settings: AttributeSettings, *, say: Say | None = None, bar: Bar | None = None) -> AttributeResult:
    """Run every stage; `say` reports the stage, `bar(iterable, label)` wraps long loops in a progress bar."""
    with output_lock(_writable(settings.out_dir)):
        return _attribute(settings, say or (lambda _: None), bar)


def _attribute(settings: AttributeSettings, say: Say, bar: Bar | None) -> AttributeResult:
    out = settings.out_dir
    capability = get_capability(settings.capability)

    say("audit: rendering the rows as trained and running the checks")
    audit = diagnose(settings.dataset, base_model=settings.base_model, eval_dataset=settings.eval_dataset,
                     run=settings.run, config=settings.config, capability=capability)
    _write_json(out / "findings.json", {"findings": [f.to_dict() for f in audit.findings],
                                        "tokenizer_source": _tokenizer_source(audit)})

    say("regression: generating with the base and the fine-tuned model")
    model, tokenizer = load_models(audit.base_ref, _adapter_dir(settings, audit), device=settings.device)
    scale = _scale(settings, audit, model)  # reads optimizer.pt now, so a bad one stops the run before generating
    checkpoints, skipped = _checkpoints(settings, audit)  # read now too, so a damaged one stops the run early
    ticks = bar(range(2 * len(audit.eval_examples or [])), "generating") if bar is not None else None
    try:
        regression = measure_regression(
            model, tokenizer, audit.eval_examples or [], capability, audit.setup, out,
            max_new_tokens=settings.max_new_tokens, batch_size=settings.batch_size,
            progress=_ticker(ticks), seed=settings.seed, min_effect=settings.min_effect,
        )
    finally:
        getattr(ticks, "close", lambda: None)()
    summary = regression.summary.to_dict()
    if not summary["significant"] and not settings.force:
        say("regression: inside the noise band, stopping here")
        return _finish(settings, audit, summary, None, None, None, regression=regression)

    pairs = query_pairs(regression, capability, audit.eval_examples or [], tokenizer, audit.setup, settings.query,
                        model)
    if not pairs:
        raise InputError("no failing eval row has a correct answer to contrast with (no reference, and the base "
                         "model fails too); add reference answers to the eval set.", settings.eval_dataset)

    say(f"gradients: per-example LoRA gradients of {len(audit.rendered)} training rows")
    gradient_settings = GradientSettings(proj_dim=_proj_dim(settings), seed=settings.seed,
                                         batch_size=settings.batch_size)
    gradient_settings, sampled = share_budget(model, audit.rendered, gradient_settings, settings.proj_budget,
                                              scale=scale, progress=_wrap(bar, "projection shares"),
                                              cache=out / "projection-shares.json")
    store = extract_train_features(model, audit.rendered, out / "gradients", settings=gradient_settings,
                                   progress=_wrap(bar, "gradients"), scale=scale, sampled=sampled)
    del sampled  # up to KEEP_BYTES of exact gradients, not needed past extraction

    over = f", TracIn-CP over {len(checkpoints)} checkpoints" if checkpoints else ""
    say(f"scores: {len(pairs)} failing eval rows, {settings.query} query, {settings.preconditioner} preconditioner"
        f"{over}")
    if checkpoints:
        effects = tracin_cp_effects(
            model, audit.rendered, pairs, checkpoints, out / "gradients-checkpoints", settings=gradient_settings,
            kind=base_kind(settings.query), unit_norm_train=settings.unit_norm_train,
            progress=_wrap(bar, "checkpoint gradients"), final_store=store,
        )
    else:
        queries = query_features(model, pairs, kind=base_kind(settings.query), settings=gradient_settings)
        preconditioner = _preconditioner(settings, model, audit, gradient_settings, bar)
        effects = score(store, queries, preconditioner=preconditioner, unit_norm_train=settings.unit_norm_train)
    tracin = {"checkpoints": [{"step": c.step, "weight": c.weight} for c in checkpoints], "skipped": skipped}
    np.save(out / "scores.npy", effects)
    _write_json(out / "scores.json", {"ids": store.ids, "queries": [p.eval_id for p in pairs],
                                      "query": settings.query, "preconditioner": settings.preconditioner,
                                      "checkpoints": tracin["checkpoints"], "checkpoints_skipped": skipped})

    ranking = rank_rows(settings.rank, effects, model, audit, regression, pairs, batch_size=settings.batch_size)
    _write_json(out / "ranking.json", ranking.to_dict())

    say("clusters: grouping and naming the training rows")
    features = store.rows(0, store.n_rows).astype(np.float32)
    return _finish(settings, audit, summary, ranking.effects, features, pairs, tracin, regression=regression,
                   ranking=ranking)


def _tokenizer_source(audit: DiagnoseResult) -> dict[str, Any] | None:
    return audit.tokenizer_source.to_dict() if audit.tokenizer_source is not None else None


def _finish(
    settings: AttributeSettings,
    audit: DiagnoseResult,
    summary: dict[str, Any],
    effects: np.ndarray | None,
    features: np.ndarray | None,
    pairs: list[QueryPair] | None,
    tracin: dict[str, Any] | None = None,
    *,
    regression: RegressionResult | None = None,
    ranking: Ranking | None = None,
) -> AttributeResult:
    ids = [example.id for example in audit.examples]
    labels, clusters, effect = None, None, None
    if effects is not None:
        effect = total_effect(effects)
        labels, clusters = _clusters(audit.examples, features, effects, audit, settings)
    failing = regression.failures() if regression is not None else []
    symptoms = classify_failures(failing, get_capability(settings.capability)) if regression is not None else None
    groups = candidate_groups(audit.examples, audit.findings, effects, clusters, [row.prompt for row in failing],
                              seed=settings.seed)
    clusters = groups.clusters  # the same clusters, each with where the failures sit
    verdict = decide(summary, audit.findings, clusters, effect, ids, symptoms=symptoms, groups=groups.groups)
    report = build_report(
        regression=summary, verdict=verdict, findings=audit.findings, examples=audit.examples, effects=effects,
        labels=labels, clusters=clusters, features=features, settings=settings.to_dict(),
        run={"setup": audit.setup.to_dict(), "queries": [p.eval_id for p in pairs or []], "tracin_cp": tracin,
             "tokenizer_source": _tokenizer_source(audit)},
        seed=settings.seed,
        symptoms=symptoms, groups=groups, ranking=ranking,
    )
    paths = write_report(settings.out_dir, report, audit.examples)
    return AttributeResult(verdict, report, paths)


def _clusters(
    examples: list[Example], features: np.ndarray | None, effects: np.ndarray, audit: DiagnoseResult,
    settings: AttributeSettings,
) -> tuple[np.ndarray, list[ClusterSummary]]:
    texts = [(example.prompt_text, example.completion_text) for example in examples]
    labels = cluster_examples(texts, features, n_clusters=settings.n_clusters, seed=settings.seed)
    names = name_clusters(texts, labels)
    ids = [example.id for example in examples]
    return labels, summarize_clusters(ids, labels, effects, names, audit.findings, seed=settings.seed)


def query_pairs(
    regression: RegressionResult,
    capability: Capability,
    eval_examples: list[Example],
    tokenizer: Any,
    setup: TrainingSetup,
    kind: str,
    model: Any = None,
) -> list[QueryPair]:
    """One pair per failing eval row: y⁺ (the kind's correct answer) and y⁻ (what the fine-tuned model said).

    `departure*` kinds take y⁺ from the base model at the first token where the fine-tune departs from it
    (needs `model`); `repaired*` kinds repair the failing output; the others use the reference, else a
    passing base answer. A row without a correct answer of that kind falls back to the reference.
    """
    by_id = {example.id: example for example in eval_examples}
    failing = regression.failures()
    departures: list[list[int] | None] = [None] * len(failing)
    if kind.startswith("departure"):
        budget = max((len(row.finetuned.ids) for row in failing), default=1) + 8
        departures = departure_answers(model, tokenizer, failing, capability, max_new_tokens=budget)
    pairs = []
    for row, departure in zip(failing, departures, strict=True):
        if departure is not None:
            pairs.append(QueryPair(row.id, row.prompt_ids, departure, list(row.finetuned.ids)))
            continue
        positive = _positive_text(row, capability, kind)
        if positive is None:
            continue
        prompt_ids, positive_ids = answer_tokens(by_id[row.id], positive, tokenizer, setup)
        negative = list(row.finetuned.ids) if prompt_ids == row.prompt_ids else \
            answer_tokens(by_id[row.id], row.finetuned.text, tokenizer, setup)[1]  # the template renders differently
        pairs.append(QueryPair(row.id, prompt_ids, positive_ids, negative))
    return pairs


def _positive_text(row: RegressionRow, capability: Capability, kind: str) -> str | None:
    correct = row.reference if row.reference is not None else (row.base.text if passed(row.base_score) else None)
    if correct is None:
        return None
    if kind.startswith("repaired"):
        repair = getattr(capability, "repair", None)
        repaired = repair(row.finetuned.text, correct) if repair is not None else None
        return repaired if repaired is not None else correct
    return correct


def answer_tokens(example: Example, answer: str, tokenizer: Any, setup: TrainingSetup) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids) of `answer` rendered after the prompt exactly as training renders completions."""
    return render_with_answer(example, answer, tokenizer, setup)


def base_kind(query: str) -> str:
    """`repaired*` and `departure*` are the contrastive kinds with another y⁺."""
    return {"repaired": "contrastive", "repaired-first": "contrastive-first", "departure": "contrastive",
            "departure-first": "contrastive-first"}.get(query, query)


def _proj_dim(settings: AttributeSettings) -> int | None:
    return settings.proj_dim if settings.proj_dim is not None else GradientSettings().proj_dim


def _scale(settings: AttributeSettings, audit: DiagnoseResult, model: Any):
    if settings.preconditioner != "adam":
        return None
    if audit.run is None or audit.run.optimizer_path is None:
        raise InputError("the adam preconditioner needs the run's optimizer.pt; pass --run with a checkpoint folder.",
                         settings.run or settings.adapter)
    return adam(audit.run.optimizer_path, model)


def _preconditioner(settings: AttributeSettings, model: Any, audit: DiagnoseResult, gradient: GradientSettings,
                    bar: Bar | None) -> Preconditioner:
    """The scoring-side P; K-FAC and EK-FAC first fit their Kronecker factors in one pass over the training rows."""
    factors = projector = None
    if settings.preconditioner in ("kfac", "ekfac"):
        projector = make_projector(model, gradient)
        factors = fit_factors(model, audit.rendered, projector, gradient, progress=_wrap(bar, "curvature"))
    return make_preconditioner(settings.preconditioner, factors=factors, projector=projector, damping=settings.damping)


def _checkpoints(settings: AttributeSettings, audit: DiagnoseResult) -> tuple[list[Checkpoint], str | None]:
    """The checkpoints TracIn-CP sums over, and why none are used when `auto` falls back to the final adapter.

    `auto` uses them when the run has them and the preconditioner is identity: on the benchmark (BENCHMARKS.md) they
    recover the culprits a converged model no longer shows (its culprits' gradients are small once their failure is
    learned).
    """
    if settings.checkpoints == "off":
        return [], None
    has_run = audit.run is not None and audit.run.path is not None
    if settings.checkpoints == "auto":
        if settings.preconditioner != "identity":
            return [], f"TracIn-CP uses the identity preconditioner, not {settings.preconditioner}"
        if not has_run or not audit.run.checkpoints:
            return [], "no run folder with checkpoint-*/ folders"
        try:
            return checkpoint_weights(audit.run.path), None
        except InputError as error:
            return [], str(error)
    if not has_run:
        raise InputError("--checkpoints on needs the run folder with its checkpoint-*/ folders; pass --run DIR.",
                         settings.adapter)
    return checkpoint_weights(audit.run.path), None


def _adapter_dir(settings: AttributeSettings, audit: DiagnoseResult) -> str:
    if settings.adapter:
        return settings.adapter
    if audit.run is not None and audit.run.adapter_dir is not None:
        return str(audit.run.adapter_dir)
    raise InputError("no adapter given; pass --adapter DIR (the folder with adapter_config.json).")


def _writable(out: Path) -> Path:
    """The output folder, created; taking its lock is the write test (an unwritable folder fails there)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise InputError(f"cannot write there ({error.strerror}); choose another --out folder.", out) from None
    return out


def _write_json(path: Path, data: Any) -> None:
    atomic_write(path, json.dumps(data, indent=2, default=str))


def _wrap(bar: Bar | None, label: str) -> Callable[[Iterable], Iterable] | None:
    return None if bar is None else (lambda items: bar(items, label))


def _ticker(ticks: Iterable | None) -> Callable[[int], Any] | None:
    """measure_regression reports how many answers each batch finished; advance one bar by that many."""
    if ticks is None:
        return None
    steps = iter(ticks)
    return lambda n=1: [next(steps, None) for _ in range(n)]
