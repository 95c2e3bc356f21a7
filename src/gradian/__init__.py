"""Gradian: which training examples, or which setting, made a LoRA fine-tune worse at one thing.

The public API, each a function taking and returning plain objects (imported on first use, so `import gradian`
stays cheap for the CLI):

    from gradian import diagnose, attribute, AttributeSettings
    result = attribute(AttributeSettings(base_model=..., adapter=..., dataset=..., eval_dataset=...,
                                         capability="json_formatting", out="report/"))

and the stages `attribute` runs, in order, one call each (`gradian.stages`): `run_audit`, `load`, `prepare`,
`regression`, `queries`, `extract`, `score`, `rank`, `cluster`, `report`.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "diagnose": "gradian.audit",
    "attribute": "gradian.pipeline",
    "AttributeResult": "gradian.stages",
    "AttributeSettings": "gradian.settings",
    "ExtractSettings": "gradian.settings",
}
__all__ = ["AttributeResult", "AttributeSettings", "ExtractSettings", "attribute", "diagnose"]

if TYPE_CHECKING:
    from gradian.audit import diagnose
    from gradian.pipeline import attribute
    from gradian.settings import AttributeSettings, ExtractSettings
    from gradian.stages import AttributeResult


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'gradian' has no attribute {name!r}")
