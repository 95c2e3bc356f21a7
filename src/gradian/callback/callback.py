"""`GradianCallback`: Gradian inside training. Preflight before step one, then the run record as training goes.

    trainer = SFTTrainer(..., callbacks=[GradianCallback()])   # or trainer.add_callback(GradianCallback())

At `on_train_begin` the callback audits the trainer's own objects (`preflight`) and stops the run on a critical
finding (`on_critical="warn"` only warns). It stores the trainer's own rows (tokens and loss mask, as its collator
makes them) in `output_dir/gradian_rows.safetensors`, which `diagnose` and `attribute` read instead of re-rendering
them. While training, it records the rows and learning rate of every optimizer step and writes `gradian_run.json`
into `output_dir` and each `checkpoint-N/` (`record`).
"""

from __future__ import annotations

import functools
import inspect
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from transformers import TrainerCallback

from gradian.callback.capture import StepCapture
from gradian.callback.preflight import (
    PreflightError,
    PreflightResult,
    finding_lines,
    preflight,
    read_trainer_rows,
    stop_message,
)
from gradian.callback.record import (
    RunRecorder,
    collator_pad_token,
    dataset_hashes,
    qualified_name,
    record_header,
    row_contents,
    world_size,
    write_rows,
)
from gradian.data.checkpoints import checkpoint_dir
from gradian.data.run_record import read_run_record
from gradian.errors import reason, write_crash_log
from gradian.gradients.settings import GradientSettings

TEXT_COLUMNS = ("prompt", "completion", "text")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


class CaptureSetupError(ValueError):
    """`capture=True` on a run it cannot capture (packed rows): raised at `on_train_begin`, before step one."""


Hook = Callable[..., None]


