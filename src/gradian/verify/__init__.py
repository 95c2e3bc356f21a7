"""`gradian verify`: retrain with the run's own recipe without the named rows, or with the named fix, and measure.

`verify(VerifySettings(report=DIR))` (see `gradian.verify.run`; the settings, light to import, in
`gradian.verify.settings`) writes `DIR/verify/<retrain>/` and `DIR/verification.json`. Heavy imports (TRL, PEFT)
load only when it runs.
"""

from __future__ import annotations

from typing import Any

__all__ = ["VerifySettings", "verify"]


def __getattr__(name: str) -> Any:
    if name == "VerifySettings":
        from gradian.verify.settings import VerifySettings

        return VerifySettings
    if name == "verify":
        from gradian.verify.run import verify

        return verify
    raise AttributeError(name)
