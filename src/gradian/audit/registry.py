"""Checks register like plug-ins: `@check("name", category=...)` on a function `(AuditContext) -> list[Finding]`.

Built-in families live one per module in this package and register on import, exactly as a user's check would:
`from gradian.audit.registry import check`. A team's checks ship as a package with a `gradian.checks` entry point
(`gradian.plugins`), loaded with no flag. Every check declares its category, recorded on its findings, so the
verdict weighs a user's check like a built-in one:

- `setup`: a setting of the run (config, tokenizer, adapter) is wrong; fixing it is a retrain with another setting;
- `per-row`: some rows are wrong; the finding lists them, and they form a candidate group like a cluster;
- `run-wide`: the training as a whole went wrong (schedule, logged losses), not one setting nor some rows.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType

from gradian.audit.context import AuditContext
from gradian.audit.finding import Finding, by_severity
from gradian.errors import InputError
from gradian.plugins import CHECKS as CHECK_GROUP
from gradian.plugins import load_group

Check = Callable[[AuditContext], list[Finding]]
CATEGORIES_KNOWN = ("setup", "per-row", "run-wide")
CHECKS: dict[str, Check] = {}
CATEGORIES: dict[str, str] = {}
BUILT_IN = ("truncation", "dropped", "eos", "masking", "duplicates", "schedule", "template", "hyperparams", "adapter",
            "capability")
BUILT_IN_CATEGORIES = {
    "truncation": "per-row", "dropped_overlong": "per-row", "cut_in_data": "per-row", "missing_eos": "per-row",
    "prompt_loss": "per-row", "no_loss": "per-row", "duplicate": "per-row", "near_duplicate": "per-row",
    "train_eval_overlap": "per-row", "double_bos": "per-row", "fails_capability": "per-row",
    "pad_eos_masking": "setup", "chat_template_on_base": "setup", "untrained_added_tokens": "setup",
    "learning_rate": "setup", "lora_alpha_rank": "setup", "adapter_base_mismatch": "setup",
    "many_epochs": "run-wide", "eval_loss_rising": "run-wide", "loss_spike": "run-wide", "nan_in_logs": "run-wide",
}


def check(name: str, category: str | None = None) -> Callable[[Check], Check]:
    """Register `function` under `name` in `category` (setup | per-row | run-wide; built-ins have theirs listed
    above). A second registration under the same name replaces the first."""
    category = category or BUILT_IN_CATEGORIES.get(name)
    if category not in CATEGORIES_KNOWN:
        raise ValueError(f"check {name!r} must declare its category, one of {', '.join(CATEGORIES_KNOWN)}: "
                         f"@check({name!r}, category='per-row')")

    def register(function: Check) -> Check:
        CHECKS[name] = function
        CATEGORIES[name] = category
        function.category = category  # type: ignore[attr-defined]
        return function

    return register


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
            check(point.name, category)(value)
    return CHECKS


def run_checks(ctx: AuditContext, only: list[str] | None = None) -> list[Finding]:
    """Every registered check (or those in `only`) over `ctx`, most severe finding first, each finding tagged with
    its check's category."""
    findings: list[Finding] = []
    for name, function in load_built_in().items():
        if only is None or name in only:
            for finding in function(ctx):
                finding.category = finding.category or CATEGORIES[name]
                findings.append(finding)
    return by_severity(findings)
