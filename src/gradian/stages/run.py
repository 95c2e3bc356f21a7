"""The run's side: the output folder, the audit, the fine-tuned model, and the run files extraction reads
(optimizer.pt for Adam's scale, the checkpoints TracIn-CP sums over).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from gradian.audit import DiagnoseResult, diagnose
from gradian.curvature import parameter_scale as scale_of
from gradian.errors import InputError
from gradian.gradients.distributed import Ranks
from gradian.gradients.extract import ParameterScale
from gradian.lock import output_lock
from gradian.regression.loading import load_models
from gradian.scores.tracin import Checkpoint, checkpoint_weights
from gradian.settings import ExtractSettings
from gradian.stages.artifacts import Prepared, write_json


@contextmanager
def output_folder(settings: ExtractSettings, ranks: Ranks | None = None) -> Iterator[Path]:
    """The output folder, created and locked for the run: rank 0 holds its lock, and a refusal there stops every
    rank (an unwritable folder fails at the lock)."""
    ranks = ranks or Ranks()
    out = settings.out_dir
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise InputError(f"cannot write there ({error.strerror}); choose another --out folder.", out) from None
    with ExitStack() as stack:
        ranks.main_only(lambda: stack.enter_context(output_lock(out)))
        yield out


def run_audit(settings: ExtractSettings, *, write: bool = True) -> DiagnoseResult:
    """The audit (renders every row as trained); findings.json when `write`."""
    audit = diagnose(settings.dataset, base_model=settings.base_model,
                     eval_dataset=getattr(settings, "eval_dataset", None), run=settings.run, config=settings.config,
                     capability=getattr(settings, "capability", None))  # `gradian extract` scores no capability
    if write:
        write_json(settings.out_dir / "findings.json", {"findings": [f.to_dict() for f in audit.findings],
                                                        "tokenizer_source": tokenizer_source(audit)})
    return audit


def tokenizer_source(audit: DiagnoseResult) -> dict[str, Any] | None:
    """Which tokenizer the audit read (the run's saved one, else the base model's), for findings and the report."""
    return audit.tokenizer_source.to_dict() if audit.tokenizer_source is not None else None


def load(settings: ExtractSettings, audit: DiagnoseResult,
         ranks: Ranks | None = None) -> tuple[Any, Any]:
    """(the fine-tuned model, its tokenizer) on this process's device."""
    return load_models(audit.base_ref, adapter_dir(settings, audit), device=(ranks or Ranks()).device(settings.device),
                       dtype=settings.dtype)


def adapter_dir(settings: ExtractSettings, audit: DiagnoseResult) -> str:
    if settings.adapter:
        return settings.adapter
    if audit.run is not None and audit.run.adapter_dir is not None:
        return str(audit.run.adapter_dir)
    raise InputError("no adapter given; pass --adapter DIR (the folder with adapter_config.json).")


def prepare(settings: ExtractSettings, audit: DiagnoseResult, model: Any) -> Prepared:
    """The run files extraction reads (optimizer.pt, checkpoints), read early so a damaged one stops the run early."""
    return Prepared(parameter_scale(settings, audit, model), *tracin_checkpoints(settings, audit))


def parameter_scale(settings: ExtractSettings, audit: DiagnoseResult,
                    model: Any) -> ParameterScale | None:
    """Adam's scale from the run's optimizer.pt for `--preconditioner adam` (`curvature.adam`), else None."""
    return scale_of(settings.preconditioner, audit.run.optimizer_path if audit.run is not None else None, model,
                    settings.run or settings.adapter)


def tracin_checkpoints(settings: ExtractSettings,
                       audit: DiagnoseResult) -> tuple[list[Checkpoint], str | None]:
    """The checkpoints TracIn-CP sums over, and why none are used when `auto` falls back to the final adapter.

    `auto` uses them when the run has them and the preconditioner is identity: on the benchmark they recover the
    culprits a converged model no longer shows (its culprits' gradients are small once their failure is learned).
    """
    if settings.checkpoints in ("off", "captured"):
        return [], None
    run_path = audit.run.path if audit.run is not None else None
    if settings.checkpoints == "auto":
        if settings.preconditioner != "identity":
            return [], f"TracIn-CP uses the identity preconditioner, not {settings.preconditioner}"
        if run_path is None or audit.run is None or not audit.run.checkpoints:
            return [], "no run folder with checkpoint-*/ folders"
        try:
            return checkpoint_weights(run_path, audit.run.record), None
        except InputError as error:
            return [], str(error)
    if run_path is None:
        raise InputError("--checkpoints on needs the run folder with its checkpoint-*/ folders; pass --run DIR.",
                         settings.adapter)
    return checkpoint_weights(run_path, audit.run.record if audit.run is not None else None), None