def guarded(hook: Hook) -> Hook:
    """A callback hook that never stops training on a fault of Gradian's: the fault turns the callback off for the rest
    of the run (`GradianCallback.fail`), and training goes on. Its own answers, a `PreflightError` on a critical
    finding and a `CaptureSetupError`, still stop the run before step one, as documented. Under torch.distributed
    with several processes a fault still stops the run: the record gathers every rank's rows each step, so one rank
    turned off alone would leave the others waiting for it."""

    @functools.wraps(hook)
    def run(self: GradianCallback, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.failure is not None:
            return
        try:
            hook(self, args, state, control, **kwargs)
            for part in (self.recorder, self.capture):  # a fault inside the model's forward or backward (`soft`)
                if part is not None and part.error is not None:
                    raise part.error
        except (PreflightError, CaptureSetupError):
            raise
        except Exception as error:  # noqa: BLE001 - any fault of Gradian's: reported in one line, training goes on
            if world_size() > 1:  # one rank turned off would leave the others waiting in the record's gather
                raise
            self.fail(error, args, state)

    return run


class GradianCallback(TrainerCallback):
    """Audit a run before its first step and record what it trained on (see the module docstring).

    `on_critical`: "stop" raises `PreflightError` with the first critical finding's sentence and fix; "warn" prints
    it and trains on. `preflight=False` skips the audit; `record=False` writes no `gradian_run.json` and no rows.
    `capture=True` also writes each step's per-example projected LoRA gradients (`callback.capture`; `capture_settings` are
    `gradient extract`'s settings: projection size and seed, store dtype). `echo` prints one line (default:
    standard error, main process only).
    """

    def __init__(self, *, on_critical: Literal["stop", "warn"] = "stop", preflight: bool = True, record: bool = True,
                 capture: bool = False, capture_settings: GradientSettings | None = None,
                 echo: Callable[[str], None] | None = None) -> None:
        if on_critical not in ("stop", "warn"):
            raise ValueError(f"on_critical must be 'stop' or 'warn', not {on_critical!r}")
        if capture and not record:
            raise ValueError("capture=True needs record=True: the record names the rows each step's gradients are of")
        self.capture_settings = capture_settings or GradientSettings() if capture else None
        self.capture: StepCapture | None = None
        self.on_critical = on_critical
        self.run_preflight = preflight
        self.run_record = record
        self.echo = echo or _stderr
        self.result: PreflightResult | None = None
        self.recorder: RunRecorder | None = None
        self.failure: str | None = None  # why the callback turned itself off (`fail`), else None

    def fail(self, error: Exception, args: Any, state: Any) -> None:
        """Turn the callback off after a fault of its own: its hooks come off the model, the record is written once
        more marked `failed` (readers refuse it, naming the step), and one line says so with the log holding the
        traceback. Training goes on."""
        log = write_crash_log(error)
        where = f"the traceback is in {log}" if log is not None else "no log file could be written"
        step = getattr(state, "global_step", 0)
        self.failure = (f"GradianCallback stopped at step {step} on an internal error ({type(error).__name__}: "
                        f"{reason(error)})")
        recorder, self.recorder, capture, self.capture = self.recorder, None, self.capture, None
        for part in (recorder, capture):
            if part is not None:
                try:
                    part.detach()
                except Exception:  # noqa: BLE001, S110 - already failing: the hooks come off as far as they can
                    pass
        if recorder is not None and state.is_world_process_zero:
            try:
                recorder.write(args.output_dir, complete=False, failed=self.failure)
            except OSError:
                pass
        self.echo(f"Gradian: {self.failure}; training goes on without the preflight, run record and capture from "
                  f"here; {where}; please report it with that file.")

    @guarded
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        trainer = calling_trainer()
        loader = kwargs.get("train_dataloader")
        dataset = getattr(loader, "dataset", None) if loader is not None else None
        collator = getattr(loader, "collate_fn", None) if loader is not None else None
        if trainer is not None:
            collator = getattr(trainer, "data_collator", None) if collator is None else collator
            dataset = trainer.train_dataset if dataset is None else dataset
        tokenizer = trainer_tokenizer(kwargs.get("processing_class"), trainer, collator)
        if dataset is None or collator is None or tokenizer is None or not hasattr(dataset, "__len__"):
            self.echo("Gradian: no sized train dataset, collator or tokenizer in reach; preflight and record skipped.")
            return
        raw = getattr(trainer, "train_dataset", None)
        texts, ids = _texts_and_ids(raw if raw is not None and len(raw) == len(dataset) else None)
        trainer_class = qualified_name(trainer) or "unknown"
        model = kwargs.get("model")
        if self.run_preflight:
            self._preflight(state, dataset, collator, tokenizer, args, model, texts, ids, trainer_class)
        if self.run_record and model is not None:
            rows = None
            if state.is_world_process_zero:  # only the main process writes the record and its rows
                rows = self._write_rows(args, dataset, collator, tokenizer, raw, texts, ids, trainer_class)
            self._start_record(args, state, tokenizer, collator, dataset, ids, trainer_class, model, rows)

    def _preflight(self, state: Any, dataset: Any, collator: Any, tokenizer: Any, args: Any, model: Any,
                   texts: list[dict[str, Any]] | None, ids: list[str] | None, trainer_class: str) -> None:
        self.result = preflight(dataset, collator, tokenizer, args, model_config=getattr(model, "config", None),
                                adapter_config=_adapter_config(model), texts=texts, ids=ids,
                                trainer_class=trainer_class)
        if state.is_world_process_zero:
            found = self.result.findings
            self.echo(f"Gradian preflight: {len(found)} finding(s) over {len(self.result.rows.rendered)} rows "
                      f"in {self.result.seconds:.1f} s")
            for line in finding_lines(found):
                self.echo(f"  {line}")
        if self.result.critical and self.on_critical == "stop":
            raise PreflightError(stop_message(self.result.critical))

    def _write_rows(self, args: Any, dataset: Any, collator: Any, tokenizer: Any, raw: Any,
                    texts: list[dict[str, Any]] | None, ids: list[str] | None, trainer_class: str) -> dict[str, Any]:
        """Store the trainer's rows beside the record (preflight's, else read now); the record's reference."""
        if self.result is not None:
            rows = self.result.rows.rendered
        else:
            rows = read_trainer_rows(dataset, collator, tokenizer, args, texts=texts, ids=ids,
                                     trainer_class=trainer_class)[1].rendered
        eos = [token for token in dict.fromkeys((getattr(args, "eos_token", None), tokenizer.eos_token)) if token]
        field = getattr(args, "dataset_text_field", None) or "text"
        contents = row_contents(raw, field, eos) if raw is not None and len(raw) == len(rows) else [None] * len(rows)
        Path(args.output_dir).mkdir(parents=True, exist_ok=True)
        return write_rows(args.output_dir, rows, contents, eos_tokens=eos,
                          shuffled=bool(getattr(args, "shuffle_dataset", False)))

    def _start_record(self, args: Any, state: Any, tokenizer: Any, collator: Any, dataset: Any,
                      ids: list[str] | None, trainer_class: str, model: Any, rows: dict[str, Any] | None) -> None:
        findings = [f.to_dict() for f in self.result.findings] if self.result else []
        masks = self.result.setup.collator_masks_pad if self.result else None
        # preflight's setup already holds the collator's pad token
        pad = self.result.setup.pad_token if self.result else collator_pad_token(tokenizer, collator)
        header = record_header(trainer_class=trainer_class, args=args, tokenizer=tokenizer, collator=collator,
                               collator_masks_pad=masks, pad_token=pad, dataset_rows=len(dataset), ids=ids,
                               findings=findings, rows=rows)
        self.recorder = RunRecorder(header, dataset_hashes(dataset), resumed_steps(args, state))
        self.recorder.attach(model)
        if self.capture_settings is not None:
            if getattr(args, "padding_free", False) or getattr(args, "packing", False):
                raise CaptureSetupError("capture=True needs one dataset row per batch row; packing and padding_free "
                                        "put several rows in one sequence: turn them off or capture off")
            world = args.world_size if getattr(args, "average_tokens_across_devices", False) else 1
            self.capture = StepCapture(model, args.output_dir, self.capture_settings, rank=args.process_index,
                                       loss_scale=float(world))
            self.capture.attach(model)
            self.recorder.on_batch = self.capture.micro_batch

    @guarded
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.recorder is not None:
            self.recorder.begin_step(state.epoch)

    @guarded
    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.recorder is not None:
            self.recorder.optimizer_stepped(kwargs.get("optimizer"))
        if self.capture is not None and self.recorder is not None and self.recorder.current is not None:
            current = self.recorder.current
            self.capture.optimizer_stepped(state.global_step + 1, current["rows"], current["learning_rate"],
                                           kwargs["optimizer"])

    @guarded
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.recorder is not None:
            self.recorder.end_step(state.global_step)

    @guarded
    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.capture is not None:
            self.capture.flush()  # a checkpoint's steps are on disk before a resume can start from it
        if self.recorder is None or not state.is_world_process_zero:
            return
        for folder in (checkpoint_dir(args.output_dir, state.global_step), Path(args.output_dir)):
            if folder.is_dir():
                self.recorder.write(folder, complete=False)

    @guarded
    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.capture is not None:
            self.capture.detach()
            if self.capture.problem:
                self.echo(f"Gradian: captured gradients are incomplete: {self.capture.problem}.")
        if self.recorder is None:
            return
        self.recorder.detach()
        if state.is_world_process_zero:
            Path(args.output_dir).mkdir(parents=True, exist_ok=True)
            path = self.recorder.write(args.output_dir, complete=True)
            self.echo(f"Gradian: wrote {path} ({len(self.recorder.steps)} optimizer steps recorded)")


def calling_trainer() -> Any:
    """The `transformers.Trainer` whose training loop is calling back (callbacks are not handed the trainer)."""
    from transformers import Trainer

    frame = inspect.currentframe()
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, Trainer):
            return owner
        frame = frame.f_back
    return None


