"""A capability: the answer is a bare "yes" or "no" (and, with a reference, the same one)."""

from __future__ import annotations

from gradian import Capability


class YesNo(Capability):
    """`yes_no` scores 1.0 for a bare yes/no answer; `yes_no:strict` also needs it to equal the reference."""

    name = "yes_no"
    binary = True

    def __init__(self, argument: str | None = None) -> None:
        self.strict = argument == "strict"

    def score(self, output: str, reference: str | None) -> float:
        answer = output.strip().rstrip(".").lower()
        if answer not in ("yes", "no"):
            return 0.0
        if self.strict and reference is not None:
            return float(answer == reference.strip().rstrip(".").lower())
        return 1.0
