"""Conformance with the real LLaMA-Factory: its own `get_dataset` against Gradian's rows, token for token.

LLaMA-Factory 0.9.5 pins transformers <= 5.6, TRL <= 0.24, datasets <= 4.0 and peft <= 0.18.1 (all inside
Gradian's ranges), so it runs in a venv of its own with Gradian installed in it too:

    python -m venv .venv-llamafactory && .venv-llamafactory/bin/pip install torch==2.13.0 && \
        .venv-llamafactory/bin/pip install transformers==5.6.0 datasets==4.0.0 trl==0.24.0 peft==0.18.1 \
        accelerate==1.11.0 omegaconf pydantic "tyro<0.9.0" sentencepiece tiktoken protobuf einops fire pillow && \
        .venv-llamafactory/bin/pip install --no-deps llamafactory==0.9.5 torchaudio==2.11.1 && \
        .venv-llamafactory/bin/pip install -e . -c <those pins>

(`--no-deps`: its web UI, audio and vision stacks are not what the text data path runs. Its data module imports
torchaudio, whose compiled extension for torch 2.11 does not load against torch 2.13: move
`torchaudio/lib/*.so` aside, and torchaudio imports as it does where the extension is absent.)

    .venv-llamafactory/bin/python -m benchmarks.harness.llamafactory_conformance WORK [--tokenizer DIR]

For each shape (`SHAPES`: the dataset_info.json entry and YAML a user writes, rows in the format it reads) it writes
`WORK/<shape>/`, runs what `llamafactory-cli train` runs for `stage: sft` before the model loads (`get_train_args`,
`load_tokenizer`, `get_template_and_fix_tokenizer`, `get_dataset`) and compares every prepared row's `input_ids`
and loss positions with the rows Gradian's `diagnose` reads from the same YAML and data file (as multisets:
`val_size` shuffles the rows it keeps). The planted faults (answers cut mid-object in the data, in any trained turn;
exact duplicates) must be named by the findings. Writes `WORK/results.json` and prints the table for
BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness.axolotl_conformance import CUT, Rows, chats, collect, compare, gradian_rows, row_cells

VERSION = "0.9.5"
FILE = "train.jsonl"


def _alpaca(turns: list[dict[str, str]]) -> dict[str, Any]:
    """Alpaca with the earlier turns as `history` ([[instruction, answer], ...]) and a system prompt."""
    pairs = [[turns[i]["content"], turns[i + 1]["content"]] for i in range(0, len(turns) - 2, 2)]
    return {"instruction": turns[-2]["content"], "input": "", "output": turns[-1]["content"],
            "system": "You extract orders as JSON.", "history": pairs}


def _sharegpt(turns: list[dict[str, str]]) -> dict[str, Any]:
    return {"conversations": [{"from": {"user": "human", "assistant": "gpt"}[t["role"]], "value": t["content"]}
                              for t in turns], "system": "You extract orders as JSON."}


def _openai(turns: list[dict[str, str]]) -> dict[str, Any]:
    return {"messages": [{"role": "system", "content": "You extract orders as JSON."}, *turns]}


ALPACA = {"columns": {"prompt": "instruction", "query": "input", "response": "output", "system": "system",
                      "history": "history"}}
SHAREGPT = {"formatting": "sharegpt", "columns": {"messages": "conversations", "system": "system"}}
OPENAI = {"formatting": "sharegpt", "columns": {"messages": "messages"},
          "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant",
                   "system_tag": "system"}}
# shape -> (row format, its dataset_info.json entry, the YAML's own keys beside model / dataset / output_dir)
SHAPES: dict[str, tuple[Any, dict[str, Any], dict[str, Any]]] = {
    "alpaca + history + system, default": (_alpaca, ALPACA, {"template": "default"}),
    "alpaca, train_on_prompt": (_alpaca, ALPACA, {"template": "default", "train_on_prompt": True}),
    "sharegpt human/gpt, chatml": (_sharegpt, SHAREGPT, {"template": "chatml"}),
    "sharegpt, mask_history": (_sharegpt, SHAREGPT, {"template": "chatml", "mask_history": True}),
    "role/content messages, qwen": (_openai, OPENAI, {"template": "qwen"}),
    "sharegpt, cutoff_len cuts rows": (_sharegpt, SHAREGPT, {"template": "chatml", "cutoff_len": 72}),
    "alpaca, val_size 0.1 + max_samples": (_alpaca, ALPACA, {"template": "default", "val_size": 0.1,
                                                             "max_samples": 36}),
}


def write_shape(folder: Path, shape: str, tokenizer: Path) -> Path:
    """The shape's data file, dataset_info.json and LLaMA-Factory YAML in `folder`; the YAML's path."""
    to_row, entry, extra = SHAPES[shape]
    data = folder / "data"
    data.mkdir(parents=True, exist_ok=True)
    (data / FILE).write_text("".join(json.dumps(to_row(t)) + "\n" for t in chats()))
    (data / "dataset_info.json").write_text(json.dumps({"orders": {"file_name": FILE, **entry}}, indent=1))
    config = {"model_name_or_path": str(tokenizer), "stage": "sft", "do_train": True, "finetuning_type": "lora",
              "lora_rank": 8, "lora_target": "all", "dataset": "orders", "dataset_dir": str(data),
              "cutoff_len": 1024, "output_dir": str(folder / "out"), "overwrite_cache": True,
              "per_device_train_batch_size": 2, "num_train_epochs": 1.0, "learning_rate": 1e-4, "report_to": "none",
              **extra}
    path = folder / "llamafactory.yaml"
    path.write_text(json.dumps(config, indent=1))  # JSON is YAML
    return path


def llamafactory_rows(config: Path) -> Rows:
    """(input_ids, trained positions) of every row LLaMA-Factory's own preparation trains on."""
    from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
    from llamafactory.hparams import get_train_args
    from llamafactory.model import load_tokenizer

    model_args, data_args, training_args, _, _ = get_train_args(json.loads(config.read_text()))
    module = load_tokenizer(model_args)
    template = get_template_and_fix_tokenizer(module["tokenizer"], data_args)
    rows = get_dataset(template, model_args, data_args, training_args, stage="sft", **module)["train_dataset"]
    return [(tuple(map(int, ids)), tuple(i for i, label in enumerate(labels) if label != -100))
            for ids, labels in zip(rows["input_ids"], rows["labels"], strict=True)]


def table(records: list[dict[str, Any]]) -> str:
    lines = [f"| shape (LLaMA-Factory {VERSION}) | rows LLaMA-Factory trains | Gradian's rows matched (ids and loss "
             "positions) | cuts named | duplicate pairs named |", "|---|---|---|---|---|"]
    lines += [f"| {r['shape']} | {row_cells(r)} |" for r in records]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("--tokenizer", type=Path,
                        default=Path.home() / ".cache" / "gradian" / "scenarios" / "smollm2-135m-instruct")
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES))
    args = parser.parse_args(argv)

    def record(i: int, shape: str) -> dict[str, Any]:
        config = write_shape(args.work / f"shape{i}", shape, args.tokenizer.resolve())
        ours = gradian_rows(config, args.tokenizer.resolve(), config.parent / "data" / FILE)
        trained_cuts = tuple(i for i in CUT if i != 27) if SHAPES[shape][2].get("mask_history") else CUT
        return compare(shape, llamafactory_rows(config), *ours, cut=trained_cuts)  # mask_history: 27's cut untrained

    return collect(args.work, (record(i, shape) for i, shape in enumerate(args.shapes)), table)


if __name__ == "__main__":
    sys.exit(main())
