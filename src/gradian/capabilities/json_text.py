"""Reading an answer as JSON text, the part the audit (rows cut in the data) and the regression (how a failing
answer fails) share: how far a cut answer is from closed."""

from __future__ import annotations


def json_depth(text: str) -> tuple[int, bool]:
    """(open brackets left, inside a string) after reading `text` as JSON: how far a cut answer is from closed."""
    depth, in_string, escaped = 0, False, False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
    return depth, in_string
