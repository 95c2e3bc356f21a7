"""Capture: each optimizer step's per-example projected LoRA gradients, taken from that step's own backward.

The hooks, projection and store are `gradient extract`'s (`gradients.hooks`, `gradients.projection`,
`gradients.store`). What differs is where the gradient comes from: the training backward, whose loss is the
batch's summed token NLL times a scale κ (1 / `num_items_in_batch`, times the world size when tokens are averaged
across devices), so each row's gradient is divided by κ and is, as in `extract`, the gradient of the row's summed
token NLL. κ is read where the loss is made: from the `num_items_in_batch` the Trainer hands the model, or, when
TRL computes the loss itself from the model's per-token `log_probs`, from the gradient that reaches them (−κ at
every supervised token). At the optimizer step the step's rows are scaled by its learning rate and, under Adam, by
1 / (√v̂ + ε) from the second moments the step itself just updated (v̂ bias-corrected), then projected and kept.
The kept steps are written as one store every `CHUNK_STEPS` steps, at each checkpoint save and at the end of
training (a store write costs milliseconds, a tiny model's whole step about ten):

    output_dir/gradian_capture/step-000001/     settings.json, ids.json (dataset indices, step after step), shards;
                                                settings.json's `captured` names each step, its rows and rate
    output_dir/gradian_capture/step-000001-rank-1/   under torchrun, every other rank's rows of those steps

A kill leaves the stores written before it complete (every checkpoint's steps among them, so a resumed run rewrites
only what it recomputes) and at most one store whose rows are not all flagged done (`captured_stores` names it).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from gradian.callback.record import soft
from gradian.curvature.adam import adam_inverse_sqrt
from gradian.data.run_record import RunRecord
from gradian.errors import InputError
from gradian.gradients.extract import feature_meta, ids_sha, make_projector
from gradian.gradients.hooks import LoraMatrix, capture_gradients, lora_matrices
from gradian.gradients.settings import GradientSettings
from gradian.gradients.store import FeatureStore, ShardWriter

CAPTURE_DIR = "gradian_capture"
CHUNK_STEPS = 32  # optimizer steps kept in memory between store writes


class KeptStep(NamedTuple):
    """A step's projected rows, kept until its store is written."""

    step: int
    ids: list[str]  # dataset indices, in feeding order
    features: np.ndarray  # (rows, dim)
    learning_rate: float


