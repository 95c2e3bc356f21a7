"""`attribute`: audit → regression → gradients → scores → clusters → report, each stage resumable in `out`.

A thin facade over the stages (`gradian.stages`; the CLI calls `attribute(settings, progress)`; so can a notebook).
Each stage writes its artifact into the output folder; a rerun reuses cached generations and the gradient store.
Under `torchrun` / `accelerate launch` every process runs the audit and its shard of the extraction; rank 0 alone
holds the output lock, generates, scores, clusters and reports (the others return None).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gradian.audit import DiagnoseResult
from gradian.clusters.groups import candidate_groups
from gradian.data.columns import ids_of, positions_of
from gradian.errors import InputError
from gradian.gradients.distributed import Ranks, join
from gradian.lock import output_lock
from gradian.regression.capabilities import get_capability
from gradian.regression.loading import load_models
from gradian.regression.measure import RegressionResult
from gradian.regression.symptoms import classify_failures
from gradian.report.rows import ExampleRows
from gradian.report.schema import build_report
from gradian.report.verdict import Verdict, decide
from gradian.report.writers import write_report
from gradian.scores.combine import Ranking, failing_queries, query_states, rank_rows
from gradian.scores.pairs import answer_tokens, base_kind, query_pairs  # noqa: F401 - their former home
from gradian.scores.queries import QueryPair
from gradian.scores.scoring import total_effect
from gradian.scores.token_harm import harm_token, query_direction, row_harms, token_harms
from gradian.settings import AttributeSettings, ExtractSettings, row_harm_of
from gradian.stages import (
    Clusters,
    cluster,
    extract,
    prepare,
    regression,
    run_audit,
    score,
    tokenizer_source,
    write_json,
)

Say = Callable[[str], None]
Bar = Callable[[Iterable, str], Iterable]


@dataclass
class AttributeResult:
    verdict: Verdict
    report: dict[str, Any]
    paths: dict[str, Path]


def attribute(settings: AttributeSettings, *, say: Say | None = None, bar: Bar | None = None,
              ranks: Ranks | None = None) -> AttributeResult | None:
    """Run every stage; `say` reports the stage, `bar(iterable, label)` wraps long loops in a progress bar.

    Returns None on every rank but 0 under torch.distributed (`ranks`, else the launcher's environment).
    """
    ranks = ranks or join()
    with main_lock(ranks, _writable(settings.out_dir)):
        return _attribute(settings, ranks, say or (lambda _: None), bar)


def _attribute(settings: AttributeSettings, ranks: Ranks, say: Say, bar: Bar | None) -> AttributeResult | None:
    capability = get_capability(settings.capability)

    say("audit: rendering the rows as trained and running the checks")
    audit = run_audit(settings, write=ranks.is_main)

    say("regression: generating with the base and the fine-tuned model")
    model, tokenizer = load_models(audit.base_ref, _adapter_dir(settings, audit), device=ranks.device(settings.device))
    prepared = prepare(settings, audit, model)  # reads optimizer.pt and checkpoints now: a bad one stops us early

    def regress() -> tuple[Any, dict[str, Any]]:
        measured = regression(settings, audit, model, tokenizer, bar=bar)
        return measured, measured.summary.to_dict()

    measured, summary = ranks.main_only(regress) or (None, {})
    if not ranks.broadcast(summary.get("significant") or settings.force):
        if not ranks.is_main:
            return None
        say("regression: inside the noise band, stopping here")
        return _finish(settings, audit, summary, None, None, None, measured=measured)

    def queries() -> list[QueryPair]:
        assert measured is not None  # rank 0 measured it
        pairs = query_pairs(measured, capability, audit.eval_examples or [], tokenizer, audit.setup,
                            settings.query, model)
        if not pairs:
            raise InputError("no failing eval row has a correct answer to contrast with (no reference, and the base "
                             "model fails too); add reference answers to the eval set.", settings.eval_dataset)
        return pairs

    pairs = ranks.main_only(queries)
    how = row_harm_of(settings.row_harm, settings.preconditioner, settings.unit_norm_train, tracin=bool(prepared[1]))
    # v: the direction of the rows' harm and the report's tokens; every process needs it where its extraction's
    # backward gives the rows' harmful positions
    direction = ranks.main_only(lambda: query_direction(model, pairs or [], base_kind(settings.query)),
                                share=how == "positions")
    # the failing queries' hidden states: the extraction's forward gives every row's RepSim to them
    states = ranks.main_only(lambda: query_states(model, failing_queries(measured, pairs or []),
                                                  batch_size=settings.batch_size),
                             share=True) if settings.rank == "combined" else None

    say(f"gradients: per-example LoRA gradients of {len(audit.rendered)} training rows"
        + (f", {ranks.world} processes" if ranks.world > 1 else "")
        + (", with their harmful positions" if how == "positions" else "")
        + (", with their RepSim" if states is not None else ""))
    extraction = extract(ExtractSettings.of(settings), audit, model, ranks=ranks, bar=bar, prepared=prepared,
                         direction=direction if how == "positions" else None, representations=states)
    if not ranks.is_main or pairs is None or direction is None:
        return None  # rank 0 scores, clusters and reports

    over = f", TracIn-CP over {len(extraction.checkpoints)} checkpoints" if extraction.checkpoints else ""
    say(f"scores: {len(pairs)} failing eval rows, {settings.query} query, {settings.preconditioner} preconditioner"
        f"{over}")
    scores = score(settings, extraction, model, audit, pairs, bar=bar)

    harm = extraction.harm
    if how == "tokens":
        say("scores: each training row's harmful tokens, one forward-mode pass per batch")
        harm = row_harms(model, audit.rendered, direction, batch_size=settings.batch_size, bar=bar)
    ranking = rank_rows(settings.rank, scores.effects, model, audit, measured, pairs, harm=harm, row_harm=how,
                        repsim=extraction.repsim, batch_size=settings.batch_size)
    write_json(settings.out_dir / "ranking.json", ranking.to_dict())
    effects = ranking.effects  # the memory map itself for --rank gradient; shifted by relevance for combined
    say("clusters: grouping and naming the training rows")
    clusters = cluster(settings, audit, extraction.store, effects)

    def where_harm(ids: list[str]) -> dict[str, dict[str, Any] | None]:
        """The token where each of these rows does most harm (`scores.token_harm`)."""
        assert pairs is not None  # attribution ran
        rows = [audit.rendered[int(i)] for i in positions_of(ids_of(audit.examples), ids)]
        harms = token_harms(model, rows, direction, batch_size=settings.batch_size)
        return {row.example_id: harm_token(tokenizer, row, harm) for row, harm in zip(rows, harms, strict=True)}

    return _finish(settings, audit, summary, effects, clusters, pairs, extraction.tracin, measured=measured,
                   ranking=ranking, where_harm=where_harm)


def _finish(
    settings: AttributeSettings,
    audit: DiagnoseResult,
    summary: dict[str, Any],
    effects: np.ndarray | None,
    clusters: Clusters | None,
    pairs: list[QueryPair] | None,
    tracin: dict[str, Any] | None = None,
    *,
    measured: RegressionResult | None = None,
    ranking: Ranking | None = None,
    where_harm: Callable[[list[str]], dict[str, dict[str, Any] | None]] | None = None,
) -> AttributeResult:
    ids = ids_of(audit.examples)  # a StringColumn: no list of N ids
    effect = None if effects is None else total_effect(effects)  # (N,)
    labels = clusters.labels if clusters is not None else None
    failing = measured.failures() if measured is not None else []
    symptoms = classify_failures(failing, get_capability(settings.capability)) if measured is not None else None
    groups = candidate_groups(audit.examples, audit.findings, effects, clusters.summaries if clusters else None,
                              [row.prompt for row in failing], seed=settings.seed)
    summaries = groups.clusters  # the same clusters, each with where the failures sit
    verdict = decide(summary, audit.findings, summaries, effect, list(ids), symptoms=symptoms, groups=groups.groups)
    report = build_report(
        regression=summary, verdict=verdict, findings=audit.findings, examples=audit.examples, effects=effects,
        labels=labels, clusters=summaries, embedding=clusters.embedding if clusters is not None else None,
        settings=settings.to_dict(),
        run={"setup": audit.setup.to_dict(), "queries": [p.eval_id for p in pairs or []], "tracin_cp": tracin,
             "tokenizer_source": tokenizer_source(audit)},
        seed=settings.seed, symptoms=symptoms, groups=groups, ranking=ranking,
    )
    if where_harm is not None and report["top_rows"]:
        found = where_harm([row["id"] for row in report["top_rows"]])
        for row in report["top_rows"]:
            row["harm_token"] = found[row["id"]]
    rows = ExampleRows.of(ids, effect, labels, audit.findings, verdict.culprit_ids,
                          ranking.row_fields() if ranking is not None else None)
    paths = write_report(settings.out_dir, report, audit.examples, rows)
    return AttributeResult(verdict, report, paths)


@contextmanager
def main_lock(ranks: Ranks, out: Path) -> Iterator[None]:
    """Rank 0 holds the output folder's lock for the whole run; a refusal there stops every rank."""
    with ExitStack() as stack:
        ranks.main_only(lambda: stack.enter_context(output_lock(out)))
        yield


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
