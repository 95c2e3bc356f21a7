"""The verdict: decision rules (`rules`, `causes`) with their thresholds (`thresholds`), the typed result (`types`)
and every sentence a user reads (`wording`); `decide` applies the rules in order."""

from gradian.verdict.decide import decide
from gradian.verdict.thresholds import MIN_LIFT
from gradian.verdict.types import KINDS, Cause, Verdict

__all__ = ["KINDS", "MIN_LIFT", "Cause", "Verdict", "decide"]
