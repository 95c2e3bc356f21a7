"""Checks register like plug-ins: `@check("name", category=...)` on a function `(AuditContext) -> list[Finding]`.

Built-in families live one per module in this package and register on import, exactly as a user's check would:
`from gradian.audit.registry import check`. A team's checks ship as a package with a `gradian.checks` entry point
(`gradian.plugins`), loaded with no flag. Every check declares its category, recorded on its findings, so the
verdict weighs a user's check like a built-in one:

- `setup`: a setting of the run (config, tokenizer, adapter) is wrong; fixing it is a retrain with another setting;
- `stop`: the run gives the model no way to learn where to stop (pad == eos masked away, EOS never supervised):
  it explains a regression only when the fine-tuned model runs on more than the base;
- `hyperparameter`: the step size (learning rate, LoRA alpha over rank) is out of range; it acts through the data,
  so it never makes a `setup` verdict, and when flagged it outranks a cluster whose rows carry no defect;
- `per-row`: some rows are wrong; the finding lists them, and they form a candidate group like a cluster;
- `run-wide`: the training as a whole went wrong (schedule, logged losses), not one setting nor some rows.

A check may also declare the symptoms of the failing answers its rows teach (`teaches`, names from
`regression.symptoms.SYMPTOMS`, or `ANY_SYMPTOM` for a check that applies the capability itself; a `stop` check
teaches `never-stops` unless it says otherwise), the severity from which its finding is positive evidence of a
run-wide cause (`cause_from`), and whether its rows only repeat other rows (`repeats`: a repeated row is a clean row
counted again, nothing wrong in it), and whether its rows only say how the eval was built (`measures`: a row that
asks an eval prompt is not wrong for it, and holding the eval out hides a regression rather than fixing it). The
verdict reads all five here (`category_of`, `teaches`, `cause_from`, `repeats`, `measures`), never a list of check
names.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType

from gradian.audit.context import AuditContext
from gradian.audit.finding import SEVERITIES, Finding, by_severity
from gradian.errors import InputError
from gradian.plugins import CHECKS as CHECK_GROUP
from gradian.plugins import load_group, plugin_code

Check = Callable[[AuditContext], list[Finding]]
CATEGORIES_KNOWN = ("setup", "stop", "hyperparameter", "per-row", "run-wide")
ANY_SYMPTOM = "any"
STOP_TEACHES = ("never-stops",)  # what a `stop` check's rows teach unless it declares otherwise
CHECKS: dict[str, Check] = {}
CATEGORIES: dict[str, str] = {}
TEACHES: dict[str, tuple[str, ...]] = {}
CAUSE_FROM: dict[str, str] = {}
REPEATS: dict[str, bool] = {}
MEASURES: dict[str, bool] = {}
BUILT_IN = ("truncation", "dropped", "eos", "masking", "duplicates", "schedule", "template", "hyperparams", "adapter",
            "capability", "fields", "markers")
BUILT_IN_CATEGORIES = {
    "truncation": "per-row", "dropped_overlong": "per-row", "cut_in_data": "per-row", "missing_eos": "stop",
    "prompt_loss": "per-row", "no_loss": "per-row", "weight_ignored": "per-row", "duplicate": "per-row", "near_duplicate": "per-row",
    "train_eval_overlap": "per-row", "double_bos": "per-row", "fails_capability": "per-row", "missing_fields": "per-row",
    "foreign_turn_marker": "per-row",
    "pad_eos_masking": "stop", "eos_after_cut": "setup", "packing_split": "setup", "chat_template_on_base": "setup", "untrained_added_tokens": "setup",
    "learning_rate": "hyperparameter", "lora_alpha_rank": "hyperparameter", "adapter_base_mismatch": "setup",
    "many_epochs": "run-wide", "eval_loss_rising": "run-wide", "loss_spike": "run-wide", "nan_in_logs": "run-wide",
}
# What the rows of each built-in check teach, beyond a `stop` check's `never-stops` (`missing_eos`, `pad_eos_masking`):
# a row cut in the data teaches stopping early; a target that fails the capability teaches whatever its failure is;
# a row cut by max_length teaches either; a row the max length cut and then ended in EOS (`eos_after_cut`) teaches
# stopping early; a row that leaves out fields its eval neighbours' answers have (`missing_fields`) teaches wrong fields;
# an answer closed (or opened) by another template's turn marker (`foreign_turn_marker`) teaches text after (or
# before) a complete answer.
BUILT_IN_TEACHES: dict[str, tuple[str, ...]] = {
    "cut_in_data": ("stops-early",), "truncation": ("stops-early", "never-stops"),
    "truncated_completion": ("stops-early", "never-stops"), "eos_after_cut": ("stops-early",),
    "fails_capability": (ANY_SYMPTOM,), "missing_fields": ("wrong-fields",),
    "foreign_turn_marker": ("never-stops", "wrapped"),
}
# `many_epochs` is evidence of a cause only when critical, the severity its check keeps for logs that show
# overfitting: many epochs alone explain nothing.
BUILT_IN_CAUSE_FROM = {"many_epochs": "critical"}
# Checks whose rows are copies of other rows: a step size far too high collapses toward what is repeated as toward
# any other pattern, so repetition alone does not explain a cluster (the verdict's rule 5): never its mechanism.
BUILT_IN_REPEATS = ("duplicate", "near_duplicate")
# Checks whose rows are about the measurement, not what the rows teach: never a cluster's mechanism either.
BUILT_IN_MEASURES = ("train_eval_overlap",)


def check(name: str, category: str | None = None, *, teaches: tuple[str, ...] | None = None,
          cause_from: str | None = None, repeats: bool | None = None,
          measures: bool | None = None) -> Callable[[Check], Check]:
    """Register `function` under `name` in `category` (one of CATEGORIES_KNOWN; built-ins have theirs listed
    above), with the symptoms its rows teach (`never-stops` for a `stop` check unless given), the severity from
    which it is evidence of a run-wide cause (`warning` unless given), whether the rows it names only repeat
    other rows, and whether they only say how the eval was built (both False unless given). A second registration
    under the same name replaces the first."""
    category = category or BUILT_IN_CATEGORIES.get(name)
    if category not in CATEGORIES_KNOWN:
        raise ValueError(f"check {name!r} must declare its category, one of {', '.join(CATEGORIES_KNOWN)}: "
                         f"@check({name!r}, category='per-row')")
    cause_from = cause_from or BUILT_IN_CAUSE_FROM.get(name, "warning")
    if cause_from not in SEVERITIES:
        raise ValueError(f"check {name!r}: cause_from must be one of {', '.join(SEVERITIES)}, not {cause_from!r}")
    taught = tuple(teaches) if teaches is not None else _default_teaches(name, category)
    repeated = bool(repeats) if repeats is not None else name in BUILT_IN_REPEATS
    measured = bool(measures) if measures is not None else name in BUILT_IN_MEASURES

    def register(function: Check) -> Check:
        CHECKS[name] = function
        CATEGORIES[name], TEACHES[name], CAUSE_FROM[name], REPEATS[name] = category, taught, cause_from, repeated
        MEASURES[name] = measured
        function.category = category  # type: ignore[attr-defined]
        function.teaches = taught  # type: ignore[attr-defined]
        function.cause_from = cause_from  # type: ignore[attr-defined]
        function.repeats = repeated  # type: ignore[attr-defined]
        function.measures = measured  # type: ignore[attr-defined]
        return function

    return register


def unregister_check(name: str) -> None:
    """Remove the check registered under `name`, with everything it declared: what a plug-in's test
    calls after itself so the next test sees the registry it found. A built-in's name removes the built-in for the
    rest of the process. A name nothing registered is a `ValueError`."""
    if name not in CHECKS:
        raise ValueError(f"no check is registered as {name!r}")
    for table in (CHECKS, CATEGORIES, TEACHES, CAUSE_FROM, REPEATS, MEASURES):
        table.pop(name, None)


def category_of(finding: Finding) -> str:
    """The category a finding's check registered (recorded on the finding by `run_checks`), else the built-in's,
    else `per-row` for a finding that names rows and `setup` for one that does not."""
    known = finding.category or CATEGORIES.get(finding.check) or BUILT_IN_CATEGORIES.get(finding.check)
    return known if known in CATEGORIES_KNOWN else ("per-row" if finding.per_example else "setup")


def teaches(check_name: str) -> tuple[str, ...]:
    """The symptoms the rows of `check_name` teach (ANY_SYMPTOM: whatever their own failure is); () if none."""
    if check_name in TEACHES:
        return TEACHES[check_name]
    return _default_teaches(check_name, BUILT_IN_CATEGORIES.get(check_name))


def _default_teaches(name: str, category: str | None) -> tuple[str, ...]:
    """What a check that declares nothing teaches: the built-in's, else `never-stops` for a `stop` check."""
    return BUILT_IN_TEACHES.get(name, STOP_TEACHES if category == "stop" else ())


