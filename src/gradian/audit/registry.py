"""Checks register like plug-ins: `@check("name")` on a function `(AuditContext) -> list[Finding]`.

Built-in families live one per module in this package and register on import, exactly as a
user's check would: `from gradian.audit.registry import check`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from gradian.audit.context import AuditContext
from gradian.audit.finding import Finding, by_severity

Check = Callable[[AuditContext], list[Finding]]
CHECKS: dict[str, Check] = {}
BUILT_IN = ("truncation", "dropped", "eos", "masking", "duplicates", "schedule", "template", "hyperparams", "adapter")


def check(name: str) -> Callable[[Check], Check]:
    """Register `function` under `name`; a second registration under the same name replaces the first."""

    def register(function: Check) -> Check:
        CHECKS[name] = function
        return function

    return register


def load_built_in() -> dict[str, Check]:
    for module in BUILT_IN:
        importlib.import_module(f"gradian.audit.{module}")
    return CHECKS


def run_audit(ctx: AuditContext, only: list[str] | None = None) -> list[Finding]:
    """Every registered check (or those in `only`) over `ctx`, most severe finding first."""
    findings: list[Finding] = []
    for name, function in load_built_in().items():
        if only is None or name in only:
            findings.extend(function(ctx))
    return by_severity(findings)
