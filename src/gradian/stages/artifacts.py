"""What the stages hand one another: plain objects, each backed by an artifact in the output folder."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from gradian.clusters.cluster import Embedding
from gradian.clusters.summary import ClusterSummary
from gradian.files import atomic_write
from gradian.gradients.check import GradientCheck
from gradian.gradients.extract import GradientSettings, ParameterScale
from gradian.gradients.store import FeatureStore
from gradian.lock import LOCK_NAME
from gradian.regression.measure import GENERATIONS, SETTINGS, SUMMARY
from gradian.regression.training_noise import CACHE as TRAINING_NOISE
from gradian.report.writers import REPORT_FILES
from gradian.scores.queries import QueryPair
from gradian.scores.tracin import Checkpoint
from gradian.verdict import Verdict

Bar = Callable[[Iterable, str], Iterable]

# The artifacts' names in the output folder; a name ending in "/" is a folder a stage writes as a whole.
FINDINGS = "findings.json"
GRADIENTS, CHECKPOINT_GRADIENTS, CAPTURED_GRADIENTS = "gradients", "gradients-checkpoints", "gradients-captured"
PROJECTION_SHARES = "projection-shares.json"
SCORES, SCORES_INDEX, RANKING = "scores.npy", "scores.json", "ranking.json"
EXTRACT_WRITES = (LOCK_NAME, f"{GRADIENTS}/", f"{CHECKPOINT_GRADIENTS}/", f"{CAPTURED_GRADIENTS}/", PROJECTION_SHARES)
ATTRIBUTE_WRITES = (*EXTRACT_WRITES, FINDINGS, GENERATIONS, SETTINGS, SUMMARY, TRAINING_NOISE, SCORES, SCORES_INDEX,
                    RANKING, *REPORT_FILES)


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
    check: GradientCheck | None = None  # the gradients' agreement with float32 unpadded ones; None: not checked

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


def write_json(path: Path, data: Any) -> None:
    atomic_write(path, json.dumps(data, indent=2, default=str))


def wrap(bar: Bar | None, label: str) -> Callable[[Iterable], Iterable] | None:
    return None if bar is None else (lambda items: bar(items, label))


@contextmanager
def late_bar(bar: Bar | None, label: str) -> Iterator[Callable[[int], Callable[[int], None]] | None]:
    """For a step that learns its total late (and may find its work kept): `opened(total)` opens a bar of `label`
    and gives the callable each batch calls with how many it finished; every bar opened closes on exit. None
    without a bar."""
    opened: list[Any] = []

    def open_bar(total: int) -> Callable[[int], None]:
        assert bar is not None
        ticks = bar(range(total), label)
        steps = iter(ticks)
        opened.append(ticks)

        def advance(n: int) -> None:
            for _ in range(n):
                next(steps, None)
        return advance

    try:
        yield open_bar if bar is not None else None
    finally:
        for ticks in opened:
            getattr(ticks, "close", lambda: None)()