class StepCapture:
    """Per-example gradients of the rows each micro-batch fed, gathered over a step and written at its update."""

    def __init__(self, model: torch.nn.Module, out_dir: str | Path, settings: GradientSettings, *, rank: int = 0,
                 loss_scale: float = 1.0) -> None:
        self.matrices: list[LoraMatrix] = lora_matrices(model)
        self.projector = make_projector(model, settings, self.matrices)
        self.settings, self.root, self.rank, self.loss_scale = settings, Path(out_dir) / CAPTURE_DIR, rank, loss_scale
        self.batch: list[torch.Tensor | None] = [None] * len(self.matrices)  # (B, out, in) of the micro-batch
        self.step: list[list[torch.Tensor]] = [[] for _ in self.matrices]  # micro-batches of the current step
        self.kappa: float | None = None  # d(training loss) / d(summed token NLL) of the current micro-batch
        self.problem: str | None = None
        self.error: Exception | None = None  # the first fault of its hooks (`record.soft`)
        self.hooks = ExitStack()
        self.kept: list[KeptStep] = []  # steps not yet written
        self.adam = False

    def attach(self, model: torch.nn.Module) -> None:
        self.hooks.enter_context(capture_gradients(self.matrices, soft(self._on_grad, self)))
        self.hooks.callback(model.register_forward_hook(soft(self._outputs, self)).remove)

    def detach(self) -> None:
        self.hooks.close()
        self.flush()

    def _on_grad(self, index: int, grads: torch.Tensor) -> None:
        """One LoRA matrix's per-example gradients of the training loss, (B, out, in); a module used twice adds."""
        grads = grads.detach()
        previous = self.batch[index]
        self.batch[index] = grads if previous is None else previous + grads

    def micro_batch(self, inputs: dict[str, Any]) -> None:
        """A micro-batch is about to be fed: close the previous one, note this one's `num_items_in_batch`."""
        self._close_batch()
        items = inputs.get("num_items_in_batch")
        self.kappa = self.loss_scale / float(items) if items is not None else None

    def _outputs(self, module: torch.nn.Module, args: Any, outputs: Any) -> None:
        """TRL's loss is −Σ log_probs · κ: the gradient reaching `log_probs` is −κ at every supervised token."""
        log_probs, mask = getattr(outputs, "log_probs", None), getattr(outputs, "label_mask", None)
        if not module.training or self.kappa is not None or log_probs is None or mask is None:
            return
        if isinstance(log_probs, torch.Tensor) and log_probs.requires_grad:
            log_probs.register_hook(soft(lambda grad: self._kappa_from(grad, mask.bool()), self))

    def _kappa_from(self, grad: torch.Tensor, mask: torch.Tensor) -> None:
        values = -grad[mask]  # (supervised tokens,)
        if values.numel() and not torch.allclose(values, values[0].expand_as(values)):
            self.problem = "the training loss weights tokens unequally (not summed NLL), so no row gradient is its NLL's"
        self.kappa = float(values[0]) if values.numel() else None

    def _close_batch(self) -> None:
        if all(part is None for part in self.batch):
            return
        if not self.kappa:
            self.problem = self.problem or ("the training loss's scale per row is unknown (no num_items_in_batch "
                                            "handed to the model, no per-token log_probs): capture needs TRL's "
                                            "SFTTrainer or a model that takes loss kwargs")
        factor = 1.0 / self.kappa if self.kappa else 0.0  # the row's summed token NLL, as `extract` stores it
        for index, part in enumerate(self.batch):
            if part is not None:
                self.step[index].append(part * factor)
        self.batch = [None] * len(self.matrices)

    def optimizer_stepped(self, global_step: int, rows: list[int | None], learning_rate: float,
                          optimizer: Any) -> None:
        """Scale and project the step's rows (dataset indices `rows`, this rank's, in feeding order) by the rate the
        update used (`learning_rate`, as the run record holds it) and the optimizer's Adam state; keep them."""
        self._close_batch()
        grads, self.step = self.step, [[] for _ in self.matrices]
        if self.problem is not None or not grads[0] or any(i is None for i in rows):
            return
        lr, adam = learning_rate, _adam_scales(optimizer, self.matrices)
        parts = []
        for index, pieces in enumerate(grads):
            g = torch.cat(pieces)  # (N, out, in): the step's rows, micro-batch after micro-batch
            g = g.float() if g.dtype in (torch.bfloat16, torch.float16) else g  # bf16 autocast: project in fp32
            scale = lr * adam[index].to(g) if adam is not None else torch.tensor(lr, dtype=g.dtype, device=g.device)
            parts.append(self.projector.project(index, g * scale))  # (N, k_m)
        features = torch.cat(parts, dim=1).cpu().numpy()  # (N, dim)
        if features.shape[0] != len(rows):
            self.problem = f"step {global_step} fed {len(rows)} rows but its backward gave {features.shape[0]}"
            return
        self.kept.append(KeptStep(global_step, [str(i) for i in rows], features, lr))
        self.adam = adam is not None
        if len(self.kept) >= CHUNK_STEPS:
            self.flush()

    def flush(self) -> None:
        """Write the kept steps as one store, named by its first step (nothing when none is kept)."""
        if not self.kept:
            return
        kept, self.kept = self.kept, []
        ids = [i for k in kept for i in k.ids]
        name = f"step-{kept[0].step:06d}" + (f"-rank-{self.rank}" if self.rank else "")
        meta = {**feature_meta(ids, self.settings, self.projector, "adam" if self.adam else "identity", self.matrices),
                "captured": {"steps": [k.step for k in kept], "rows": [len(k.ids) for k in kept],
                             "learning_rates": [k.learning_rate for k in kept], "loss": "summed token NLL per row",
                             "scaled_by": "learning_rate × 1/(√v̂ + ε)" if self.adam else "learning_rate"}}
        writer = ShardWriter(self.root / name, meta, ids, 0, 1, self.projector.dim)
        writer.write(list(range(len(ids))), np.concatenate([k.features for k in kept]))  # (rows of the steps, dim)


def _adam_scales(optimizer: Any, matrices: list[LoraMatrix]) -> list[torch.Tensor] | None:
    """1 / (√v̂ + ε) per LoRA matrix from the optimizer state after this step; None when it is not Adam."""
    inner = getattr(optimizer, "optimizer", optimizer)
    group = inner.param_groups[0]
    if "betas" not in group or "eps" not in group:
        return None
    beta2, eps = group["betas"][1], group["eps"]
    scales = []
    for matrix in matrices:
        state = inner.state.get(matrix.module.weight, {})
        if "exp_avg_sq" not in state:
            return None
        scales.append(adam_inverse_sqrt(state["exp_avg_sq"], float(state["step"]), beta2, eps))
    return scales


