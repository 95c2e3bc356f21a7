"""A tiny SFTTrainer run with GradianCallback under torchrun, for tests/callback/test_callback_record.py.

    python -m torch.distributed.run --nproc-per-node 2 tests/callback/callback_distributed_worker.py OUT

Every rank logs the input ids of each batch its collator builds into OUT/batches-rank{R}.json; the callback writes
OUT/gradian_run.json (rank 0).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: callback_runs, conftest

from callback_runs import sft_trainer, tickets  # noqa: E402
from gradian import GradianCallback  # noqa: E402


def main(out: Path) -> None:
    trainer = sft_trainer(out, tickets(16), callbacks=[GradianCallback(echo=lambda _: None)],
                          per_device_train_batch_size=2, num_train_epochs=1, ddp_backend="gloo")
    inner, batches = trainer.data_collator, []

    def logging(features):
        batches.append([list(f["input_ids"]) for f in features])
        return inner(features)

    trainer.data_collator = logging
    trainer.train()
    rank = int(os.environ.get("RANK", "0"))
    (out / f"batches-rank{rank}.json").write_text(json.dumps(batches))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
