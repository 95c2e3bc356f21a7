"""The audit: mechanical faults of a fine-tune, found from dataset, run folder and tokenizer in seconds.

`diagnose(...)` does everything; `run_checks(AuditContext)` runs the registered checks on rows already
rendered; `@check("name", category="per-row")` registers a new check, a function `(AuditContext) -> list[Finding]`
(categories: setup, stop, hyperparameter, per-row, run-wide; see `audit/registry.py`); `unregister_check("name")`
removes it again.
"""

from gradian.audit.context import AuditContext
from gradian.audit.diagnosis import DiagnoseResult, diagnose
from gradian.audit.finding import Finding, by_severity
from gradian.audit.registry import CHECKS, check, run_checks, unregister_check

__all__ = ["AuditContext", "CHECKS", "DiagnoseResult", "Finding", "by_severity", "check", "diagnose", "run_checks",
           "unregister_check"]
