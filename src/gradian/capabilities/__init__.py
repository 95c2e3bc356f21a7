"""Capabilities: what "the fine-tune got worse at X" means, as a score of one output in [0, 1], and the JSON
reading they share with the audit. Below both the audit and the regression, which use them.

- `registry.py`: the `Capability` contract, the registry (`register_capability`, `unregister_capability`, `get_capability`) and the
  built-ins (`json_formatting`, `exact_match`, `contains`, `regex:`, `json_schema:`, `module:function` plug-ins);
- `repair.py`: the minimal-edit repair of a JSON object answer (the `repaired*` queries' y⁺);
- `json_text.py`: how far a cut JSON answer is from closed.
"""

from __future__ import annotations

from gradian.capabilities.registry import (
    PASS_SCORE,
    Capability,
    available_capabilities,
    get_capability,
    passed,
    register_capability,
    unregister_capability,
)

__all__ = ["PASS_SCORE", "Capability", "available_capabilities", "get_capability", "passed", "register_capability",
           "unregister_capability"]