def trainer_tokenizer(processing_class: Any, trainer: Any, collator: Any) -> Any:
    """The tokenizer wherever the trainer keeps it: its processing class, its `tokenizer` (older transformers), or
    inside its collator (a plain `Trainer` given only `DataCollatorForLanguageModeling(tokenizer)`)."""
    inner = getattr(collator, "inner", None)  # a wrapper around transformers' collator
    places = (processing_class, getattr(trainer, "processing_class", None), getattr(trainer, "tokenizer", None),
              getattr(collator, "tokenizer", None), getattr(inner, "tokenizer", None))
    return next((place for place in places if place is not None), None)


def _texts_and_ids(dataset: Any) -> tuple[list[dict[str, Any]] | None, list[str] | None]:
    """The text columns the trainer kept beside the tokens (TRL keeps them) and an `id` column, when present."""
    names = list(getattr(dataset, "column_names", None) or [])
    if not names:
        return None, None
    ids = [str(i) for i in dataset["id"]] if "id" in names else None
    kept = [name for name in TEXT_COLUMNS if name in names]
    if not kept:
        return None, ids
    columns = {name: dataset[name] for name in kept}
    return [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)], ids


def _adapter_config(model: Any) -> dict[str, Any]:
    """The LoRA settings of a PEFT model, as adapter_config.json would hold them."""
    configs = getattr(model, "peft_config", None)
    if not isinstance(configs, dict) or not configs:
        return {}
    config = next(iter(configs.values()))
    try:
        return json.loads(json.dumps(config.to_dict(), default=lambda v: sorted(v) if isinstance(v, set) else str(v)))
    except (TypeError, ValueError):
        return {}


def resumed_steps(args: Any, state: Any) -> list[dict[str, Any]]:
    """On a resumed run, the steps the checkpoint's record already holds (the rest is recorded from here).

    Raises `InputError` naming the file when the checkpoint holds a record this Gradian does not read."""
    if not state.global_step:
        return []
    record = read_run_record(checkpoint_dir(args.output_dir, state.global_step))
    if record is None:
        return []
    return [s for s in record.steps
            if isinstance(s, dict) and isinstance(s.get("step"), int) and s["step"] <= state.global_step]
