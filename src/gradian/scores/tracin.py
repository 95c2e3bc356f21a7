"""TracIn-CP: effects summed over the run's intermediate checkpoints, each weighted by its learning rate.

TracIn (Pruthi et al., 2020) follows one training row through the run: each step that trained on row i moved
the query's margin by −η_t q_tᵀ g_{t,i}. TracIn-CP approximates the sum over steps by a sum over the saved
checkpoints c, each standing for the steps since the previous one:

    e_{q,i} = Σ_c η_c · e_c(q, i) / Σ_c η_c          e_c = −q̂_cᵀ ĝ_{c,i}  (the default effect, at θ_c)

η_c = Σ_{t ∈ (step_{c−1}, step_c]} lr(t) = mean lr over those steps × their number: with every row visited
equally often per step, that is proportional to the learning rate row i saw while θ moved from c−1 to c.
With a run record (`gradian_run.json`, written by `GradianCallback`) lr(t) is each step's recorded learning rate;
without one it is linearly interpolated between the `learning_rate` entries of the final trainer_state.json's
`log_history` (held flat before the first and after the last), exact for linear and constant schedules.
Dividing by Σ η_c keeps effects on the scale of a single checkpoint's, so the verdict reads them the same way.

Queries and training gradients are recomputed at each checkpoint (and unit-normalised there, as by
default), so a checkpoint's raw gradient norm does not weigh it: only η_c does. The failing outputs the
queries contrast stay the final model's (what the user sees). Checkpoint weights are read from
`adapter_model.safetensors` only (nothing is unpickled) and loaded into the already-loaded PEFT model in
place; the model's own adapter weights are put back afterwards, also when something fails.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from gradian.data.checkpoints import CHECKPOINT, checkpoint_folders
from gradian.data.render import Rendered
from gradian.data.run_folder import newest_with
from gradian.data.run_record import RunRecord
from gradian.errors import InputError, reason
from gradian.files import read_json_object
from gradian.gradients.extract import extract_train_features
from gradian.gradients.hooks import lora_fingerprint
from gradian.gradients.point import adapter_name, restored_weights
from gradian.gradients.settings import GradientSettings
from gradian.gradients.store import FeatureStore
from gradian.scores.queries import QueryPair, query_features
from gradian.scores.scoring import score_features as score

ADAPTER_FILE = "adapter_model.safetensors"
STATE_FILE = "trainer_state.json"
Progress = Callable[[Iterable], Iterable]


@dataclass(frozen=True)
class Checkpoint:
    """One saved `checkpoint-N/` and the training it stands for: steps (previous checkpoint, N]."""

    path: Path  # the checkpoint folder, absolute
    step: int  # its global step N
    steps: int  # N − previous checkpoint's step
    mean_lr: float  # mean learning rate over those steps
    weight: float  # η_c = mean_lr × steps


def checkpoint_weights(run_dir: str | Path, record: RunRecord | None = None) -> list[Checkpoint]:
    """The run's `checkpoint-*/` folders with an adapter, sorted by step, each with its TracIn weight η_c (from the
    learning rates `record` holds, when the run was recorded)."""
    root = Path(run_dir).resolve()
    if not root.is_dir():
        raise InputError("no such run folder; point --run at the trainer's output_dir.", root)
    found = [(int(match.group(1)), folder) for folder in checkpoint_folders(root)
             if (match := CHECKPOINT.match(folder.name))]
    if not found:
        raise InputError("holds no checkpoint-*/ folders; TracIn-CP needs the checkpoints the trainer saved "
                         "(save_strategy), or run without --checkpoints.", root)
    for _, folder in found:
        _check_adapter_file(folder)
    rate_of = _recorded_rates(record) if record is not None else _logged_rates(_final_state(root, [f for _, f in found]))
    checkpoints, previous = [], 0
    for step, folder in found:
        if step <= previous:
            raise InputError("is at step 0; a checkpoint stands for the steps before it, so it needs a positive step.",
                             folder)
        per_step = rate_of(np.arange(previous + 1, step + 1))  # lr(t) for t in (previous, step]
        checkpoints.append(Checkpoint(folder, step, step - previous, float(per_step.mean()), float(per_step.sum())))
        previous = step
    return checkpoints


def _check_adapter_file(folder: Path) -> None:
    """The checkpoint holds a readable safetensors adapter (its header only is read here)."""
    path = folder / ADAPTER_FILE
    if not path.is_file():
        other = " (only adapter_model.bin, which Gradian does not unpickle)" if (folder / "adapter_model.bin").exists() \
            else ""
        raise InputError(f"has no {ADAPTER_FILE}{other}; save the checkpoints with safetensors or remove the folder.",
                         folder)
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            handle.keys()
    except Exception as error:
        raise InputError(f"could not read the checkpoint's adapter weights ({reason(error)}).", path) from None


def _final_state(root: Path, folders: list[Path]) -> Path:
    """The trainer_state.json written last: the run root's, else the newest checkpoint's."""
    folder = newest_with(root, folders, STATE_FILE)
    if folder is None:
        raise InputError(f"holds no {STATE_FILE}, so the learning rate of each checkpoint is unknown.", root)
    return folder / STATE_FILE


def _recorded_rates(record: RunRecord) -> Callable[[np.ndarray], np.ndarray]:
    """lr(t) as the run record holds it, step by step."""
    rates = record.learning_rates

    def rate_of(steps: np.ndarray) -> np.ndarray:
        missing = [int(s) for s in steps if int(s) not in rates]
        if missing:
            raise InputError(f"records no learning rate for step {missing[0]}, which a checkpoint stands for; the run "
                             f"was recorded only in part.", record.path)
        return np.array([rates[int(s)] for s in steps], dtype=np.float64)

    return rate_of


def _logged_rates(path: Path) -> Callable[[np.ndarray], np.ndarray]:
    """lr(t) linearly interpolated between the `learning_rate` entries of `log_history` (flat before the first and
    after the last)."""
    log = read_json_object(path, "the run folder looks damaged").get("log_history")
    points = sorted({(row["step"], float(row["learning_rate"])) for row in log or [] if isinstance(row, dict)
                     and _number(row.get("step")) and _number(row.get("learning_rate"))})
    if not points:
        raise InputError("logs no learning_rate in log_history, so the checkpoints cannot be weighted; "
                         "train with logging_steps set.", path)
    steps, lrs = (np.array(column, dtype=np.float64) for column in zip(*points, strict=True))
    return lambda at: np.interp(at, steps, lrs)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and bool(np.isfinite(value))


def load_checkpoint(model: nn.Module, checkpoint: Checkpoint | str | Path) -> None:
    """Load a checkpoint's LoRA weights into the PEFT `model` in place; every adapter weight must match."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    folder = checkpoint.path if isinstance(checkpoint, Checkpoint) else Path(checkpoint)
    _check_adapter_file(folder)
    path = folder / ADAPTER_FILE
    adapter = adapter_name(model)
    try:
        result: Any = set_peft_model_state_dict(model, load_file(str(path)), adapter_name=adapter)
    except Exception as error:  # a size mismatch: the checkpoint is from another adapter configuration
        raise InputError(f"does not fit the loaded adapter ({reason(error)}); is the checkpoint from this run?",
                         path) from None
    missing = [key for key in result.missing_keys if _is_adapter_key(key, adapter)]
    if result.unexpected_keys or missing:
        extra = (result.unexpected_keys or missing)[0]
        what = "has a weight the loaded adapter does not" if result.unexpected_keys else "lacks the adapter weight"
        raise InputError(f"{what} ({extra}); is the checkpoint from this run?", path)


