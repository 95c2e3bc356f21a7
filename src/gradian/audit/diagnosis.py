"""`diagnose`: read the inputs, render the rows as trained, run every check. Tokenizer and config only.

A run recorded by `GradianCallback` gives its rows as the trainer prepared them (`data.prepared`): those are
audited, and only rows the record does not hold are rendered.

The tokenizer is the one training used: the run folder's saved one (TRL and Trainer save their processing
class beside the adapter) when it has one, the base model's only as a fallback; `tokenizer_source` says which.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gradian.audit.context import AuditContext
from gradian.audit.finding import Finding
from gradian.audit.registry import run_checks
from gradian.data.base_model import BaseModelRef, load_config, load_saved_tokenizer, load_tokenizer, resolve_base_model
from gradian.data.columns import ExampleColumns
from gradian.data.examples import Example, collect_dataset, read_dataset
from gradian.data.openai_format import carries_weights, openai_setup
from gradian.data.prepared import RowsSource, training_rows
from gradian.data.rendered_columns import RenderedColumns
from gradian.data.run_folder import RunInfo, read_run
from gradian.data.setup import TrainingSetup, preparation
from gradian.data.tokens import apply_training_tokens
from gradian.data.trl_prepare import Preparation
from gradian.errors import InputError

if TYPE_CHECKING:
    from gradian.capabilities import Capability

Say = Callable[[str], None]
COMPARED_TOKENS = ("eos_token", "pad_token", "bos_token")


@dataclass
class TokenizerSource:
    """Which tokenizer rendering and every check read, and how it differs from the base model's."""

    kind: str  # "run" (saved by the trainer) | "base_model"
    path: str
    differs_from_base: dict[str, list[Any]] = field(default_factory=dict)  # name -> [base model's, run's]

    def describe(self) -> str:
        if self.kind == "base_model":
            return f"the base model's ({self.path}); the run folder saved none"
        changes = ", ".join(f"{name} {base!r} → {run!r}" for name, (base, run) in self.differs_from_base.items())
        return f"the run's saved tokenizer ({self.path})" + (f"; differs from the base model's: {changes}"
                                                             if changes else "")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path, "differs_from_base": self.differs_from_base}


@dataclass
class DiagnoseResult:
    """Findings (most severe first) plus what they were computed from, so `attribute` can reuse the render."""

    findings: list[Finding]
    examples: ExampleColumns  # the training rows as columns: a Sequence[Example], no N Python objects held
    rendered: RenderedColumns  # `rendered[i]` is `examples[i]` as trained, a Sequence[Rendered]
    tokenizer: Any
    setup: TrainingSetup
    run: RunInfo | None
    eval_examples: list[Example] | None
    base_ref: BaseModelRef
    base_config: Any = None
    tokenizer_source: TokenizerSource | None = None
    rows_source: RowsSource | None = None  # the rows as the trainer prepared them (recorded), or rendered
    rendering_evidence: dict[str, Any] | None = None  # why the rows were rendered so, when the run's evidence chose

    def to_dict(self) -> dict[str, Any]:
        counts = {s: sum(f.severity == s for f in self.findings) for s in ("critical", "warning", "info")}
        return {
            "findings": [f.to_dict() for f in self.findings],
            "counts": counts,
            "rows": len(self.examples),
            "base_model": self.base_ref.spec,
            "tokenizer_source": self.tokenizer_source.to_dict() if self.tokenizer_source else None,
            "rows_source": self.rows_source.to_dict() if self.rows_source else None,
            "run": str(self.run.path) if self.run and self.run.path else None,
            "setup": self.setup.to_dict(),
            "preparation": preparation(self.setup),
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
    progress: Say | None = None,
    capability: str | Capability | None = None,
) -> DiagnoseResult:
    """Audit a fine-tune from its dataset, run folder/config and base model (tokenizer, config and embedding rows,
    never the whole model). With `capability`, the training completions are scored with it too."""
    say = progress or (lambda _: None)
    info = run if isinstance(run, RunInfo) else read_run(run, config, overrides)
    say("reading the dataset")
    field = info.setup.dataset_text_field  # TRL's dataset_text_field names the text column
    examples = _training_rows(dataset, text_field=field)
    eval_examples = _examples(eval_dataset, eval_set=True, text_field=field) if eval_dataset is not None else None
    ref = base_model if isinstance(base_model, BaseModelRef) else resolve_base_model(base_model)
    scorer = _capability(capability)
    say("loading the tokenizer")
    tokenizer, source = training_tokenizer(info, ref)
    base_config = load_config(ref)
    if info.path is None and info.setup.source is None and carries_weights(examples):
        info.setup = openai_setup(info.setup)  # no run folder, no settings: the file is OpenAI's format, its rule
    setup = info.setup
    _adopt_saved_tokens(setup, tokenizer, source)
    apply_training_tokens(tokenizer, setup, setup.source or ref.spec)
    say(f"reading {len(examples)} rows as trained" if info.record is not None else f"rendering {len(examples)} rows")
    tally = Preparation()
    rendered, rows_source = training_rows(examples, tokenizer, setup, info, tally)
    setup.rows_from, setup.prepared_by = rows_source.rows_from, tally.to_dict()
    say("running the checks")
    ctx = AuditContext(examples, rendered, tokenizer, setup, info, eval_examples, ref, base_config, capability=scorer)
    return DiagnoseResult(run_checks(ctx), examples, rendered, tokenizer, setup, info, eval_examples, ref, base_config,
                          source, rows_source)


