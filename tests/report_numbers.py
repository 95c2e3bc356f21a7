"""The numbers a report shows, and the ways the report writers print each number of its JSON."""

from __future__ import annotations

import re

NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?%?(?![\w])")


def json_leaves(value):
    if isinstance(value, dict):
        for item in value.values():
            yield from json_leaves(item)
    elif isinstance(value, list):
        for item in value:
            yield from json_leaves(item)
    else:
        yield value


def renderings(value) -> set[str]:
    """The ways the report writers print a number of report.json."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return set(NUMBER.findall(value)) if isinstance(value, str) else set()
    out = {str(value), f"{value:.3g}", f"{100 * value:.1f}%", f"{100 * value:+.1f}%", f"{100 * value:.0f}%", f"{100 * value:g}%"}
    return out | {s.lstrip("+") for s in out}
