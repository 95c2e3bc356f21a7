"""The training rows' gradient features: extracted from the final adapter (and each TracIn-CP checkpoint), or
summed from what GradianCallback(capture=True) took in training.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gradian.audit import DiagnoseResult
from gradian.callback.capture import captured_store
from gradian.data.columns import ids_of
from gradian.errors import InputError
from gradian.gradients.check import GradientCheck, check_gradients, disagreement
from gradian.gradients.distributed import Ranks
from gradian.gradients.energy import share_budget
from gradian.gradients.extract import (
    GradientSettings,
    ParameterScale,
    extract_train_features,
    make_projector,
    project_sample,
)
from gradian.gradients.hooks import lora_matrices
from gradian.gradients.sides import SideTaker
from gradian.gradients.store import FeatureStore
from gradian.scores.query import Query
from gradian.scores.tracin import checkpoint_stores
from gradian.settings import ExtractSettings
from gradian.space import allocated, features_bytes, require_space, scores_bytes
from gradian.stages.artifacts import (
    CAPTURED_GRADIENTS,
    CHECKPOINT_GRADIENTS,
    GRADIENTS,
    PROJECTION_SHARES,
    Bar,
    Extraction,
    Prepared,
    wrap,
)
from gradian.stages.run import prepare


def extract(settings: ExtractSettings, audit: DiagnoseResult, model: Any, *, ranks: Ranks | None = None,
            bar: Bar | None = None, prepared: Prepared | None = None, query: Query | None = None) -> Extraction:
    """The training rows' features (final adapter, then every TracIn-CP checkpoint), this process's shard of each;
    with a `query`, its side stores too: each row's harmful positions along `query.harm_direction` from the final
    adapter's backward, and each row's RepSim to `query.states` from its forward (`gradients.sides`).

    Rank 0 computes the projection shares and broadcasts them with the energy pass's projected rows, and checks that
    the gradients as the run takes them agree with float32 unpadded ones (`check_extraction`; a disagreement stops
    every rank before the long pass); every rank writes its files of each store; a barrier after each store, so every
    rank returns complete stores.
    """
    ranks = ranks or Ranks()
    out = settings.out_dir
    if settings.checkpoints == "captured":
        return captured_extraction(settings, audit, ranks)
    scale, checkpoints, skipped = prepared or prepare(settings, audit, model)
    gradient = gradient_settings(settings)
    check_space(settings, audit, len(checkpoints))

    def shares() -> tuple[GradientSettings, Any]:
        taker = SideTaker(model, lora_matrices(model), direction=query.harm_direction if query else None,
                          representations=query.states if query else None)  # the sides from the same backward
        shared, sampled = share_budget(model, audit.rendered, gradient, settings.proj_budget, scale=scale,
                                       progress=wrap(bar, "projection shares"), cache=out / PROJECTION_SHARES,
                                       taker=taker)
        return shared, (project_sample(model, audit.rendered, sampled, shared, scale) if sampled else None)

    gradient, projected = ranks.main_only(shares, share=True)  # type: ignore[misc]
    check = ranks.main_only(lambda: check_extraction(settings, audit, model, gradient, scale), share=True)
    extract_train_features(model, audit.rendered, out / GRADIENTS, settings=gradient, shard=ranks.shard,
                           progress=wrap(bar, "gradients"), scale=scale, sampled=projected,
                           direction=query.harm_direction if query is not None else None,
                           representations=query.states if query is not None else None)
    del projected
    ranks.barrier()
    store = FeatureStore(out / GRADIENTS)  # every rank's files written
    stores = checkpoint_stores(model, audit.rendered, checkpoints, out / CHECKPOINT_GRADIENTS, settings=gradient,
                               shard=ranks.shard, progress=wrap(bar, "checkpoint gradients"), final_store=store,
                               barrier=ranks.barrier) if checkpoints else []
    return Extraction(store, gradient, scale, checkpoints, stores, skipped, check)


def check_extraction(settings: ExtractSettings, audit: DiagnoseResult, model: Any, gradient: GradientSettings,
                     scale: ParameterScale | None) -> GradientCheck | None:
    """A few rows' features as extraction takes them against float32 unpadded ones (`gradients.check`); raises
    `InputError` when they disagree. None with `--no-gradient-check` (or no trained row)."""
    if not settings.gradient_check:
        return None
    check = check_gradients(model, audit.rendered, gradient, scale=scale)
    if check is not None and not check.agrees:
        raise InputError(disagreement(check))
    return check


def gradient_settings(settings: ExtractSettings) -> GradientSettings:
    """What extraction runs with (the projection shares aside, which the energy pass sets)."""
    return GradientSettings(proj_dim=settings.proj_dim if settings.proj_dim is not None else
                            GradientSettings().proj_dim, seed=settings.seed, batch_size=settings.batch_size,
                            shard_rows=settings.shard_rows)


def check_projection(settings: ExtractSettings, model: Any) -> None:
    """Plan the projection before anything long, so a --proj-dim the adapter cannot take stops the run before any
    generation (`extract.make_projector` raises `InputError`)."""
    if settings.checkpoints != "captured":
        make_projector(model, gradient_settings(settings))


def check_space(settings: ExtractSettings, audit: DiagnoseResult, checkpoints: int, queries: int = 0) -> None:
    """Refuse before a long stage when the disk at --out cannot hold the feature stores (the final adapter's and one
    per TracIn-CP checkpoint) and, with `queries`, the (Q, N) scores; a resumed store's files count as written."""
    if settings.checkpoints == "captured":
        return  # the capture is summed into one store of the run's own dimension, written once
    gradient, rows, out = gradient_settings(settings), len(audit.rendered), settings.out_dir
    itemsize = np.dtype(gradient.store_dtype).itemsize
    needed = features_bytes(rows, gradient.proj_dim or 0, itemsize, 1 + checkpoints) + scores_bytes(queries, rows)
    require_space(out, needed, f"gradient extraction ({rows} rows × {gradient.proj_dim} values, {1 + checkpoints} "
                  f"store{'s' if checkpoints else ''}{', and the scores' if queries else ''})",
                  present=allocated(out / GRADIENTS, out / CHECKPOINT_GRADIENTS))


def captured_extraction(settings: ExtractSettings, audit: DiagnoseResult, ranks: Ranks) -> Extraction:
    """`--checkpoints captured`: each row's gradients as GradianCallback(capture=True) took them in training, summed
    over the steps it trained at (`callback.capture.captured_store`), in place of an extraction pass."""
    run = audit.run
    if run is None or run.path is None:
        raise InputError("--checkpoints captured reads the run folder's gradian_capture/; pass --run DIR.",
                         settings.adapter)
    path, record, out = run.path, run.record, settings.out_dir / CAPTURED_GRADIENTS
    ranks.main_only(lambda: captured_store(path, ids_of(audit.examples), out, record))
    ranks.barrier()
    store = FeatureStore(out)  # its settings hold the capture's projection: the queries are projected alike
    return Extraction(store, GradientSettings.from_dict(store.meta["gradient"]), None)