def training_tokenizer(run: RunInfo, ref: BaseModelRef) -> tuple[Any, TokenizerSource]:
    """The run's saved tokenizer when it has one that loads, else the base model's; and which was read.

    A saved tokenizer that does not load is noted in `run.unreadable` and the base model's is read instead.
    """
    if run.tokenizer_dir is not None:
        try:
            saved = load_saved_tokenizer(run.tokenizer_dir)
        except InputError as error:
            run.unreadable.append(f"{error} The base model's tokenizer was read instead.")
        else:
            return saved, TokenizerSource("run", str(run.tokenizer_dir), _differences(saved, ref))
    return load_tokenizer(ref), TokenizerSource("base_model", ref.spec)


def _differences(saved: Any, ref: BaseModelRef) -> dict[str, list[Any]]:
    """What the trainer changed in the base model's tokenizer: special tokens, vocabulary size, chat template."""
    try:
        base = load_tokenizer(ref)
    except InputError:
        return {}  # the saved tokenizer is what training used; the comparison is only a courtesy
    out: dict[str, list[Any]] = {name: [getattr(base, name), getattr(saved, name)] for name in COMPARED_TOKENS
                                 if getattr(base, name) != getattr(saved, name)}
    if len(base) != len(saved):
        out["tokens"] = [len(base), len(saved)]
    if (base.chat_template or None) != (saved.chat_template or None):
        out["chat_template"] = ["the base model's" if base.chat_template else None,
                                "the run's own" if saved.chat_template else None]
    return out


def _adopt_saved_tokens(setup: TrainingSetup, tokenizer: Any, source: TokenizerSource) -> None:
    """The saved tokenizer records the EOS and pad the run trained with: they are no longer assumed, and an EOS
    or pad the trainer set in place of the base model's counts as the run's setting (as a config's would)."""
    if source.kind != "run":
        return
    for name in ("eos_token", "pad_token"):
        if getattr(setup, name) is None and name in source.differs_from_base:
            setattr(setup, name, getattr(tokenizer, name))
    setup.assumed = [name for name in setup.assumed if name not in ("eos_token", "pad_token")]


def _capability(capability: str | Capability | None) -> Capability | None:
    if capability is None or not isinstance(capability, str):
        return capability
    from gradian.capabilities import get_capability

    return get_capability(capability)


def _training_rows(value: str | Path | Sequence[Example], text_field: str = "text") -> ExampleColumns:
    """The training rows as columns, read a batch at a time (a file is never held as a list of `Example`s)."""
    if isinstance(value, ExampleColumns):
        return value
    if isinstance(value, (str, Path)):
        return collect_dataset(value, ExampleColumns.from_examples, text_field=text_field)
    return ExampleColumns.from_examples(value)


def _examples(value: str | Path | Sequence[Example], eval_set: bool, text_field: str = "text") -> list[Example]:
    if isinstance(value, (str, Path)):
        return read_dataset(value, eval_set=eval_set, text_field=text_field)
    return list(value)
