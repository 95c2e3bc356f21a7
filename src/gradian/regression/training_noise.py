"""A training-noise band from the run's own checkpoints, beside a refusal's noise band.

The paired test measures the prompts' noise: how large a drop these eval prompts can show by chance. It holds the
fine-tuned model fixed. Training has noise of its own: the same run a few steps earlier answers differently. Where
the run folder keeps a checkpoint from before the final adapter, that checkpoint's answers to the same prompts show
how far the capability moved over the run's last saved steps:

    moved = mean_q [ score_final(q) − score_checkpoint(q) ]        with the regression's paired test and interval

A drop no larger than `moved` is within the run's own movement over its last saved steps. That is not the seed's
share of training noise, and bounds it neither way: on nine refused tiny runs a reseeded retrain moved the final
capability more than the last epoch did on one run and less on three (BENCHMARKS.md). verify's reseeded retrain
measures the seed's share.

The checkpoint is the newest `checkpoint-N/` before the final step (trainer_state.json's `global_step`) whose
adapter weights differ from the final adapter's. Its answers are kept in `training_noise.json`, keyed by its
weights, the prompts and the token limit, so a rerun does not generate them again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError

from gradian.capabilities import Capability
from gradian.data.checkpoints import CHECKPOINT
from gradian.data.run_folder import RunInfo
from gradian.errors import InputError
from gradian.files import atomic_write
from gradian.regression.generation import GENERATION_BATCH, generate
from gradian.regression.measure import RegressionResult, scores_are_binary
from gradian.regression.statistics import change

CACHE = "training_noise.json"
WEIGHTS = "adapter_model.safetensors"
ADAPTER = "gradian-checkpoint"  # the name the checkpoint's adapter is loaded under, beside the final one


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def final_step(run: RunInfo | None) -> int | None:
    """The final adapter's step: trainer_state.json's `global_step`, None when the run folder does not record it."""
    step = (run.trainer_state or {}).get("global_step") if run is not None else None
    return step if isinstance(step, int) else None


def earlier_checkpoint(run: RunInfo | None) -> tuple[Path, int, str] | None:
    """The newest saved checkpoint before the final adapter, its step and its weights' sha256; None when the run
    keeps none."""
    if run is None or run.adapter_dir is None or not (run.adapter_dir / WEIGHTS).is_file():
        return None
    last = final_step(run)
    final = _sha256(run.adapter_dir / WEIGHTS)
    steps = [(int(found.group(1)), folder) for folder in run.checkpoints
             if (found := CHECKPOINT.match(folder.name)) and (folder / WEIGHTS).is_file()]
    for step, folder in sorted(steps, reverse=True):
        if (last is None or step < last) and (weights := _sha256(folder / WEIGHTS)) != final:
            return folder, step, weights
    return None


def checkpoint_band(model: Any, tokenizer: Any, measured: RegressionResult, capability: Capability, run: RunInfo | None,
                    out_dir: Path, *, max_new_tokens: int, batch_size: int = GENERATION_BATCH,
                    progress: Callable[[int], Callable[[int], Any]] | None = None) -> dict[str, Any] | None:
    """How far the capability moved from the run's earlier checkpoint to the final adapter (module docstring); None
    when the run keeps no earlier checkpoint. `model` is the PeftModel with the final adapter active; `progress(total)`,
    called once before generating (never when the answers are kept), gives the callable that gets the count of each
    batch generated."""
    found = earlier_checkpoint(run)
    if found is None:
        return None
    folder, step, weights = found
    prompts = [row.prompt_ids for row in measured.rows]
    key = {"weights": weights, "max_new_tokens": max_new_tokens,
           "prompts": hashlib.sha256(json.dumps(prompts).encode()).hexdigest()}
    cache = out_dir / CACHE
    try:
        cached = json.loads(cache.read_text(encoding="utf-8"))
        texts = cached["outputs"] if cached["key"] == key else None
    except (OSError, ValueError, KeyError, TypeError):
        texts = None
    if texts is None:
        texts = [answer.text for answer in _answers(model, tokenizer, folder, prompts, max_new_tokens, batch_size,
                                                    progress(len(prompts)) if progress is not None else None)]
        atomic_write(cache, json.dumps({"key": key, "outputs": texts}) + "\n")
    earlier = np.array([capability.score(text, row.reference) for text, row in zip(texts, measured.rows, strict=True)],
                       dtype=np.float64)  # (n,)
    final = np.array([row.finetuned_score for row in measured.rows], dtype=np.float64)  # (n,)
    moved = change(final, earlier, binary=scores_are_binary(capability, earlier, final))
    return {"source": "checkpoint", "checkpoint": folder.name, "step": step, "final_step": final_step(run),
            "checkpoint_rate": float(earlier.mean()), "moved": moved.delta, "ci_low": moved.ci[0],
            "ci_high": moved.ci[1]}


def _answers(model: Any, tokenizer: Any, folder: Path, prompts: list[list[int]], max_new_tokens: int,
             batch_size: int, progress: Callable[[int], Any] | None = None) -> list[Any]:
    """The checkpoint's greedy answers, its adapter loaded beside the final one and removed after."""
    active = model.active_adapter
    try:
        model.load_adapter(str(folder), adapter_name=ADAPTER)
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as error:
        if ADAPTER in model.peft_config:  # its config loaded before its weights failed
            model.delete_adapter(ADAPTER)
        model.set_adapter(active)
        raise InputError(f"this checkpoint does not load as a LoRA adapter of the base model ({error}); a refusal "
                         "measures the run's last earlier checkpoint beside it, so mend the folder or move it out of "
                         "the run folder.", folder) from None
    try:
        model.set_adapter(ADAPTER)
        return generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size,
                        progress=progress)
    finally:
        model.set_adapter(active)
        model.delete_adapter(ADAPTER)
