"""How the report formats its numbers: shares as percentages, other numbers with 3 significant digits.

The verdict's sentences are in `gradian.verdict.wording`; this module only formats, for the verdict and the report
templates alike.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def pct(value: Any, *, signed: bool = False) -> str:
    """A share as a percentage with one decimal ("81.0%"), "n/a" when absent."""
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return "n/a"
    return f"{100 * float(value):+.1f}%" if signed else f"{100 * float(value):.1f}%"


def number(value: Any) -> str:
    """A number with 3 significant digits, "n/a" when absent."""
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return "n/a"
    return f"{float(value):.3g}"


RANKED_BY = {
    "gradient": "the gradient's harm (--rank gradient)",
    "combined": "the gradient's harm and the rows' relevance to the failing prompts (--rank combined)",
    "activation": "how each row's completion moves the base model's hidden state after layer {layer} the way the "
                  "fine-tune's failing answers do (--rank activation)",
}


def ranked_by(rank: str, activation: dict[str, Any] | None = None) -> str:
    """Which method ranked the rows, in words (report.json's `ranking.rank`, and its `activation.layer`)."""
    return RANKED_BY.get(rank, rank).format(layer=(activation or {}).get("layer", "?"))


RANKERS = {  # what tells the rows' harm apart, by the --rank whose effects clusters and verdict read: (subject, verb end)
    "gradient": ("the gradients", ""),
    "combined": ("the combined ranking (the gradients with the rows' relevance)", "s"),
    "activation": ("the activation ranking", "s"),
}


def ranker(rank: str | None) -> tuple[str, str]:
    """(subject, verb ending) for the method that ranked the rows: "the gradients" agree, "the activation ranking"
    agrees; no method recorded is the gradient's, an unknown one is named as given."""
    return RANKERS.get(rank or "gradient", (f"the {rank} ranking", "s"))


def not_told_apart(rank: str | None) -> str:
    """Equal effects, worded by the method that made them (`--rank`)."""
    who, s = ranker(rank)
    return f"{who} do{'es' if s else ''} not tell the rows apart, so no row is named from {'it' if s else 'them'}"
