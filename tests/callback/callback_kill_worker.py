"""A tiny SFTTrainer run with GradianCallback(capture=True) that SIGKILLs itself, for tests/callback/test_callback_capture.py.

    python tests/callback/callback_kill_worker.py OUT mid-write|between-stores

Every step is written as its own store (CHUNK_STEPS = 1). `mid-write`: the third store's write flags two of its rows
done, then the process is killed (what a kill between a write's rows leaves). `between-stores`: killed as step 3
begins, after the stores of steps 1 and 2 are complete. SIGKILL: no `finally`, no `atexit`, no flush.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from transformers import TrainerCallback

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: callback_runs, conftest

import gradian.callback.capture as capture  # noqa: E402
from callback_runs import sft_trainer, tickets  # noqa: E402
from gradian import GradianCallback  # noqa: E402
from gradian.gradients.settings import GradientSettings  # noqa: E402
from gradian.gradients.store import ShardFile  # noqa: E402


def kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class KillAtStep(TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == 3:
            kill()


def kill_in_third_write() -> None:
    written, calls = ShardFile.written, []

    def partly(self, local, features):
        calls.append(1)
        if len(calls) == 3:
            written(self, local[:2], features[:2])
            kill()
        written(self, local, features)

    ShardFile.written = partly


def main(out: Path, when: str) -> None:
    capture.CHUNK_STEPS = 1
    callbacks = [GradianCallback(capture=True, capture_settings=GradientSettings(proj_dim=64), echo=lambda _: None)]
    if when == "mid-write":
        kill_in_third_write()
    else:
        callbacks.append(KillAtStep())
    sft_trainer(out, tickets(16), callbacks=callbacks).train()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