def captured_stores(run_dir: str | Path) -> list[FeatureStore]:
    """The complete stores of a captured run, in step order.

    Raises `InputError` in one sentence when a store was cut short by a kill: the run must resume from its last
    checkpoint with capture on (which rewrites that step), or the store be removed to use the steps before it.
    """
    root = Path(run_dir) / CAPTURE_DIR
    if not root.is_dir():
        raise InputError(f"holds no {CAPTURE_DIR}/; train with GradianCallback(capture=True) first.", run_dir)
    stores = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-")):
        store = FeatureStore(folder)
        if not store.complete:
            written = int(store.done.sum())
            raise InputError(f"was cut short by a kill ({written} of {store.n_rows} rows written); resume training "
                             f"from the last checkpoint with GradianCallback(capture=True), or delete this folder to "
                             f"use the steps before it.", folder)
        stores.append(store)
    return stores


def tracin_features(run_dir: str | Path, n_rows: int) -> np.ndarray:
    """(n_rows, dim) float64: each dataset row's captured features summed over the steps it trained at: with the
    final query q, the TracIn effect of row i is qᵀ of its row (learning rates and Adam scaling inside)."""
    return _summed(_complete_stores(run_dir), n_rows)


def step_slices(store: FeatureStore) -> list[tuple[int, slice]]:
    """Each step a store holds and the slice of its rows that step trained on."""
    captured = store.meta["captured"]
    ends = np.cumsum(captured["rows"]).tolist()
    return [(step, slice(end - n, end))
            for step, n, end in zip(captured["steps"], captured["rows"], ends, strict=True)]


def _complete_stores(run_dir: str | Path) -> list[FeatureStore]:
    stores = captured_stores(run_dir)
    if not stores:
        raise InputError(f"holds no captured step in {CAPTURE_DIR}/.", run_dir)
    return stores


def _summed(stores: list[FeatureStore], n_rows: int) -> np.ndarray:
    """(n_rows, dim) float64: the stores' rows added up by dataset index."""
    total = np.zeros((n_rows, stores[0].dim), np.float64)
    for store in stores:
        rows = np.asarray([int(i) for i in store.ids], dtype=np.int64)
        np.add.at(total, rows, store.rows(0, store.n_rows).astype(np.float64))
    return total


def captured_store(run_dir: str | Path, ids: Sequence[str], out: str | Path,
                   record: RunRecord | None = None) -> FeatureStore:
    """A feature store of the audited rows (`ids`, the training file's rows in order) at `out`: row i holds its
    captured features summed over the steps it trained at (`tracin_features`), so scoring it as `extract`'s store
    is scored gives TracIn over the run's own steps, learning rates and Adam scaling inside.

    The trainer's dataset indices are mapped by the recorded `id` column when the run had one, else by position,
    which needs the trainer to have trained on as many rows as the file holds; otherwise `InputError`.
    """
    stores = _complete_stores(run_dir)
    dataset = (record.data.get("dataset") or {}) if record is not None else {}
    # without a record: at least the rows captured
    trained_rows = dataset.get("rows") or max(len(ids), 1 + max(int(i) for store in stores for i in store.ids))
    positions = _positions(dataset.get("ids"), ids, trained_rows, record.path if record is not None else run_dir)
    by_index = _summed(stores, trained_rows)  # (trained rows, dim), the trainer's order
    features = np.zeros((len(ids), by_index.shape[1]), np.float32)  # (N, dim) in the file's order
    np.add.at(features, positions, by_index.astype(np.float32))
    first = stores[0].meta
    gradient = {**first["gradient"], "store_dtype": "float32"}  # a sum of float16 rows kept at full precision
    steps = len({step for store in stores for step in store.meta["captured"]["steps"]})  # ranks share steps
    meta = {**first, "gradient": gradient, "n_rows": len(ids), "captured": {"steps": steps},
            "ids_sha": ids_sha(ids)}
    writer = ShardWriter(Path(out), meta, list(ids), 0, 1, features.shape[1])
    writer.write(list(range(len(ids))), features)
    return FeatureStore(out)


def _positions(recorded: list[str] | None, ids: Sequence[str], trained_rows: int, where: str | Path) -> np.ndarray:
    """(trained rows,) the file row of each trainer dataset index."""
    if recorded is not None:
        position = {str(row_id): i for i, row_id in enumerate(ids)}
        missing = [row_id for row_id in recorded if str(row_id) not in position]
        if missing:
            raise InputError(f"trained on a row with id {missing[0]!r} that the dataset does not hold; pass the "
                             f"training dataset the run trained on.", where)
        return np.asarray([position[str(row_id)] for row_id in recorded], dtype=np.int64)
    if trained_rows != len(ids):
        raise InputError(f"trained on {trained_rows} rows but the dataset holds {len(ids)} (and the run had no id "
                         f"column to match them by); pass the training dataset the run trained on.", where)
    return np.arange(len(ids), dtype=np.int64)
