"""The rows' effects on the failing queries (scores.npy) and their ranking (ranking.json)."""

from __future__ import annotations

from typing import Any

import numpy as np

from gradian.audit import DiagnoseResult
from gradian.curvature import fit_preconditioner
from gradian.gradients.sides import position_harms_of, repsim_of
from gradian.scores.activation import ActivationScores, activation_scores
from gradian.scores.combine import Ranking, rank_rows
from gradian.scores.pairs import base_kind
from gradian.scores.queries import query_features
from gradian.scores.query import Query
from gradian.scores.scoring import check_finite, effects_file, publish, score_features
from gradian.scores.token_harm import row_harms
from gradian.scores.tracin import tracin_cp_effects
from gradian.settings import AttributeSettings
from gradian.space import require_space, scores_bytes
from gradian.stages.artifacts import (
    CHECKPOINT_GRADIENTS,
    RANKING,
    SCORES,
    SCORES_INDEX,
    Bar,
    Extraction,
    Scores,
    late_bar,
    wrap,
    write_json,
)


def score(settings: AttributeSettings, extraction: Extraction, model: Any, audit: DiagnoseResult, query: Query, *,
          bar: Bar | None = None) -> Scores:
    """(Q, N) effects streamed into scores.npy (a memory map), with scores.json beside it."""
    out, store, pairs = settings.out_dir, extraction.store, query.pairs
    require_space(out, scores_bytes(len(pairs), store.n_rows), f"scoring ({len(pairs)} queries × {store.n_rows} rows)")
    effects = effects_file(out / SCORES, len(pairs), store.n_rows)
    kind = base_kind(settings.query)
    if extraction.checkpoints:
        tracin_cp_effects(model, audit.rendered, pairs, extraction.checkpoints, out / CHECKPOINT_GRADIENTS,
                          settings=extraction.gradient, kind=kind, unit_norm_train=settings.unit_norm_train,
                          stores=extraction.checkpoint_stores, out=effects)
    else:
        features = query_features(model, pairs, kind=kind, settings=extraction.gradient, exact=query.gradients)
        preconditioner = fit_preconditioner(settings.preconditioner, model, audit.rendered, extraction.gradient,
                                            damping=settings.damping, progress=wrap(bar, "curvature"))
        score_features(store, features, preconditioner=preconditioner, unit_norm_train=settings.unit_norm_train,
                       out=effects)
    effects = publish(effects, out / SCORES)
    check_finite(effects)  # NaN or inf: an internal error (exit 3), never a ranking
    write_json(out / SCORES_INDEX, {"ids": list(store.ids), "queries": [p.eval_id for p in pairs],
                                     "query": settings.query, "preconditioner": settings.preconditioner,
                                     "checkpoints": extraction.tracin["checkpoints"],
                                     "checkpoints_skipped": extraction.skipped})
    return Scores(effects, pairs)


def rank(settings: AttributeSettings, scores: Scores, extraction: Extraction, model: Any, audit: DiagnoseResult,
         query: Query, *, bar: Bar | None = None, tokenizer: Any = None) -> Ranking:
    """The rows ranked (`scores.combine`): by their harm, read as `query.row_harm` names it, with `--rank
    combined` by their relevance to the failing eval rows too, with `--rank activation` by their activation
    differences (`scores.activation`, the base's answers generated with `tokenizer`, else the audit's); ranking.json."""
    repsim = repsim_of(extraction.store, query.states) if query.states is not None else None  # (N, Q)
    activation = activation_of(settings, model, tokenizer or audit.tokenizer, audit, query, bar) \
        if settings.rank == "activation" else None
    ranking = rank_rows(settings.rank, scores.effects, model, audit, query.failing,
                        harm=harm_of_rows(settings, query, extraction, model, audit, bar), row_harm=query.row_harm,
                        repsim=repsim, activation=activation, batch_size=settings.batch_size)
    write_json(settings.out_dir / RANKING, ranking.to_dict())
    return ranking


def activation_of(settings: AttributeSettings, model: Any, tokenizer: Any, audit: DiagnoseResult, query: Query,
                  bar: Bar | None = None) -> ActivationScores:
    """Each row's activation cosine, the base's answers to the training prompts generated under a bar labelled
    `base answers` (none when they are kept in the output folder)."""
    with late_bar(bar, "base answers") as progress:
        return activation_scores(model, tokenizer, audit, query.failing, settings.out_dir,
                                 max_new_tokens=settings.max_new_tokens, batch_size=settings.batch_size,
                                 generation_batch_size=settings.generation_batch_size,
                                 progress=progress)


def harm_of_rows(settings: AttributeSettings, query: Query, extraction: Extraction, model: Any,
                 audit: DiagnoseResult, bar: Bar | None = None) -> np.ndarray | None:
    """(N,) each row's harm as `query.row_harm` names it: its harmful positions (from extraction's backward), its
    harmful tokens (one forward-mode pass, `scores.token_harm`); None for `sum`, the harm then −(mean effect)."""
    if query.row_harm == "sum" or query.direction is None:
        return None
    if query.row_harm == "positions":
        return position_harms_of(extraction.store, query.direction)
    return row_harms(model, audit.rendered, query.direction, batch_size=settings.batch_size, bar=bar)
