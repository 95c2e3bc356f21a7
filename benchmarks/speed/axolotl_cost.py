"""What preparing an axolotl run's rows through axolotl's own code costs in Gradian (issue 41's cost check).

Run in axolotl's venv (see `benchmarks/harness/axolotl_conformance.py`). On N rows of one conformance shape (the
conformance rows repeated, SmolLM2-135M-Instruct's tokenizer, `dataset_processes: 1` so that one process does all
the work), CPU seconds in one process of:

- axolotl's own `load_datasets` (what `axolotl train` runs before the model loads: its config loader, tokenizer,
  prompt strategy and `datasets` map over every row);
- Gradian's rows of the same run (`render_dataset`: the entry's prompt strategy called by `data.axolotl_code`), cold
  and then again in a new `AxolotlCode` (only Gradian's rows cache, where there is one, is warm);
- Gradian's rows of the same rows under TRL (`render_dataset` on a TRL setup), the cost a TRL run of the same size
  pays.

    .venv-axolotl/bin/python -m benchmarks.speed.axolotl_cost --rows 100000 --shape alpaca
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from benchmarks.harness.axolotl_conformance import SHAPES, _prepare, chats, write_shape
from benchmarks.speed.llamafactory_cost import TOKENIZER, _timed
from gradian.data import trainer_code
from gradian.data.base_model import load_tokenizer, resolve_base_model
from gradian.data.examples import read_dataset
from gradian.data.render import render_dataset
from gradian.data.run_folder import read_run
from gradian.data.setup import TrainingSetup
from gradian.data.trl_prepare import Preparation

os.environ.update(AXOLOTL_DO_NOT_TRACK="1", DO_NOT_TRACK="1")  # its loader reports usage unless told not to


def main(count: int, shape: str) -> dict:
    with tempfile.TemporaryDirectory() as work:
        config = write_shape(Path(work), shape, TOKENIZER)
        settings = {**json.loads(config.read_text()), "dataset_processes": 1}
        config.write_text(json.dumps(settings, indent=1))
        to_row, rows = SHAPES[shape][0], chats()
        data = Path(settings["datasets"][0]["path"])
        data.write_text("".join(json.dumps(to_row(rows[i % len(rows)])) + "\n" for i in range(count)))
        _, their_time = _timed(lambda: _prepare(config))
        theirs = json.loads((config.parent / "axolotl_rows.json").read_text())
        tokenizer = load_tokenizer(resolve_base_model(str(TOKENIZER)))
        examples = read_dataset(data)
        setup = read_run(None, config).setup
        os.environ["GRADIAN_CACHE"] = str(Path(work) / "cache")
        tally = Preparation()
        ours, our_time = _timed(lambda: render_dataset(examples, tokenizer, setup, tally))
        trainer_code._BUILT.clear()  # a second run of Gradian: only a rows cache is warm
        again, again_time = _timed(lambda: render_dataset(examples, tokenizer, setup))
        _, trl_time = _timed(lambda: render_dataset(examples, tokenizer, TrainingSetup(max_length=512)))
    kept = [(r.input_ids, [i for i, label in enumerate(r.labels) if label != -100]) for r in ours if not r.dropped]
    same = kept == [(ids, trained) for ids, trained in theirs] and \
        [(r.input_ids, r.labels) for r in again] == [(r.input_ids, r.labels) for r in ours]
    result = {"rows": count, "shape": shape, "axolotl_load_datasets_s": round(their_time, 2),
              "gradian_axolotl_rows_s": round(our_time, 2), "gradian_axolotl_rows_again_s": round(again_time, 2),
              "gradian_trl_rows_s": round(trl_time, 2), "ratio_to_axolotl": round(our_time / their_time, 2),
              "ratio_to_trl_render": round(our_time / trl_time, 2), "rows_equal": same,
              "prepared_by": tally.to_dict()}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--shape", default="alpaca", choices=sorted(SHAPES))
    args = parser.parse_args()
    main(args.rows, args.shape)
