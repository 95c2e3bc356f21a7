"""`diagnose`: read the inputs, render the rows as trained, run every check. Tokenizer and config only."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradian.audit.context import AuditContext
from gradian.audit.finding import Finding
from gradian.audit.registry import run_audit
from gradian.data.base_model import BaseModelRef, load_config, load_tokenizer, resolve_base_model
from gradian.data.examples import Example, read_dataset
from gradian.data.render import Rendered, render_dataset
from gradian.data.run_folder import RunInfo, read_run
from gradian.data.setup import TrainingSetup
from gradian.data.tokens import apply_training_tokens

Progress = Callable[[str], None]


@dataclass
class DiagnoseResult:
    """Findings (most severe first) plus what they were computed from, so `attribute` can reuse the render."""

    findings: list[Finding]
    examples: list[Example]
    rendered: list[Rendered]
    tokenizer: Any
    setup: TrainingSetup
    run: RunInfo | None
    eval_examples: list[Example] | None
    base_ref: BaseModelRef
    base_config: Any = None

    def to_dict(self) -> dict[str, Any]:
        counts = {s: sum(f.severity == s for f in self.findings) for s in ("critical", "warning", "info")}
        return {
            "findings": [f.to_dict() for f in self.findings],
            "counts": counts,
            "rows": len(self.examples),
            "base_model": self.base_ref.spec,
            "run": str(self.run.path) if self.run and self.run.path else None,
            "setup": self.setup.to_dict(),
            "assumed": list(self.setup.assumed),
            "unreadable": list(self.run.unreadable) if self.run else [],
        }


def diagnose(
    dataset: str | Path | Sequence[Example],
    *,
    base_model: str | Path | BaseModelRef,
    eval_dataset: str | Path | Sequence[Example] | None = None,
    run: str | Path | RunInfo | None = None,
    config: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    progress: Progress | None = None,
) -> DiagnoseResult:
    """Audit a fine-tune from its dataset, run folder/config and base model (tokenizer + config, never weights)."""
    say = progress or (lambda _: None)
    info = run if isinstance(run, RunInfo) else read_run(run, config, overrides)
    say("reading the dataset")
    field = info.setup.dataset_text_field  # TRL's dataset_text_field names the text column
    examples = _examples(dataset, eval_set=False, text_field=field)
    eval_examples = _examples(eval_dataset, eval_set=True, text_field=field) if eval_dataset is not None else None
    ref = base_model if isinstance(base_model, BaseModelRef) else resolve_base_model(base_model)
    say("loading the tokenizer")
    tokenizer, base_config = load_tokenizer(ref), load_config(ref)
    setup = info.setup
    apply_training_tokens(tokenizer, setup, setup.source or ref.spec)
    say(f"rendering {len(examples)} rows")
    rendered = render_dataset(examples, tokenizer, setup)
    say("running the checks")
    ctx = AuditContext(examples, rendered, tokenizer, setup, info, eval_examples, ref, base_config)
    return DiagnoseResult(run_audit(ctx), examples, rendered, tokenizer, setup, info, eval_examples, ref, base_config)


def _examples(value: str | Path | Sequence[Example], eval_set: bool, text_field: str = "text") -> list[Example]:
    if isinstance(value, (str, Path)):
        return read_dataset(value, eval_set=eval_set, text_field=text_field)
    return list(value)
