"""One retrain: real TRL `SFTTrainer` + PEFT LoRA from the base model, with the run's recipe, in its own folder.

A retrain either trains on fewer rows (`rows`, what a user who drops them will see) or on every row with some of them
at zero loss weight (`zero_ids`: the run's seed, data order and step count kept, see `weighting`), optionally
replaying an explicit order (`order`: row indices per optimizer step). A run that tokenized its rows itself with EOS
appended after the cut (`add_eos_token`, which no SFTConfig field says) is retrained on its rows tokenized that way;
a LLaMA-Factory run on its rows as LLaMA-Factory's own code prepares them (`prepared_rows`).

    DIR/verify/<name>/            adapter_model.safetensors, adapter_config.json, tokenizer files, trainer_state.json,
                                  order.json (the row indices of every optimizer step, as trained)
    DIR/verify/<name>/retrain.json  the done marker, written last: the job's key, steps, wall time, capped or not
    DIR/verify/<name>.partial/    a retrain in progress (progress.json: the last step done); renamed to <name>/
                                  once finished

A finished retrain whose marker holds the same key (same rows, recipe, base, seed, fix and step cap) is reused; a killed
one leaves only `<name>.partial/`, which the next run deletes and starts again (a retrain of the tiny scenario
world takes seconds, so restarting is cheaper than trusting a half-written checkpoint).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from gradian.data.base_model import BaseModelRef
from gradian.data.examples import Example
from gradian.data.render import IGNORE, render_dataset
from gradian.data.setup import TrainingSetup
from gradian.data.trl_prepare import trl_columns
from gradian.errors import InputError, reason
from gradian.files import atomic_write
from gradian.verify.collator import PadMaskingCollator
from gradian.verify.recipe import Recipe, resolved_precision, training_kwargs

MARKER = "retrain.json"
PROGRESS = "progress.json"
# Part of every retrain's key: bumped when how Gradian retrains changes, so older retrains are not reused.
RETRAIN_VERSION = 4
ORDER = "order.json"
# Collators a recipe may name that Gradian can rebuild; TRL's own is used when the run named none.
TRL_COLLATORS = ("trl.DataCollatorForLanguageModeling", "trl.trainer.sft_trainer.DataCollatorForLanguageModeling")
PAD_MASKING = ("transformers.DataCollatorForLanguageModeling",
               "transformers.data.data_collator.DataCollatorForLanguageModeling")
Steps = Callable[[int, int], None]  # (steps done, steps in all)


@dataclass
class Retrain:
    """One retrain to run: a name (its folder), the rows it trains on, its seed and the settings it changes."""

    name: str
    rows: list[Example]
    seed: int
    changes: dict[str, Any] = field(default_factory=dict, metadata={"help": "SFTConfig fields the fix sets"})
    zero_ids: frozenset[str] = field(default_factory=frozenset,
                                     metadata={"help": "ids of rows kept in every batch at zero loss weight"})
    order: list[list[int]] | None = field(default=None, metadata={"help": "row indices per optimizer step to replay"})

    def zero_rows(self) -> frozenset[int]:
        return frozenset(i for i, e in enumerate(self.rows) if e.id in self.zero_ids)

    def key(self, recipe: Recipe, max_steps: int | None, base: BaseModelRef) -> str:
        """What the trained weights depend on; a finished retrain with another key is retrained. A row counts by
        its normalised fields and by the file's own columns, which TRL's preparation reads (`trl_columns`); the
        base by its files (`BaseModelRef.identity`), so a report attributed again on another base retrains."""
        spec = {"rows": [[e.id, e.fields, e.raw] for e in self.rows], "seed": self.seed, "changes": self.changes,
                "zero": sorted(self.zero_ids), "order": self.order, "base": base.identity(),
                "recipe": {"training": recipe.training, "lora": recipe.lora, "collator": recipe.collator},
                "max_steps": max_steps, "version": RETRAIN_VERSION}
        if recipe.eos_after_truncation:
            spec["tokenized"] = "EOS after the cut"
        if recipe.setup is not None:
            spec["prepared"] = recipe.setup.llamafactory
        return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()


def finished(folder: Path, key: str) -> dict[str, Any] | None:
    """The done marker of a finished retrain with `key`, else None."""
    try:
        marker = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and marker.get("key") == key else None


def retrain(
    job: Retrain,
    recipe: Recipe,
    base: BaseModelRef,
    root: Path,
    *,
    device: str = "cpu",
    max_steps: int | None = None,
    steps: Steps | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Train `job` into `root/job.name` (or reuse it) and return (its folder, its done marker)."""
    folder, staging = root / job.name, root / f"{job.name}.partial"
    key = job.key(recipe, max_steps, base)
    marker = finished(folder, key)
    if marker is not None:
        return folder, {**marker, "reused": True}
    shutil.rmtree(staging, ignore_errors=True)  # a killed retrain restarts from the start
    staging.mkdir(parents=True)
    started = time.monotonic()
    state = _train(job, recipe, base, staging, device=device, max_steps=max_steps, steps=_recorded(staging, steps))
    zero = len(job.zero_rows())
    marker = {"key": key, "name": job.name, "rows": len(job.rows) - zero,
              "zero_weight": zero, "seed": job.seed, "changes": job.changes,
              "device": device, "max_steps": max_steps, "capped": max_steps is not None,
              "global_step": state.global_step, "wall_s": round(time.monotonic() - started, 3),
              "train_loss": _last_loss(state.log_history)}
    atomic_write(staging / MARKER, json.dumps(marker, indent=2) + "\n")  # last: the folder is complete
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)
    return folder, {**marker, "reused": False}


