"""Per-row numbers extraction takes from its own forward and backward, written beside the features.

- `positions/`: each row's harm from its harmful positions along a direction V, Σ_s max(0, h_s) with
  h_s = Σ_m g_{m,s}ᵀ V_m x_{m,s} (`hooks.capture_positions`, `scores.token_harm`), from the backward;
- `repsim/`: each row's RepSim to the failing queries, the cosine of its mean last hidden state (the output
  embeddings' input, padding masked, as `scores.relevance.mean_hidden_states` takes it) with each query's, from
  the forward (`cosine`, which `scores.relevance` uses for RepSim too).

Without them the ranking would pay one more backward pass and one more forward pass over every row. Each is a store
of its own (`store.ShardWriter`, float32, the features' file blocks), keyed by the features' settings and the bytes
of what it is taken along (the direction, the queries' hidden states): it resumes as the features do, one writer per
file under torchrun, and a store left for another query is never read as this one's.
"""

from __future__ import annotations

import hashlib
import typing
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np
import torch
from torch import nn

from gradian.gradients.hooks import LoraMatrix, capture_last_hidden, capture_positions, harmful_part
from gradian.gradients.store import FeatureStore, ShardWriter, fingerprint

POSITIONS, REPSIM = "positions", "repsim"


def digest(values: Sequence[torch.Tensor] | np.ndarray) -> str:
    """sha256 of the values' float64 bytes, in order."""
    hashed = hashlib.sha256()
    for value in values:
        array = value.detach().to("cpu", torch.float64).numpy() if isinstance(value, torch.Tensor) else \
            np.asarray(value, dtype=np.float64)
        hashed.update(array.tobytes())
    return hashed.hexdigest()


def side_meta(features_meta: dict[str, object], name: str, along: str, dim: int) -> dict[str, object]:
    """A side store's settings: which features, what it is taken along (a digest), its width; float32."""
    gradient = typing.cast(dict, features_meta["gradient"])
    return {"version": 1, "side": name, "features": fingerprint(features_meta), "along_sha256": along,
            "n_rows": features_meta["n_rows"], "projection": {"dim": dim},
            "gradient": {"shard_rows": gradient["shard_rows"], "store_dtype": "float32"}}


def cosine(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """(N, Q) cosine between the rows of `left` (N, d) and of `right` (Q, d); a zero row has cosine 0."""
    def unit(x: np.ndarray) -> np.ndarray:
        norms = np.linalg.norm(x, axis=1, keepdims=True)
        return np.divide(x, norms, out=np.zeros_like(x, dtype=np.float64), where=norms > 0)

    return unit(np.asarray(left, dtype=np.float64)) @ unit(np.asarray(right, dtype=np.float64)).T


class SideTaker:
    """The hooks that take each row's side numbers from a batch's forward and backward (none, either or both)."""

    def __init__(self, model: nn.Module, matrices: list[LoraMatrix], *, direction: list[torch.Tensor] | None = None,
                 representations: np.ndarray | None = None) -> None:
        self.model, self.matrices, self.direction = model, matrices, direction
        self.queries = representations  # (Q, d)
        queries = 0 if representations is None else len(representations)
        self.along = {name: digest(values) for name, values in ((POSITIONS, direction), (REPSIM, representations))
                      if values is not None}  # what each side is taken along
        self.widths = {name: width for name, width in ((POSITIONS, 1), (REPSIM, queries)) if name in self.along}
        self.parts: list[torch.Tensor] = []  # (B, T) per LoRA matrix: the positions' harm of the current batch
        self.hidden: list[torch.Tensor] = []  # (B, T, d): the last hidden states of the current batch

    def __bool__(self) -> bool:
        return bool(self.along)

    @property
    def every_logit(self) -> bool:
        """Whether a side reads the output layer's input at every position (RepSim's pooled states): the backward
        then projects every position, not the trained ones alone (`extract.lora_backward`)."""
        return REPSIM in self.along

    @contextmanager
    def hooks(self) -> Iterator[None]:
        with ExitStack() as stack:
            if self.direction is not None:
                stack.enter_context(capture_positions(self.matrices, self.direction, self.parts.append))
            if self.queries is not None:
                stack.enter_context(capture_last_hidden(self.model, self.hidden.append))
            yield

    def take(self, mask: torch.Tensor) -> dict[str, np.ndarray]:
        """After the batch's forward and backward: each side's (B, width); `mask` (B, T) the batch's padding."""
        values = {}
        if self.direction is not None:
            values[POSITIONS] = harmful_part(self.parts)[:, None].cpu().numpy()
        if self.queries is not None:
            hidden = self.hidden.pop()  # (B, T, d) the batch's one call of the output embeddings
            self.hidden.clear()
            weights = mask.to(hidden.device, hidden.dtype).unsqueeze(-1)  # (B, T, 1)
            pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)  # (B, d)
            values[REPSIM] = cosine(pooled.double().cpu().numpy(), self.queries)  # (B, Q)
        return values


class Sides:
    """The side stores one extraction writes (none, either or both), fed by a `SideTaker`'s hooks."""

    def __init__(self, taker: SideTaker, root: Path, meta: dict[str, object], ids: list[str],
                 shard: tuple[int, int]) -> None:
        self.taker = taker
        self.writers = {name: ShardWriter(root / name, side_meta(meta, name, along, taker.widths[name]), ids,
                                          *shard, taker.widths[name]) for name, along in taker.along.items()}

    def __bool__(self) -> bool:
        return bool(self.writers)

    def hooks(self) -> typing.ContextManager[None]:
        return self.taker.hooks()

    def is_done(self, rows: list[int]) -> bool:
        return all(writer.is_done(rows) for writer in self.writers.values())

    def write_zeros(self, rows: list[int]) -> None:
        """Rows never trained: no harm, no relevance."""
        self.write_values(rows, {name: np.zeros((len(rows), width), dtype=np.float32)
                                 for name, width in self.taker.widths.items()})

    def write(self, rows: list[int], mask: torch.Tensor) -> None:
        """After the batch's forward and backward: each side's (B, width) of `rows`; `mask` (B, T) its padding."""
        self.write_values(rows, self.taker.take(mask))

    def write_values(self, rows: list[int], values: dict[str, np.ndarray]) -> None:
        """Each side's (len(rows), width) of `rows`, taken already (the energy pass's rows)."""
        for name, writer in self.writers.items():
            if rows and not writer.is_done(rows):
                writer.write(rows, values[name])


def side_rows(store: FeatureStore, name: str, along: str, width: int) -> np.ndarray:
    """(N, width) float64 of side store `name` beside `store`, taken along `along` (a digest); raises InputError
    when extraction did not leave it (taken along something else, or not finished)."""
    side = FeatureStore(store.root / name, meta=side_meta(store.meta, name, along, width), ids=list(store.ids))
    return side.rows(0, side.n_rows).astype(np.float64)


def position_harms_of(store: FeatureStore, direction: list[torch.Tensor]) -> np.ndarray:
    """(N,) the rows' harmful positions along `direction`, as `extract_train_features(direction=)` left them."""
    return side_rows(store, POSITIONS, digest(direction), 1)[:, 0]


def repsim_of(store: FeatureStore, representations: np.ndarray) -> np.ndarray:
    """(N, Q) the rows' RepSim to the queries, as `extract_train_features(representations=)` left it."""
    return side_rows(store, REPSIM, digest(representations), len(representations))
