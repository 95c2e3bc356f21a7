"""Conformance with the real axolotl: its own `load_datasets` against Gradian's rows, token for token.

axolotl pins its own transformers, TRL and datasets, so it runs in a venv of its own, never in Gradian's:

    python -m venv .venv-axolotl && .venv-axolotl/bin/pip install torch==2.13.0 && \
        .venv-axolotl/bin/pip install --no-deps axolotl==0.19.0 && .venv-axolotl/bin/pip install \
        transformers==5.16.1 trl==1.9.0 datasets==4.8.4 peft==0.20.0 accelerate==1.13.0 tokenizers==0.23.1 \
        huggingface_hub==1.17.0 pydantic==2.12.5 addict fire PyYAML einops colorama numpy scipy fastcore \
        python-dotenv requests sentencepiece (and what its imports ask for next)

(`--no-deps`: its GPU kernels, trackers and cloud file systems are not imported by the data path and do not
install on a CPU.) `GRADIAN_AXOLOTL_PYTHON` names another interpreter.

    python -m benchmarks.harness.axolotl_conformance WORK [--tokenizer DIR]

For each shape (`SHAPES`: the config a user writes, with the rows in the format it reads) it writes the data file
and the axolotl YAML into `WORK/<shape>/`, runs axolotl's `load_cfg` and `load_datasets` there (the code
`axolotl preprocess` runs) and reads back every prepared row's `input_ids` and `labels`; then Gradian's `diagnose`
reads the same config and data file. A row matches when a row of axolotl's has the same ids and the same loss
positions (rows are compared as multisets: axolotl drops over-long rows and keeps no row ids). The planted faults
(answers cut mid-object in the data, in any trained turn; exact duplicates) must be named by the findings.
Writes `WORK/results.json` and prints the table for BENCHMARKS.md.

Run by Gradian's venv, it checks Gradian's port (`data.axolotl`: axolotl is not importable there). Run by the
axolotl venv with Gradian installed in it as well (`.venv-axolotl/bin/pip install --no-deps -e .` and Gradian's
other dependencies), it checks what an axolotl user gets: Gradian calling axolotl's own config loader and prompt
strategies (`data.axolotl_code`). The table's second column says which ran.

With `--prompts` (in axolotl's venv) it compares, instead, each row's generation prompt and a scored answer as
axolotl's own strategy tokenizes them (`AxolotlCode.answer`) with Gradian's port (`axolotl_answer`), and writes
`WORK/prompts.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
VERSION = "0.19.0"
ROWS = 40
CUT = (3, 11, 19, 27)  # rows whose answer is cut mid-object in the data (row 27: in its first assistant turn)
DUPLICATES = ((5, 30), (8, 33))  # (row, the row copied over it)
MULTI_TURN = range(24, 32)  # rows with two exchanges


def interpreter() -> Path | None:
    """The axolotl venv's Python, or None where there is none."""
    found = Path(os.environ.get("GRADIAN_AXOLOTL_PYTHON") or ROOT / ".venv-axolotl" / "bin" / "python")
    return found if found.exists() else None


