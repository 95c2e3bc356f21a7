"""Gradian inside the training loop: `GradianCallback` (preflight, run record) and the replay of a recorded order.

    from gradian import GradianCallback
    trainer = SFTTrainer(..., callbacks=[GradianCallback()])
"""

from gradian.callback.callback import GradianCallback
from gradian.callback.preflight import PreflightError, preflight
from gradian.data.replay import RecordedOrderSampler

__all__ = ["GradianCallback", "PreflightError", "RecordedOrderSampler", "preflight"]
