"""`gradian verify`: retrain with the run's own recipe without the named rows, or with the named fix, and measure.

`verify(VerifySettings(report=DIR))` (see `gradian.verify.run`) writes `DIR/verify/<retrain>/` and
`DIR/verification.json`. Heavy imports (TRL, PEFT) load only when it runs.
"""

from __future__ import annotations

from typing import Any

__all__ = ["VerifySettings", "verify"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from gradian.verify import run

        return getattr(run, name)
    raise AttributeError(name)
