"""What the fine-tune got wrong: the regression on the eval rows (and as served, when the served answers are given),
whether attribution goes on, and the queries made from the failing rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gradian.audit import DiagnoseResult
from gradian.capabilities import get_capability
from gradian.errors import InputError
from gradian.gradients.distributed import Ranks
from gradian.regression.loading import pick_device_dtype
from gradian.regression.measure import SETTINGS, RegressionResult, measure_regression
from gradian.regression.served import ServedAnswers, measure_served, read_served
from gradian.regression.serving_diff import ServedExport, differences, read_export
from gradian.regression.training_noise import checkpoint_band
from gradian.scores.activation import check_inputs
from gradian.scores.pairs import base_kind, query_pairs
from gradian.scores.queries import QueryPair
from gradian.scores.query import Query, failing_queries, query_gradients, query_states
from gradian.settings import AttributeSettings, row_harm_of
from gradian.stages.artifacts import Bar, Prepared, late_bar
from gradian.verdict.wording import difference_fix


def regression(settings: AttributeSettings, audit: DiagnoseResult, model: Any, tokenizer: Any, *,
               bar: Bar | None = None, ranks: Ranks | None = None) -> RegressionResult | None:
    """Generate with the base and the fine-tuned model on the eval rows and measure the capability's drop (rank 0;
    None on the other ranks)."""
    return (ranks or Ranks()).main_only(lambda: _measure(settings, audit, model, tokenizer, bar))


def _measure(settings: AttributeSettings, audit: DiagnoseResult, model: Any, tokenizer: Any,
             bar: Bar | None) -> RegressionResult:
    with late_bar(bar, "generating") as progress:  # measure_regression says how many answers each batch finished
        return measure_regression(
            model, tokenizer, audit.eval_examples or [], get_capability(settings.capability), audit.setup,
            settings.out_dir, max_new_tokens=settings.max_new_tokens, batch_size=settings.generation_batch_size,
            progress=progress(2 * len(audit.eval_examples or [])) if progress is not None else None,
            seed=settings.seed, min_effect=settings.min_effect,
        )


@dataclass
class ServedInputs:
    """What the user gave of the served path, read and checked before anything is generated."""

    answers: ServedAnswers
    export: ServedExport | None
    model: str | None


def served_inputs(settings: AttributeSettings, audit: DiagnoseResult) -> ServedInputs | None:
    """The served answers (checked against the eval row ids) and the served folder; None without --served-outputs."""
    if settings.served_outputs is None:
        return None
    ids = [example.id for example in audit.eval_examples or []]
    answers = read_served(settings.served_outputs, settings.served_base_outputs, ids)
    export = read_export(settings.served_model) if settings.served_model is not None else None
    return ServedInputs(answers, export, settings.served_model)


def served(settings: AttributeSettings, audit: DiagnoseResult, measured: RegressionResult | None, tokenizer: Any,
           given: ServedInputs | None, ranks: Ranks | None = None) -> dict[str, Any] | None:
    """report.json's `served` block (rank 0; None without the served answers): the served answers' regression beside
    the training path's, and every way the served path differs from it, each with its fix."""
    if given is None or measured is None:
        return None

    def measure() -> dict[str, Any]:
        assert measured is not None and given is not None
        found = measure_served(measured, get_capability(settings.capability), given.answers,
                               min_effect=settings.min_effect, seed=settings.seed)
        device = str(pick_device_dtype((ranks or Ranks()).device(settings.device), None)[0])  # the export's weights
        diffs = differences(measured, found, given.export, audit.eval_examples or [], tokenizer, audit.setup,
                            get_capability(settings.capability), device)
        return {**found.to_dict(), "model": given.model,
                "differences": [{"rule": d.rule, "evidence": d.evidence,
                                 "fix": difference_fix({"rule": d.rule, "evidence": d.evidence})} for d in diffs]}

    return (ranks or Ranks()).main_only(measure)


def training_noise(settings: AttributeSettings, audit: DiagnoseResult, measured: RegressionResult, model: Any,
                   tokenizer: Any, *, bar: Bar | None = None) -> dict[str, Any] | None:
    """For a refusal: how far the capability moved from the run's last earlier checkpoint to the final adapter on the
    same prompts (`regression.training_noise`); None when the run folder keeps no earlier checkpoint."""
    limit = json.loads((settings.out_dir / SETTINGS).read_text(encoding="utf-8"))["max_new_tokens"]
    with late_bar(bar, "answers of the earlier checkpoint") as progress:
        return checkpoint_band(model, tokenizer, measured, get_capability(settings.capability), audit.run,
                               settings.out_dir, max_new_tokens=limit, batch_size=settings.generation_batch_size,
                               progress=progress)


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
        if settings.rank == "activation":
            check_inputs(measured.failures())  # before the gradients, which take long
        pairs = query_pairs(measured, get_capability(settings.capability), audit.eval_examples or [], tokenizer,
                            audit.setup, settings.query, model)
        if not pairs:
            raise InputError("no failing eval row has a correct answer to contrast with (no reference, and the base "
                             "model fails too); add reference answers to the eval set.", settings.eval_dataset)
        return pairs

    pairs = ranks.main_only(pairs_of) or []
    failing = failing_queries(measured, pairs) if measured is not None else []
    # v: the direction of the rows' harm and the report's tokens; every process needs it where its extraction's
    # backward gives the rows' harmful positions. From the same backward, the pairs' exact gradients, which the
    # scores project once the projection is known (rank 0 alone)
    direction, exact = ranks.main_only(lambda: query_gradients(model, pairs, base_kind(settings.query),
                                                               batch_size=settings.batch_size)) or (None, None)
    if row_harm == "positions":
        direction = ranks.broadcast(direction)
    # the failing queries' hidden states: the extraction's forward gives every row's RepSim to them (captured
    # gradients come with no forward: the ranking then takes RepSim in a pass of its own)
    states = ranks.main_only(lambda: query_states(model, failing, batch_size=settings.batch_size),
                             share=True) if settings.rank == "combined" and not captured else None
    return Query(pairs, failing, row_harm, direction, gradients=exact, states=states)