def _answer(i: int) -> str:
    answer = json.dumps({"name": f"customer {i}", "city": ["Oslo", "Lima", "Pune", "Kyiv"][i % 4], "items": i % 5 + 1,
                         "note": "deliver after six" if i % 3 else "leave at the door"})
    return answer[: len(answer) // 2] if i in CUT else answer


def chats() -> list[list[dict[str, str]]]:
    """The rows as conversations: JSON extraction, a cut or a duplicate planted where `CUT` / `DUPLICATES` say."""
    rows = []
    for i in range(ROWS):
        turns = [{"role": "user", "content": f"Extract the order: customer {i} in town, {i % 5 + 1} items."},
                 {"role": "assistant", "content": _answer(i if i != 27 else 100)}]
        if i in MULTI_TURN:
            first = _answer(i) if i == 27 else _answer(i + 200)
            turns = [turns[0], {"role": "assistant", "content": first},
                     {"role": "user", "content": "And the same for the next one, please."},
                     {"role": "assistant", "content": _answer(i + 100)}]
        rows.append(turns)
    for row, source in DUPLICATES:
        rows[row] = rows[source]
    return rows


def _alpaca(turns: list[dict[str, str]]) -> dict[str, str]:
    return {"instruction": "Extract the order as JSON.", "input": turns[0]["content"], "output": turns[1]["content"]}


def _sharegpt(turns: list[dict[str, str]]) -> dict[str, Any]:
    return {"conversations": [{"from": {"user": "human", "assistant": "gpt"}[t["role"]], "value": t["content"]}
                              for t in turns]}


def _completion(turns: list[dict[str, str]]) -> dict[str, str]:
    return {"text": "\n".join(t["content"] for t in turns)}


# shape -> (row format, the axolotl config's own keys beside base_model / datasets / sequence_len)
SHAPES: dict[str, tuple[Any, dict[str, Any], dict[str, Any]]] = {
    "alpaca": (_alpaca, {"type": "alpaca"}, {}),
    "alpaca, train_on_inputs": (_alpaca, {"type": "alpaca"}, {"train_on_inputs": True}),
    "alpaca_chat": (_alpaca, {"type": "alpaca_chat"}, {}),
    "chat_template (tokenizer's)": (lambda t: {"messages": t}, {"type": "chat_template"}, {}),
    "chat_template, train_on_eos all": (lambda t: {"messages": t}, {"type": "chat_template", "train_on_eos": "all"},
                                        {}),
    "chat_template chatml, ShareGPT": (_sharegpt, {"type": "chat_template", "field_messages": "conversations",
                                                   "message_property_mappings": {"role": "from", "content": "value"}},
                                       {"chat_template": "chatml"}),
    "completion": (_completion, {"type": "completion"}, {}),
    "chat_template, sample_packing": (lambda t: {"messages": t}, {"type": "chat_template"},
                                      {"sample_packing": True, "pad_to_sequence_len": True}),
    "chat_template, sequence_len drops rows": (lambda t: {"messages": t}, {"type": "chat_template"},
                                               {"sequence_len": 96}),
}


def write_shape(folder: Path, shape: str, tokenizer: Path) -> Path:
    """The shape's data file and axolotl YAML in `folder`; the YAML's path."""
    to_row, dataset, extra = SHAPES[shape]
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "train.jsonl"
    data.write_text("".join(json.dumps(to_row(t)) + "\n" for t in chats()))
    config = {"base_model": str(tokenizer), "datasets": [{"path": str(data), "ds_type": "json", **dataset}],
              "sequence_len": 512, "adapter": "lora", "lora_r": 8, "lora_alpha": 16, "lora_target_linear": True,
              "micro_batch_size": 2, "num_epochs": 1, "learning_rate": 1e-4, "output_dir": str(folder / "out"),
              "dataset_prepared_path": str(folder / "prepared"), "shuffle_merged_datasets": False,
              "val_set_size": 0, **extra}
    path = folder / "axolotl.yaml"
    path.write_text(json.dumps(config, indent=1))  # JSON is YAML
    return path


def axolotl_rows(python: Path, config: Path) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(input_ids, trained positions) of every row axolotl's own preparation keeps, in its venv."""
    out = config.parent / "axolotl_rows.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": "", "AXOLOTL_DO_NOT_TRACK": "1",
           "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}
    subprocess.run([str(python), "-m", "benchmarks.harness.axolotl_conformance", "--prepare", str(config)],
                   check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return [(tuple(ids), tuple(trained)) for ids, trained in json.loads(out.read_text())]


def _prepare(config: Path) -> None:
    """In axolotl's venv: the config read and prepared by axolotl's own code; its rows to axolotl_rows.json."""
    from axolotl.cli.config import load_cfg
    from axolotl.common.datasets import load_datasets

    cfg = load_cfg(str(config))
    rows = load_datasets(cfg=cfg).train_dataset
    kept = [(list(map(int, ids)), [i for i, label in enumerate(labels) if label != -100])
            for ids, labels in zip(rows["input_ids"], rows["labels"], strict=True)]
    (config.parent / "axolotl_rows.json").write_text(json.dumps(kept))


Rows = list[tuple[tuple[int, ...], tuple[int, ...]]]  # (input_ids, trained positions) per kept row


def gradian_rows(config: Path, tokenizer: Path, data: Path | None = None,
                 ) -> tuple[Rows, list[str], set[str], dict[str, list[str]], str]:
    """Gradian's kept rows (as `axolotl_rows`) of `data` (train.jsonl beside the config), the id Gradian gave each
    file row, the ids of the rows it kept, its findings ({check: [row ids]}) and whose code prepared its rows (the
    report's `preparation.text`)."""
    from gradian.audit.diagnosis import diagnose
    from gradian.data.setup import preparation

    result = diagnose(data or config.parent / "train.jsonl", base_model=str(tokenizer), config=config)
    kept = [r for r in result.rendered if not r.dropped]
    rows = [(tuple(r.input_ids), tuple(i for i, label in enumerate(r.labels) if label != -100)) for r in kept]
    ids = [e.id for e in result.examples]
    return (rows, ids, {r.example_id for r in kept}, {f.check: list(f.example_ids) for f in result.findings},
            preparation(result.setup)["text"])


def compare(shape: str, theirs: Rows, ours: Rows, ids: list[str], kept: set[str],
            findings: dict[str, list[str]], prepared_by: str, cut: tuple[int, ...] = CUT) -> dict[str, Any]:
    """One table row: rows matched (ids and loss positions), and whether the planted faults among the rows
    trained are named (a cut in a dropped row, or in a turn the run does not train, taught nothing: `cut` lists
    the rows whose cut is trained)."""
    matched = sum((Counter(ours) & Counter(theirs)).values())
    same_ids = sum((Counter(ids for ids, _ in ours) & Counter(ids for ids, _ in theirs)).values())
    cut_named = set(findings.get("cut_in_data", []))
    want_cut = {ids[i] for i in cut} & kept
    duplicates = {e for check in ("duplicate", "near_duplicate") for e in findings.get(check, [])}
    pairs = [{ids[i] for i in pair} & kept for pair in DUPLICATES]
    pairs = [pair for pair in pairs if len(pair) == 2]
    return {"shape": shape, "axolotl_rows": len(theirs), "gradian_rows": len(ours), "ids_matched": same_ids,
            "matched": matched, "cuts_found": len(cut_named & want_cut), "cuts": len(want_cut),
            "cut_false": len(cut_named - want_cut), "duplicates_found": sum(bool(p & duplicates) for p in pairs),
            "duplicates": len(pairs), "untrained_named": sorted(duplicates - kept), "findings": sorted(findings),
            "prepared_by": prepared_by}


def table(records: list[dict[str, Any]]) -> str:
    lines = [f"| shape (axolotl {VERSION}) | Gradian's rows by | rows axolotl kept | Gradian's rows matched (ids and "
             "loss positions) | cuts named | duplicate pairs named |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['shape']} | {_by(r['prepared_by'])} | {row_cells(r)} |" for r in records]
    return "\n".join(lines)


def row_cells(r: dict[str, Any]) -> str:
    """A record's rows kept, rows matched, cuts named and duplicate pairs named, as table cells."""
    return (f"{r['axolotl_rows']} | {r['matched']} / {r['axolotl_rows']} | {r['cuts_found']} / {r['cuts']}"
            + (f" (+{r['cut_false']} false)" if r["cut_false"] else "")
            + f" | {r['duplicates_found']} / {r['duplicates']}"
            + (f" (+{len(r['untrained_named'])} untrained row named)" if r["untrained_named"] else ""))


def _by(prepared_by: str) -> str:
    return "axolotl's own code" if "own config loader" in prepared_by else "Gradian's port"


def prompt_record(config: Path, tokenizer: Path, shape: str) -> dict[str, Any]:
    """In axolotl's venv: each row read as an eval row, its generation prompt and a scored answer by axolotl's own
    strategy (via Gradian's `AxolotlCode.answer`) against Gradian's port (`axolotl_answer`)."""
    from gradian.data import trainer_code
    from gradian.data.axolotl import axolotl_answer
    from gradian.data.axolotl_code import AxolotlCode
    from gradian.data.base_model import load_tokenizer, resolve_base_model
    from gradian.data.examples import read_dataset
    from gradian.data.render import axolotl_options
    from gradian.data.run_folder import read_run

    setup = read_run(None, config).setup
    loaded = load_tokenizer(resolve_base_model(str(tokenizer)))
    own = trainer_code.for_run(AxolotlCode, setup, loaded)
    options = axolotl_options(setup)
    counts = Counter()
    for row in read_dataset(config.parent / "train.jsonl", eval_set=True):
        prompt, answered = own.answer(row, None, 0), own.answer(row, "the answer", 0)
        if prompt is None or answered is None:
            continue
        counts["own_code"] += 1
        counts["prompts_equal"] += prompt[0] == axolotl_answer(row, None, loaded, options)[0]
        port = axolotl_answer(row, "the answer", loaded, options)
        counts["answers_equal"] += answered == port
        counts["answers_equal_but_untrained_tail"] += answered[0] == port[0] and port[1][: len(answered[1])] == \
            answered[1]
    return {"shape": shape, **counts}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path, nargs="?")
    parser.add_argument("--prepare", type=Path, help=argparse.SUPPRESS)  # in axolotl's venv
    parser.add_argument("--prompts", action="store_true",
                        help="run in axolotl's venv: generation prompts and scored answers, its code against the port")
    parser.add_argument("--tokenizer", type=Path,
                        default=Path.home() / ".cache" / "gradian" / "scenarios" / "smollm2-135m-instruct")
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES))
    args = parser.parse_args(argv)
    if args.prepare:
        _prepare(args.prepare)
        return 0
    if args.prompts:
        records = [prompt_record(write_shape(args.work / f"shape{i}", shape, args.tokenizer.resolve()),
                                 args.tokenizer.resolve(), shape) for i, shape in enumerate(args.shapes)]
        (args.work / "prompts.json").write_text(json.dumps(records, indent=1))
        print("\n".join(json.dumps(r) for r in records))
        return 0
    python = interpreter()
    if python is None:
        print("no axolotl venv: create .venv-axolotl as this file's docstring says", file=sys.stderr)
        return 2

    def record(i: int, shape: str) -> dict[str, Any]:
        config = write_shape(args.work / f"shape{i}", shape, args.tokenizer.resolve())
        return compare(shape, axolotl_rows(python, config), *gradian_rows(config, args.tokenizer.resolve()))

    return collect(args.work, (record(i, shape) for i, shape in enumerate(args.shapes)), table)


def collect(work: Path, records: Iterable[dict[str, Any]], table: Callable[[list[dict[str, Any]]], str]) -> int:
    """Each shape's record printed as it comes, then all of them to `work`/results.json and the table printed."""
    kept = []
    for one in records:
        kept.append(one)
        print(json.dumps(one), flush=True)
    (work / "results.json").write_text(json.dumps(kept, indent=1))
    print(table(kept))
    return 0


if __name__ == "__main__":
    sys.exit(main())