def cause_from(check_name: str) -> str:
    """The severity from which a finding of `check_name` is positive evidence of a run-wide cause."""
    return CAUSE_FROM.get(check_name, BUILT_IN_CAUSE_FROM.get(check_name, "warning"))


def repeats(check_name: str) -> bool:
    """Whether the rows `check_name` names only repeat other rows (a clean row counted again)."""
    return REPEATS.get(check_name, check_name in BUILT_IN_REPEATS)


def measures(check_name: str) -> bool:
    """Whether the rows `check_name` names only say how the eval was built (a train row asking an eval prompt)."""
    return MEASURES.get(check_name, check_name in BUILT_IN_MEASURES)


def load_built_in() -> dict[str, Check]:
    """Every check: the built-ins, then those installed packages declare under the `gradian.checks` entry point."""
    for module in BUILT_IN:
        importlib.import_module(f"gradian.audit.{module}")
    for point, value in load_group(CHECK_GROUP):
        if isinstance(value, ModuleType):
            continue  # importing it registered its checks
        category = getattr(value, "category", None)
        if not callable(value) or category not in CATEGORIES_KNOWN:
            raise InputError(f"entry point {point.name!r} = {point.value!r} should name a module of @check functions "
                             f"or a function decorated with @check(name, category=...); fix its package.")
        if point.name not in CHECKS:
            check(point.name, category, teaches=getattr(value, "teaches", None),
                  cause_from=getattr(value, "cause_from", None), repeats=getattr(value, "repeats", None))(value)
    return CHECKS


def run_checks(ctx: AuditContext, only: list[str] | None = None) -> list[Finding]:
    """Every registered check (or those in `only`) over `ctx`, most severe finding first, each finding tagged with
    its check's category."""
    findings: list[Finding] = []
    for name, function in load_built_in().items():
        if only is None or name in only:
            for finding in _call(name, function, ctx):
                finding.category = finding.category or CATEGORIES[name]
                findings.append(finding)
    return by_severity(findings)


def _call(name: str, function: Check, ctx: AuditContext) -> list[Finding]:
    """A check's findings; a plug-in's check (one defined outside Gradian) runs as plug-in code: its prints on
    stderr, whatever it raises one sentence naming it."""
    if getattr(function, "__module__", "").startswith("gradian."):
        return function(ctx)
    with plugin_code(f"the plug-in check {name!r} ({getattr(function, '__module__', '?')})", "checking the rows"):
        return list(function(ctx))
