"""What preparing a LLaMA-Factory run's rows through LLaMA-Factory's own code costs in Gradian (issue 41's cost check).

Run in LLaMA-Factory's venv (see `benchmarks/harness/llamafactory_conformance.py`). On N Alpaca rows (the
conformance rows repeated, `cutoff_len` 1024, template `default`, SmolLM2-135M-Instruct's tokenizer), CPU seconds
in one process of:

- LLaMA-Factory's own `get_dataset` (what `llamafactory-cli train` runs before the model loads: `datasets` reads the
  file, its converter and supervised processor map every row);
- Gradian's rows of the same run (`render_dataset`: LLaMA-Factory's converter and processor called per row by
  `data.llamafactory_code`), cold and then read back from Gradian's rows cache (`data.rows_cache`);
- Gradian's rows of the same rows under TRL (`render_dataset` on a TRL setup: the fast path checked against TRL's
  code), the cost a TRL run of the same size pays.

    .venv-llamafactory/bin/python -m benchmarks.speed.llamafactory_cost --rows 100000
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from benchmarks.harness.axolotl_conformance import chats
from benchmarks.harness.llamafactory_conformance import FILE, _alpaca, llamafactory_rows, write_shape
from gradian.data import trainer_code
from gradian.data.base_model import load_tokenizer, resolve_base_model
from gradian.data.examples import read_dataset
from gradian.data.render import render_dataset
from gradian.data.run_folder import read_run
from gradian.data.setup import TrainingSetup

TOKENIZER = Path.home() / ".cache" / "gradian" / "scenarios" / "smollm2-135m-instruct"


def _timed(fn):
    start = time.process_time()
    out = fn()
    return out, time.process_time() - start


def main(count: int) -> dict:
    with tempfile.TemporaryDirectory() as work:
        config = write_shape(Path(work), "alpaca + history + system, default", TOKENIZER)
        rows = chats()
        data = config.parent / "data" / FILE
        data.write_text("".join(json.dumps(_alpaca(rows[i % len(rows)])) + "\n" for i in range(count)))
        theirs, their_time = _timed(lambda: llamafactory_rows(config))
        tokenizer = load_tokenizer(resolve_base_model(str(TOKENIZER)))
        examples = read_dataset(data)
        setup = read_run(None, config).setup
        os.environ["GRADIAN_CACHE"] = str(Path(work) / "cache")  # cold, then warm: Gradian's rows cache
        ours, our_time = _timed(lambda: render_dataset(examples, tokenizer, setup))
        trainer_code._BUILT.clear()  # a second run of Gradian: only the rows cache is warm
        warm, warm_time = _timed(lambda: render_dataset(examples, tokenizer, setup))
        trl = TrainingSetup(max_length=1024)
        _, trl_time = _timed(lambda: render_dataset(examples, tokenizer, trl))
    same = [(r.input_ids, r.labels) for r in warm] == [(r.input_ids, r.labels) for r in ours] and sorted(theirs) == sorted((tuple(r.input_ids), tuple(i for i, label in enumerate(r.labels) if label != -100))
                                    for r in ours)
    result = {"rows": count, "llamafactory_get_dataset_s": round(their_time, 2),
              "gradian_llamafactory_rows_s": round(our_time, 2), "gradian_llamafactory_rows_cached_s": round(warm_time, 2),
              "gradian_trl_rows_s": round(trl_time, 2),
              "ratio_to_llamafactory": round(our_time / their_time, 2),
              "ratio_to_trl_render": round(our_time / trl_time, 2), "rows_equal": same}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    main(parser.parse_args().rows)
