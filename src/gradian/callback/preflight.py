"""Preflight: the audit on the trainer's own objects, before step one. No config file, no guessing, no model pass.

The rows are the trainer's tokenized train dataset, each row's labels what its collator returns for it in a real
batch (`trainer_rows`); the settings are its args; the tokenizer its processing class. Every registered check
runs on them (`audit.registry.run_checks`), plus one only the tokens can show: rows a pre-tokenizing pipeline cut at its
max length and then ended with EOS (`eos_after_cut`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gradian.audit.context import AuditContext
from gradian.audit.finding import Finding, by_severity
from gradian.audit.registry import run_checks
from gradian.audit.truncation import eos_after_cut_finding, json_cut
from gradian.callback.record import collator_pad_id, package_version
from gradian.callback.trainer_rows import TrainerRows, collated_labels, token_columns, trainer_rows
from gradian.data.render import IGNORE, Rendered
from gradian.data.run_folder import RunInfo
from gradian.data.setup import TrainingSetup, preparation

BATCH_ROWS = 64  # rows per collator call: a real batch's worth, and enough that padding shows


class PreflightError(RuntimeError):
    """A critical finding, raised at `on_train_begin` so training stops before its first step."""


@dataclass
class PreflightResult:
    findings: list[Finding]
    setup: TrainingSetup
    rows: TrainerRows
    seconds: float

    @property
    def critical(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "critical"]

    @property
    def preparation(self) -> dict[str, Any]:
        """The rows are the running trainer's own (`data.setup.preparation` with `trainer_code`)."""
        return preparation(self.setup, trainer_code=True)


def training_setup(args: Any, tokenizer: Any, pad_id: int | None, trainer_class: str = "") -> TrainingSetup:
    """The rendering settings of the run, read from its args (an `SFTConfig` or `TrainingArguments`); `pad_id` is
    the collator's (`collator_pad_id`)."""
    trl = hasattr(args, "completion_only_loss") or "trl" in trainer_class.lower()
    version = package_version("trl" if trl else "transformers")
    return TrainingSetup(
        framework="trl" if trl else "transformers", framework_version=version,
        version_source="recorded by GradianCallback in the running trainer",
        max_length=getattr(args, "max_length", None), truncation_mode=getattr(args, "truncation_mode", "keep_start"),
        completion_only_loss=getattr(args, "completion_only_loss", None),
        assistant_only_loss=bool(getattr(args, "assistant_only_loss", False)),
        packing=bool(getattr(args, "packing", False)), padding_free=bool(getattr(args, "padding_free", False)),
        dataset_text_field=getattr(args, "dataset_text_field", None) or "text",
        eos_token=getattr(args, "eos_token", None),
        pad_token=tokenizer.convert_ids_to_tokens(pad_id) if pad_id is not None else None,
        learning_rate=args.learning_rate, num_train_epochs=args.num_train_epochs,
        per_device_train_batch_size=args.per_device_train_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        source="the running trainer (GradianCallback)", assumed=[], rows_from="trainer",
    )


def preflight(dataset: Any, collator: Any, tokenizer: Any, args: Any, *, model_config: Any = None,
              adapter_config: dict[str, Any] | None = None, texts: Sequence[dict[str, Any]] | None = None,
              ids: Sequence[str] | None = None, trainer_class: str = "") -> PreflightResult:
    """Audit a trainer's dataset (as tokenized), collator, tokenizer and args; findings most severe first."""
    start = time.perf_counter()
    setup, rows = read_trainer_rows(dataset, collator, tokenizer, args, texts=texts, ids=ids,
                                    trainer_class=trainer_class)
    run = RunInfo(path=None, adapter_config=adapter_config or {}, setup=setup)
    ctx = AuditContext(rows.examples, rows.rendered, tokenizer, setup, run, base_config=model_config)
    cut = eos_after_cut(ctx, rows)
    findings = run_checks(ctx)
    if cut:
        findings = _without_rows(findings, "cut_in_data", set(cut[0].example_ids)) + cut
    return PreflightResult(by_severity(findings), setup, rows, time.perf_counter() - start)


def read_trainer_rows(dataset: Any, collator: Any, tokenizer: Any, args: Any, *,
                      texts: Sequence[dict[str, Any]] | None = None, ids: Sequence[str] | None = None,
                      trainer_class: str = "") -> tuple[TrainingSetup, TrainerRows]:
    """The run's settings and its rows as trained: the tokenized dataset through its own collator (what preflight
    audits and the run record stores)."""
    pad_id = collator_pad_id(collator)
    setup = training_setup(args, tokenizer, pad_id, trainer_class)
    features = token_columns(dataset)
    labels = collated_labels(collator, features, max(BATCH_ROWS, args.per_device_train_batch_size))
    rows = trainer_rows(features, labels, tokenizer, setup, texts=texts, ids=ids, pad_id=pad_id)
    setup.collator_masks_pad = rows.masks_pad
    return setup, rows


def eos_after_cut(ctx: AuditContext, rows: TrainerRows) -> list[Finding]:
    """Rows exactly as long as the longest, ending in a supervised EOS, whose answer before it is cut mid-JSON:
    the pipeline tokenized with `truncation=True, max_length=N` and appended EOS after the cut."""
    trained = [r for r in ctx.rendered if not r.dropped]
    if not trained or ctx.eos_id is None:
        return []
    cap = max(len(r.input_ids) for r in trained)
    hits = [r.example_id for r in trained if len(r.input_ids) == cap and r.input_ids[-1] == ctx.eos_id
            and r.labels[-1] != IGNORE and _answer_cut(ctx.tokenizer.decode(r.input_ids[_answer_start(r) : -1]))]
    return [eos_after_cut_finding(hits, len(trained), cap, _longest_untruncated(rows))] if hits else []


def _answer_start(row: Rendered) -> int:
    """Where the answer starts: the first supervised token (a row rebuilt from tokens knows no prompt length)."""
    return next((i for i, label in enumerate(row.labels) if label != IGNORE), 0)


def _answer_cut(text: str) -> bool:
    """The JSON the text opens (after any prompt the labels kept) stops before it closes."""
    starts = [i for i in (text.find("{"), text.find("[")) if i >= 0]
    return bool(starts) and json_cut(text[min(starts):]) is not None


def _longest_untruncated(rows: TrainerRows) -> int | None:
    """The longest row before any cut, when every row's own text was there to measure; else None."""
    lengths = rows.untruncated
    return max(lengths) if lengths and all(n is not None for n in lengths) else None  # type: ignore[type-var]


def _without_rows(findings: list[Finding], check: str, ids: set[str]) -> list[Finding]:
    """`findings` with the rows `ids` taken out of `check`'s finding (they are explained by another one)."""
    out = []
    for finding in findings:
        if finding.check == check:
            kept = [i for i in finding.example_ids if i not in ids]
            if not kept:
                continue
            finding.example_ids = kept
        out.append(finding)
    return out


def stop_message(findings: list[Finding]) -> str:
    """What a stopped run says: the first critical finding's sentence and fix, in its own words."""
    first = findings[0]
    more = f" ({len(findings) - 1} more critical finding(s) printed above)" if len(findings) > 1 else ""
    return f"Gradian preflight stopped training before step one: {first.title}. Fix: {first.fix}.{more}"


def finding_lines(findings: list[Finding]) -> list[str]:
    """One line per finding, most severe first, as the callback prints them."""
    return [f"[{f.severity}] {f.check}: {f.title}. Fix: {f.fix}." for f in findings]
