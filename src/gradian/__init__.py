"""Gradian: which training examples, or which setting, made a LoRA fine-tune worse at one thing.

The public API, each a function taking and returning plain objects (imported on first use, so `import gradian`
stays cheap for the CLI):

    from gradian import diagnose, attribute, AttributeSettings
    result = attribute(AttributeSettings(base_model=..., adapter=..., dataset=..., eval_dataset=...,
                                         capability="json_formatting", out="report/"))

a plug-in's contract (`Capability` and `register_capability`; `check`, `AuditContext` and `Finding` for an audit
check; `unregister_capability` and `unregister_check`, with which a plug-in's test leaves the registry as it found
it), `verify` and its settings, and the stages `attribute` runs, in order, one call each (`gradian.stages`):
`run_audit`, `load`, `prepare`, `regression`, `queries`, `extract`, `score`, `rank`, `cluster`, `report`.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "diagnose": "gradian.audit",
    "attribute": "gradian.pipeline",
    "verify": "gradian.verify",
    "AttributeResult": "gradian.stages",
    "AttributeSettings": "gradian.settings",
    "ExtractSettings": "gradian.settings",
    "GradianCallback": "gradian.callback",
    "VerifySettings": "gradian.verify",
    "Capability": "gradian.capabilities",
    "register_capability": "gradian.capabilities",
    "get_capability": "gradian.capabilities",
    "check": "gradian.audit",
    "AuditContext": "gradian.audit",
    "Finding": "gradian.audit",
    "unregister_capability": "gradian.capabilities",
    "unregister_check": "gradian.audit",
}
__all__ = ["AttributeResult", "AttributeSettings", "AuditContext", "Capability", "ExtractSettings", "Finding",
           "GradianCallback", "VerifySettings", "attribute", "check", "diagnose", "get_capability",
           "register_capability", "unregister_capability", "unregister_check", "verify"]

if TYPE_CHECKING:
    from gradian.audit import AuditContext, Finding, check, diagnose, unregister_check
    from gradian.callback import GradianCallback
    from gradian.capabilities import Capability, get_capability, register_capability, unregister_capability
    from gradian.pipeline import attribute
    from gradian.settings import AttributeSettings, ExtractSettings
    from gradian.stages import AttributeResult
    from gradian.verify import VerifySettings, verify


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'gradian' has no attribute {name!r}")
