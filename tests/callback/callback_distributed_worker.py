"""A tiny SFTTrainer run with GradianCallback under torchrun, for tests/callback/test_callback_record.py.

    python -m torch.distributed.run --nproc-per-node 2 tests/callback/callback_distributed_worker.py OUT [capture]

Every rank logs the input ids of each batch its collator builds into OUT/batches-rank{R}.json; the callback writes
OUT/gradian_run.json (rank 0). With `capture`, the run is float64 and the callback captures every row's full
(unprojected) gradient, each rank into its own store (tests/callback/test_callback_capture.py).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: callback_runs, conftest

from callback_runs import sft_trainer, tickets  # noqa: E402
from gradian import GradianCallback  # noqa: E402
from gradian.gradients.settings import GradientSettings  # noqa: E402

EXACT = GradientSettings(proj_dim=None, store_dtype="float32")  # every LoRA weight, no projection


def main(out: Path, capture: bool) -> None:
    extra = {"dtype": torch.float64, "bf16": False} if capture else {}
    callback = GradianCallback(capture=capture, capture_settings=EXACT, echo=lambda _: None)
    trainer = sft_trainer(out, tickets(16), callbacks=[callback], per_device_train_batch_size=2, num_train_epochs=1,
                          ddp_backend="gloo", **extra)
    inner, batches = trainer.data_collator, []

    def logging(features):
        batches.append([list(f["input_ids"]) for f in features])
        return inner(features)

    trainer.data_collator = logging
    trainer.train()
    rank = int(os.environ.get("RANK", "0"))
    (out / f"batches-rank{rank}.json").write_text(json.dumps(batches))


if __name__ == "__main__":
    main(Path(sys.argv[1]), capture=sys.argv[2:] == ["capture"])
    # Skip the interpreter's teardown: freeing DDP's reducer destroys its gloo process group while holding the GIL,
    # and a gloo thread still freeing a finished barrier waits for that GIL, so the rank hangs (or, with the group
    # left open, aborts: "terminate called without an active exception"). torch's bug, not the callback's.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