def _train(job: Retrain, recipe: Recipe, base: BaseModelRef, out: Path, *, device: str, max_steps: int | None,
           steps: Steps) -> Any:
    """Train `job` into `out`: the adapter, trainer_state.json and order.json (the rows of every step)."""
    trainer = build_trainer(job, recipe, base, out, device=device, max_steps=max_steps, steps=steps)
    trainer.train()
    trainer.save_model(str(out))
    trainer.state.save_to_json(str(out / "trainer_state.json"))
    atomic_write(out / ORDER, json.dumps(trainer.steps_seen) + "\n")
    shutil.rmtree(out / "trainer", ignore_errors=True)
    return trainer.state


def build_trainer(job: Retrain, recipe: Recipe, base: BaseModelRef, out: Path, *, device: str = "cpu",
                  max_steps: int | None = None, steps: Steps | None = None) -> Any:
    """The loop itself is TRL's: SFTConfig from the recipe, LoraConfig from adapter_config.json, the run's collator,
    with `job.zero_ids` at zero loss weight and `job.order` replayed (`weighting.ZeroWeightTrainer`)."""
    import datasets
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback
    from trl import SFTConfig

    from gradian.verify.weighting import ZeroWeightTrainer

    tokenizer = AutoTokenizer.from_pretrained(base.path, **base.kwargs())
    model = AutoModelForCausalLM.from_pretrained(base.path, dtype=torch.float32, **base.kwargs())
    settings = resolved_precision({**training_kwargs(recipe), **job.changes}, device)
    if settings.get("pad_token"):
        tokenizer.pad_token = settings["pad_token"]  # before the collator is built: it masks this pad id
    if max_steps is not None:
        settings["max_steps"] = max_steps
    if device == "cpu":
        settings["fp16"] = False  # fp16 mixed precision needs a GPU; bf16 runs on CPU as the run recorded it
    if recipe.setup is not None:  # a LLaMA-Factory run: its own code prepares the rows
        job, rows, settings = prepared_rows(job, recipe.setup, tokenizer, settings)
    elif recipe.eos_after_truncation:
        rows, settings = tokenized_as_run(job.rows, tokenizer, settings)
    else:  # the file's own columns (roles, tools), as the run gave them to TRL
        rows = [trl_columns(e, str(settings.get("dataset_text_field") or "text"))[0] for e in job.rows]
    try:
        config = SFTConfig(output_dir=str(out / "trainer"), report_to="none", save_strategy="no", logging_steps=5,
                           seed=job.seed, use_cpu=device == "cpu", disable_tqdm=True, dataloader_num_workers=0,
                           **settings)
        lora = LoraConfig(task_type="CAUSAL_LM", **recipe.lora)
    except (TypeError, ValueError) as error:
        raise InputError(f"the run's recipe does not build a TRL SFTConfig / LoraConfig here ({reason(error)}); "
                         "Gradian cannot retrain it faithfully.") from None
    bars_were_on = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # library code draws no bars; the CLI's come through `steps`
    try:
        trainer = ZeroWeightTrainer(
            model=model, args=config, train_dataset=datasets.Dataset.from_list(rows),
            processing_class=tokenizer, peft_config=lora, data_collator=_collator(recipe, tokenizer),
            callbacks=[StepCallback(steps)] if steps is not None else None, zero_rows=job.zero_rows(),
            order=job.order)
    finally:
        if bars_were_on:
            datasets.enable_progress_bars()
    trainer.remove_callback(PrinterCallback)
    return trainer


