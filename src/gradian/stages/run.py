"""The run's side: the output folder, the audit, the fine-tuned model, and the run files extraction reads
(optimizer.pt for Adam's scale, the checkpoints TracIn-CP sums over).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from gradian.audit import DiagnoseResult, diagnose
from gradian.curvature import scale_for
from gradian.errors import InputError
from gradian.gradients.distributed import Ranks
from gradian.gradients.extract import ParameterScale
from gradian.guard import inputs, refuse_overwrite
from gradian.lock import output_lock
from gradian.regression.loading import check_attributable, load_models
from gradian.scores.tracin import Checkpoint, checkpoint_weights
from gradian.settings import AttributeSettings, ExtractSettings
from gradian.stages.artifacts import ATTRIBUTE_WRITES, EXTRACT_WRITES, FINDINGS, Prepared, write_json
from gradian.stages.evidence import EosEvidence, eos_after_cut_evidence


@contextmanager
def output_folder(settings: ExtractSettings, ranks: Ranks | None = None) -> Iterator[Path]:
    """The output folder, created and locked for the run: rank 0 holds its lock, and a refusal there stops every
    rank (an unwritable folder fails at the lock). Before anything is created, no file the command writes may be
    one of its inputs or lie inside a folder it reads as a whole (`gradian.guard`)."""
    ranks = ranks or Ranks()
    out = settings.out_dir
    refuse_overwrite(out, ATTRIBUTE_WRITES if isinstance(settings, AttributeSettings) else EXTRACT_WRITES,
                     inputs(dataset=settings.dataset, base_model=settings.base_model, adapter=settings.adapter,
                            run=settings.run, config=settings.config,
                            eval_dataset=getattr(settings, "eval_dataset", None),
                            capability=getattr(settings, "capability", None)))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise InputError(f"cannot write there ({error.strerror}); choose another --out folder.", out) from None
    with ExitStack() as stack:
        ranks.main_only(lambda: stack.enter_context(output_lock(out)))
        yield out


def run_audit(settings: ExtractSettings, *, write: bool = True, evidence: EosEvidence | None = None) -> DiagnoseResult:
    """The audit (renders every row as trained); findings.json when `write`. With `evidence` that EOS followed the
    cut (`stages.evidence`), the rows are rendered so, and the audit says why."""
    overrides = {"eos_after_truncation": True} if evidence is not None and evidence.eos_after_cut else None
    audit = diagnose(settings.dataset, base_model=settings.base_model,
                     eval_dataset=getattr(settings, "eval_dataset", None), run=settings.run, config=settings.config,
                     overrides=overrides, capability=getattr(settings, "capability", None))  # extract: no capability
    audit.rendering_evidence = evidence.to_dict() if evidence is not None else None
    if write:
        write_json(settings.out_dir / FINDINGS, {"findings": [f.to_dict() for f in audit.findings],
                                                 "tokenizer_source": tokenizer_source(audit),
                                                 "rows_source": rows_source(audit),
                                                 "rendering_evidence": audit.rendering_evidence})
    return audit


def weigh_renderings(settings: ExtractSettings, audit: DiagnoseResult, model: Any, *,
                     write: bool = True) -> DiagnoseResult:
    """The audit again, on the rows as the fine-tune's own evidence says they were trained, when it disagrees with
    the settings' rendering (`stages.evidence`); else the audit as it was, with the evidence beside it."""
    evidence = eos_after_cut_evidence(audit, model)
    if evidence is None:
        return audit
    if evidence.eos_after_cut:
        return run_audit(settings, write=write, evidence=evidence)
    audit.rendering_evidence = evidence.to_dict()
    return audit


def rows_source(audit: DiagnoseResult) -> dict[str, Any] | None:
    """Where the audited rows came from: the run's record (as the trainer prepared them) or Gradian's renderer."""
    return audit.rows_source.to_dict() if audit.rows_source is not None else None


def tokenizer_source(audit: DiagnoseResult) -> dict[str, Any] | None:
    """Which tokenizer the audit read (the run's saved one, else the base model's), for findings and the report."""
    return audit.tokenizer_source.to_dict() if audit.tokenizer_source is not None else None


def load(settings: ExtractSettings, audit: DiagnoseResult,
         ranks: Ranks | None = None) -> tuple[Any, Any]:
    """(the fine-tuned model, its tokenizer) on this process's device; an adapter Gradian cannot attribute (DoRA,
    modules_to_save) is refused before anything loads, so before any generation."""
    folder = adapter_dir(settings, audit)
    check_attributable(folder)
    return load_models(audit.base_ref, folder, device=(ranks or Ranks()).device(settings.device), dtype=settings.dtype)


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
    return scale_for(settings.preconditioner, audit.run.optimizer_path if audit.run is not None else None, model,
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
