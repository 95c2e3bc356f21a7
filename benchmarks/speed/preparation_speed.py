"""What preparing rows through TRL's own code costs, against Gradian's port, at 10^5 rows (issue 41's cost check).

Rows as TRL prepares them (`data.trl_prepare`) run TRL's `SFTTrainer._prepare_dataset`: per-row Python through
`datasets.map`. Times, in one process (CPU seconds, so a busy machine does not skew the ratios), on N synthetic
support-ticket rows (`diagnose_speed.synthetic_rows`) and the same rows as two-turn chats:

- string rows, `render_dataset` (Gradian's default: the batched fast path, checked against TRL's code on the
  first rows of each shape) against TRL's code on every row;
- chat rows, `render_dataset` (Gradian's default: TRL's code on every row), again with its rows cache warm
  (`data.rows_cache`, in a temporary GRADIAN_CACHE), against Gradian's port of it.

Each pair is also compared row for row (input ids and labels).

    python -m benchmarks.speed.preparation_speed --rows 100000
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from benchmarks.speed.diagnose_speed import INTENTS, WORDS, synthetic_rows
from gradian.data import render
from gradian.data.examples import Example
from gradian.data.setup import TrainingSetup
from gradian.data.trl_prepare import Preparation, trl_rows
from gradian.scenarios.tokenizer import build_tokenizer


def _timed(fn):
    start = time.process_time()
    out = fn()
    return out, time.process_time() - start


def main(count: int) -> dict:
    tokenizer = build_tokenizer(WORDS + INTENTS + ["intent", "id", "note"])
    rows = synthetic_rows(count)
    plain = [Example(str(i), i + 1, row) for i, row in enumerate(rows)]
    chats = [Example(str(i), i + 1, {"messages": [{"role": "user", "content": row["prompt"]},
                                                  {"role": "assistant", "content": row["completion"].strip()}]})
             for i, row in enumerate(rows)]
    setup = TrainingSetup(max_length=None)
    results: dict = {"rows": count}

    tally = Preparation()
    fast, results["string_default_s"] = _timed(lambda: render.render_dataset(plain, tokenizer, setup, tally))
    whole, results["string_trl_code_s"] = _timed(lambda: trl_rows(plain, tokenizer, setup))
    results["string_rows_equal"] = sum((r.input_ids, r.labels) == (ids, labels)
                                       for r, (ids, labels, _) in zip(fast, whole, strict=True))
    results["string_fast_path_rows"] = tally.checked_rows

    tally = Preparation()
    by_trl, results["chat_default_s"] = _timed(lambda: render.render_dataset(chats, tokenizer, setup, tally))
    _, results["chat_default_cached_s"] = _timed(lambda: render.render_dataset(chats, tokenizer, setup))
    ported, results["chat_port_s"] = _timed(lambda: [render._port(e, tokenizer, setup) for e in chats])
    results["chat_rows_equal"] = sum((r.input_ids, r.labels) == (ids, labels)
                                     for r, (ids, labels, _) in zip(by_trl, ported, strict=True))
    results["chat_trl_code_rows"] = tally.trainer_rows
    results["string_ratio_trl_code_vs_default"] = results["string_trl_code_s"] / results["string_default_s"]
    results["chat_ratio_default_vs_port"] = results["chat_default_s"] / results["chat_port_s"]
    results["chat_ratio_cached_vs_port"] = results["chat_default_cached_s"] / results["chat_port_s"]
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    with tempfile.TemporaryDirectory() as cache:
        os.environ["GRADIAN_CACHE"] = cache
        print(json.dumps(main(parser.parse_args().rows), indent=2))