def tokenized_as_run(examples: list[Example], tokenizer: Any,
                     settings: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The rows as the run's own pipeline tokenized them, and the settings to train them as given: TRL's tokenization
    (`data.render`, which mirrors it) cut at this retrain's max_length, then EOS appended, so a cut row still ends
    in a supervised EOS (`add_eos_token` with truncation). Under a fix that raises max_length no row is cut."""
    names = {f.name for f in fields(TrainingSetup)}
    setup = TrainingSetup(**{k: v for k, v in settings.items() if k in names}, eos_after_truncation=True)
    rows = [{"input_ids": r.input_ids, "completion_mask": [int(label != IGNORE) for label in r.labels]}
            for r in render_dataset(examples, tokenizer, setup)]
    return rows, {**settings, "completion_only_loss": True, "assistant_only_loss": False}  # the mask holds the loss


def prepared_rows(job: Retrain, setup: TrainingSetup, tokenizer: Any, settings: dict[str, Any]
                  ) -> tuple[Retrain, list[dict[str, Any]], dict[str, Any]]:
    """A LLaMA-Factory run's retrain on its rows as its own code prepares them (`data.llamafactory_code`: template,
    cutoff_len, train_on_prompt, and the rows max_samples and val_size leave out of this retrain's file), with the
    settings to train them as given. The job keeps only the rows it trains, so zero-weight ids still name them.
    A fix's max_length is the run's cutoff_len."""
    settings = dict(settings)
    cutoff = settings.pop("max_length", None)
    if "max_length" in job.changes:
        setup = replace(setup, llamafactory={**setup.llamafactory, "cutoff_len": cutoff}, max_length=cutoff)
    prepared = render_dataset(job.rows, tokenizer, setup)
    kept = [(e, r) for e, r in zip(job.rows, prepared, strict=True) if not r.dropped]
    rows = [{"input_ids": r.input_ids, "completion_mask": [int(label != IGNORE) for label in r.labels]}
            for _, r in kept]
    settings.update(completion_only_loss=True, assistant_only_loss=False, max_length=None, packing=False)
    return replace(job, rows=[e for e, _ in kept]), rows, settings


def _recorded(staging: Path, steps: Steps | None) -> Steps:
    """`steps`, plus `PROGRESS` in the staging folder: how far a retrain in progress (or a killed one) got."""

    def record(done: int, total: int) -> None:
        atomic_write(staging / PROGRESS, json.dumps({"step": done, "max_steps": total}) + "\n")
        if steps is not None:
            steps(done, total)

    return record


def _collator(recipe: Recipe, tokenizer: Any) -> Any:
    name = recipe.collator
    if name is None or name in TRL_COLLATORS:
        return None
    if name in PAD_MASKING:
        return PadMaskingCollator(tokenizer)  # transformers' LM collator on TRL's rows
    raise InputError(f"the run used the collator {name!r}, which Gradian cannot rebuild; it retrains runs with TRL's "
                     "collator or transformers.DataCollatorForLanguageModeling only.")


class StepCallback(TrainerCallback):
    """Reports (steps done, steps in all) after each optimizer step: the CLI turns it into a progress bar."""

    def __init__(self, steps: Steps) -> None:
        self.steps = steps

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.steps(0, state.max_steps)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.steps(state.global_step, state.max_steps)


def _last_loss(log: list[dict[str, Any]]) -> float | None:
    losses = [row["train_loss"] for row in log if "train_loss" in row]
    return float(losses[-1]) if losses else None
