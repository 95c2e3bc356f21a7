"""The verdict moved to the `gradian.verdict` package; this name stays for code that imports it from here."""

from gradian.verdict import KINDS, MIN_LIFT, Cause, Verdict, decide, number, pct

__all__ = ["KINDS", "MIN_LIFT", "Cause", "Verdict", "decide", "number", "pct"]
