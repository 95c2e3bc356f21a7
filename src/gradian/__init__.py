"""Gradian: which training examples, or which setting, made a LoRA fine-tune worse at one thing.

The public API, each a function taking and returning plain objects (imported on first use, so `import gradian`
stays cheap for the CLI):

    from gradian import diagnose, attribute, AttributeSettings
    result = attribute(AttributeSettings(base_model=..., adapter=..., dataset=..., eval_dataset=...,
                                         capability="json_formatting", out="report/"))

and the stages `attribute` runs, in order, one call each (`gradian.stages`): `run_audit`, `regression`,
`extract`, `score`, `cluster`, `report`.
"""

from __future__ import annotations

import sys
from importlib import import_module
from types import ModuleType
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "diagnose": "gradian.audit",
    "AttributeResult": "gradian.attribute",
    "AttributeSettings": "gradian.settings",
    "ExtractSettings": "gradian.settings",
    "GradianCallback": "gradian.callback",
}
__all__ = ["AttributeResult", "AttributeSettings", "ExtractSettings", "attribute", "diagnose"]

if TYPE_CHECKING:
    from gradian.attribute import AttributeResult, attribute
    from gradian.audit import diagnose
    from gradian.settings import AttributeSettings, ExtractSettings


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'gradian' has no attribute {name!r}")


class _Package(ModuleType):
    """`gradian.attribute` is the function: importing the module of that name (which binds it here) keeps it so."""

    @property
    def attribute(self) -> Any:
        return import_module("gradian.attribute").attribute

    @attribute.setter
    def attribute(self, value: Any) -> None:  # the import system binds the submodule; the function stays
        pass


sys.modules[__name__].__class__ = _Package