def _is_adapter_key(key: str, adapter: str) -> bool:
    parts = key.split(".")
    return adapter in parts and any(part.startswith("lora_") for part in parts)


def checkpoint_stores(
    model: nn.Module,
    rendered: Sequence[Rendered],
    checkpoints: list[Checkpoint],
    store_root: str | Path,
    *,
    settings: GradientSettings,
    shard: tuple[int, int] = (0, 1),
    progress: Progress | None = None,
    final_store: FeatureStore | None = None,
    barrier: Callable[[], None] = lambda: None,
) -> list[FeatureStore]:
    """The training features at every checkpoint, `store_root/checkpoint-<step>`, this process writing `shard`.

    A checkpoint with the very weights of `final_store` (usually the last one) reads that store instead. Every
    checkpoint is loaded once before any gradient is computed, so a bad one stops the run at once. `barrier`
    waits for the other processes after each checkpoint's extraction (torch.distributed).
    """
    stores = []
    with restored_weights(model):
        for checkpoint in checkpoints:
            load_checkpoint(model, checkpoint)
        for checkpoint in checkpoints:
            load_checkpoint(model, checkpoint)  # θ ← θ_c
            if final_store is not None and _same_features(final_store, model, settings):
                stores.append(final_store)
                continue
            root = Path(store_root) / f"checkpoint-{checkpoint.step}"
            extract_train_features(model, rendered, root, settings=settings, shard=shard, progress=progress)
            barrier()
            stores.append(FeatureStore(root))  # (N, k) g_{c,i}, opened once every process has written its part
    return stores


def tracin_cp_effects(
    model: nn.Module,
    rendered: Sequence[Rendered],
    pairs: list[QueryPair],
    checkpoints: list[Checkpoint],
    store_root: str | Path,
    *,
    settings: GradientSettings,
    kind: str,
    unit_norm_train: bool = True,
    progress: Progress | None = None,
    final_store: FeatureStore | None = None,
    stores: list[FeatureStore] | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """(Q, N) TracIn-CP effects: Σ_c η_c · (effects at checkpoint c) / Σ_c η_c, identity preconditioner.

    Training features come from `stores` (one per checkpoint) or are extracted by `checkpoint_stores`. The sum
    is accumulated into `out` (e.g. the memory-mapped scores.npy) a chunk of rows at a time when given.
    """
    if not checkpoints:
        raise InputError("no checkpoints to sum over; pass a run folder with checkpoint-*/ folders.", store_root)
    total_weight = sum(checkpoint.weight for checkpoint in checkpoints)
    if not total_weight > 0:
        raise InputError("the checkpoints' learning rates sum to zero, so TracIn-CP has nothing to weigh.",
                         checkpoints[0].path.parent)
    if stores is None:
        stores = checkpoint_stores(model, rendered, checkpoints, store_root, settings=settings, progress=progress,
                                   final_store=final_store)
    with restored_weights(model):
        for index, (checkpoint, store) in enumerate(zip(checkpoints, stores, strict=True)):
            load_checkpoint(model, checkpoint)  # θ ← θ_c
            queries = query_features(model, pairs, kind=kind, settings=settings)  # (Q, k) q̂_c, unit norm
            out = score(store, queries, unit_norm_train=unit_norm_train, out=out, add=index > 0,
                        weight=checkpoint.weight / total_weight)  # (Q, N) += −η_c q̂_cᵀ ĝ_{c,i} / Σ η
    assert out is not None
    return out


def _same_features(store: FeatureStore | None, model: nn.Module, settings: GradientSettings) -> bool:
    """`store` holds, complete, the unscaled features of `model`'s current weights under `settings`."""
    return (store is not None and store.complete and store.meta["scale"] == "identity"
            and store.meta["gradient"] == settings.to_dict() and store.meta["adapter_sha256"] == lora_fingerprint(model))
