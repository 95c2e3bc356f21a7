"""The corpus: every malformed input Gradian must answer with one sentence (or accept), and how.

Each `Case` writes its input into a scratch folder of a `Workspace` (a valid tiny world) and returns the
command line to run. `exit_code` is what the user must see: 2 (bad input: one sentence naming `names`,
and `line` when given), 1 (accepted, with findings) or 0. `bug` names a known defect in Gradian that keeps
a case from behaving as it should; the test marks such a case as an expected failure until it is fixed.
Case ids start with their kind: dataset-, run-, model-, attribute-.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bad_inputs.workspace import Workspace, save_adapter, tiny_model, train_rows

Build = Callable[[Workspace, Path], list[str]]


@dataclass(frozen=True)
class Case:
    id: str
    exit_code: int
    build: Build
    names: str = ""  # what the error sentence must contain: the file name, with ":line:" when known
    bug: str = ""
    slow: bool = False  # over a minute on 2 cores

    @property
    def kind(self) -> str:
        return self.id.split("-", 1)[0]


def diagnose_args(ws: Workspace, dataset: Path, *extra: str) -> list[str]:
    return ["diagnose", "--dataset", str(dataset), "--base-model", str(ws.model), "--json", *extra]


def attribute_args(ws: Workspace, out: Path, *, adapter: Path | None = None, model: Path | None = None,
                   dataset: Path | None = None, eval_dataset: Path | None = None, extra: tuple[str, ...] = ()) -> list[str]:
    return ["attribute", "--base-model", str(model or ws.model), "--adapter", str(adapter or ws.adapter),
            "--dataset", str(dataset or ws.dataset), "--eval-dataset", str(eval_dataset or ws.eval_dataset),
            "--capability", "json_formatting", "--out", str(out), "--proj-dim", "16", "--batch-size", "4", *extra]


# ---------------------------------------------------------------------------------------------- datasets

GOOD = json.dumps(train_rows(1)[0]) + "\n"
ROW2 = json.dumps(train_rows(2)[1]) + "\n"


def _dataset(content: str | bytes | Callable[[Path], None], eval_set: bool = False) -> Build:
    def build(ws: Workspace, scratch: Path) -> list[str]:
        path = scratch / "train.jsonl"
        if callable(content):
            content(path)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
        if eval_set:
            return diagnose_args(ws, ws.dataset, "--eval-dataset", str(path))
        return diagnose_args(ws, path)

    return build


def _rows(*rows: object) -> str:
    return "".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows)


def huge_row(megabytes: int) -> Callable[[Path], None]:
    """One completion of `megabytes` MB between two ordinary rows."""

    def write(path: Path) -> None:
        size = megabytes * 1024 * 1024
        words = ("refund order invoice amount " * (size // 28 + 1))[:size]
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(GOOD)
            handle.write(json.dumps({"id": "huge", "prompt": "please help", "completion": words}) + "\n")
            handle.write(ROW2)

    return write


P = {"prompt": "please help", "completion": "the order"}
MESSAGES = _rows({"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "help"}]})

DATASET_CASES = [
    Case("dataset-broken-json-line", 2, _dataset(GOOD + '{"prompt": "a", "completion": \n' + ROW2), "train.jsonl:2:"),
    Case("dataset-trailing-comma", 2, _dataset(GOOD + '{"prompt": "a", "completion": "b",}\n'), "train.jsonl:2:"),
    Case("dataset-single-quotes", 2, _dataset(GOOD + "{'prompt': 'a', 'completion': 'b'}\n"), "train.jsonl:2:"),
    Case("dataset-unquoted-keys", 2, _dataset("{prompt: 1}\n"), "train.jsonl:1:"),
    Case("dataset-two-objects-on-a-line", 2, _dataset(GOOD.strip() + GOOD), "train.jsonl:1:"),
    Case("dataset-pretty-printed-object", 2, _dataset(json.dumps(P, indent=2) + "\n"), "train.jsonl:1:"),
    Case("dataset-missing-completion", 2, _dataset(GOOD + _rows({"prompt": "a"})), "train.jsonl:2:"),
    Case("dataset-no-known-fields", 2, _dataset(_rows({"question": "a", "answer": "b"})), "train.jsonl:1:"),
    Case("dataset-empty-object", 2, _dataset(GOOD + "{}\n"), "train.jsonl:2:"),
    Case("dataset-prompt-not-string", 2, _dataset(_rows({"prompt": 5, "completion": "b"})), "train.jsonl:1:"),
    Case("dataset-completion-not-string", 2, _dataset(_rows({"prompt": "a", "completion": ["b"]})), "train.jsonl:1:"),
    Case("dataset-completion-null", 2, _dataset(_rows({"prompt": "a", "completion": None})), "train.jsonl:1:"),
    Case("dataset-text-not-string", 2, _dataset(_rows({"text": {"a": 1}})), "train.jsonl:1:"),
    Case("dataset-nan-prompt", 2, _dataset('{"prompt": NaN, "completion": "b"}\n'), "train.jsonl:1:"),
    Case("dataset-messages-empty", 2, _dataset(_rows({"messages": []})), "train.jsonl:1:"),
    Case("dataset-messages-not-list", 2, _dataset(_rows({"messages": "hello"})), "train.jsonl:1:"),
    Case("dataset-message-without-role", 2, _dataset(_rows({"messages": [{"content": "hi"}]})), "train.jsonl:1:"),
    Case("dataset-message-not-object", 2, _dataset(_rows({"messages": ["hi", "there"]})), "train.jsonl:1:"),
    Case("dataset-conversational-completion-empty", 2,
         _dataset(_rows({"prompt": [{"role": "user", "content": "hi"}], "completion": []})), "train.jsonl:1:"),
    Case("dataset-sharegpt-unknown-speaker", 2,
         _dataset(_rows({"conversations": [{"from": "robot", "value": "x"}]})), "train.jsonl:1:"),
    Case("dataset-sharegpt-not-list", 2, _dataset(_rows({"conversations": {"from": "human"}})), "train.jsonl:1:"),
    Case("dataset-alpaca-missing-output", 2, _dataset(_rows({"instruction": "do it"})), "train.jsonl:1:"),
    Case("dataset-alpaca-output-not-string", 2,
         _dataset(_rows({"instruction": "do", "output": 3})), "train.jsonl:1:"),
    Case("dataset-alpaca-input-not-string", 2,
         _dataset(_rows({"instruction": "do", "input": ["x"], "output": "y"})), "train.jsonl:1:"),
    Case("dataset-row-is-array", 2, _dataset(GOOD + "[1, 2]\n"), "train.jsonl:2:"),
    Case("dataset-row-is-string", 2, _dataset(GOOD + '"just text"\n'), "train.jsonl:2:"),
    Case("dataset-row-is-null", 2, _dataset(GOOD + "null\n"), "train.jsonl:2:"),
    Case("dataset-row-is-number", 2, _dataset(GOOD + "42\n"), "train.jsonl:2:"),
    Case("dataset-latin1-bytes", 2, _dataset(GOOD.encode() + b'{"prompt": "caf\xe9", "completion": "x"}\n'),
         "train.jsonl:2:"),
    Case("dataset-utf16", 2, _dataset(GOOD.encode("utf-16")), "train.jsonl:1:"),
    Case("dataset-binary-file", 2, _dataset(b"\x89PNG\r\n\x1a\n" + bytes(range(256))), "train.jsonl:1:"),
    Case("dataset-gzip-file", 2, _dataset(b"\x1f\x8b\x08\x00" + bytes(64)), "train.jsonl: is not a readable gzip file"),
    Case("dataset-parquet-damaged", 2, _dataset(b"PAR1" + bytes(64) + b"PAR1"), "train.jsonl: is not a readable Parquet"),
    Case("dataset-zip-file", 2, _dataset(b"PK\x03\x04" + bytes(64)), "train.jsonl: is a ZIP archive"),
    Case("dataset-nul-bytes", 2, _dataset(GOOD.encode() + b"\x00\x00\x00\n"), "train.jsonl:2:"),
    Case("dataset-empty-file", 2, _dataset(""), "train.jsonl"),
    Case("dataset-only-blank-lines", 2, _dataset("\n  \n\t\n"), "train.jsonl"),
    Case("dataset-duplicate-ids", 2, _dataset(_rows({"id": "a", **P}, {"id": "b", **P}, {"id": "a", **P})),
         "train.jsonl:3:"),
    Case("dataset-duplicate-id-number-and-string", 2, _dataset(_rows({"id": 7, **P}, {"id": "7", **P})),
         "train.jsonl:2:"),
    # Line 2 has no id and line 1's explicit id is "2": not a duplicate, the row at line 2 is named "line-2" (the two
    # rows are the same text, which the duplicates check reports: exit code 1).
    Case("dataset-id-collides-with-line-number-accepted", 1, _dataset(_rows({"id": "2", **P}, P))),
    Case("dataset-json-array-truncated", 2, _dataset('[{"prompt": "a", "completion": "b"},\n{"prompt": '),
         "train.jsonl"),
    Case("dataset-json-array-of-numbers", 2, _dataset("[1, 2, 3]"), "train.jsonl:1:"),
    Case("dataset-json-array-empty", 2, _dataset("[]"), "train.jsonl"),
    Case("dataset-deeply-nested", 2, _dataset('{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}\n"),
         "train.jsonl:1:"),
    Case("dataset-huge-integer", 2, _dataset('{"id": ' + "9" * 5000 + ', "prompt": "a", "completion": "b"}\n'),
         "train.jsonl:1:"),
    Case("dataset-missing-file", 2, lambda ws, s: diagnose_args(ws, s / "nope.jsonl"), "nope.jsonl"),
    Case("dataset-name-too-long", 2, lambda ws, s: diagnose_args(ws, s / ("a" * 300 + ".jsonl")), "a" * 300),
    Case("dataset-is-a-folder", 2, lambda ws, s: diagnose_args(ws, s), "cases"),
    # a max_length of 0 or below was audited as given ("400 of 400 rows exceed max_length=-5")
    Case("run-option-max-length-negative", 2, lambda ws, s: diagnose_args(ws, ws.dataset, "--max-length", "-5"),
         "--max-length"),
    Case("dataset-is-a-pipe", 2, _dataset(os.mkfifo), "train.jsonl"),  # opening it would block forever
    Case("dataset-links-to-dev-zero", 2, _dataset(lambda path: path.symlink_to("/dev/zero")), "train.jsonl"),
    Case("dataset-eval-broken-line", 2, _dataset(GOOD + "{oops\n", eval_set=True), "train.jsonl:2:"),
    # Accepted: not errors, the rows are read and audited.
    Case("dataset-json-array-accepted", 0, _dataset(json.dumps(train_rows(4)))),
    Case("dataset-id-equals-a-line-number-accepted", 0,  # the row at line 3 has no id; line 1's explicit id is "3"
         _dataset(_rows({**train_rows(3)[0], "id": "3"}, train_rows(3)[1], {k: v for k, v in train_rows(3)[2].items()
                                                                           if k != "id"}))),
    Case("dataset-utf8-bom-accepted", 0, _dataset(b"\xef\xbb\xbf" + GOOD.encode() + ROW2.encode())),
    Case("dataset-crlf-accepted", 0, _dataset((GOOD + ROW2).replace("\n", "\r\n"))),
    Case("dataset-empty-completion-accepted", 0, _dataset(GOOD + _rows({"prompt": "a", "completion": ""}))),
    Case("dataset-unicode-accepted", 0, _dataset(GOOD + _rows({"prompt": "héllo 你好 🙂 \u202e", "completion": "ok"}))),
    Case("dataset-lone-surrogate", 2, _dataset(GOOD + '{"prompt": "a\\ud800b", "completion": "c"}\n'), "train.jsonl:2:"),
    Case("dataset-message-content-null-accepted", 1,
         _dataset(_rows({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}]}))),
    Case("dataset-1mb-row", 1, _dataset(huge_row(1))),
    Case("dataset-50mb-row", 1, _dataset(huge_row(50)), slow=True),
]

# ---------------------------------------------------------------------------------------------- run folders


def _run(damage: Callable[[Path], None], *extra: str, dataset: str = "") -> Build:
    """Copy the valid run folder, apply `damage` to it, and diagnose with --run."""

    def build(ws: Workspace, scratch: Path) -> list[str]:
        run = scratch / "run"
        import shutil

        shutil.copytree(ws.run, run)
        damage(run)
        data = _file(scratch / "train.jsonl", dataset.encode()) if dataset else ws.dataset
        return diagnose_args(ws, data, "--run", str(run), *[e.replace("{run}", str(run)) for e in extra])

    return build


def _write(name: str, content: str | bytes) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        path = run / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())

    return damage


def _remove(*names: str) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        for name in names:
            (run / name).unlink(missing_ok=True)

    return damage


def _state(log_history: object, **more: object) -> Callable[[Path], None]:
    return _write("trainer_state.json", json.dumps({"global_step": 4, "log_history": log_history, **more}))


def _both(*damages: Callable[[Path], None]) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        for step in damages:
            step(run)

    return damage


def _symlink_loop(ws: Workspace, scratch: Path) -> list[str]:
    (scratch / "loop").symlink_to(scratch / "loop")
    return diagnose_args(ws, ws.dataset, "--run", str(scratch / "loop"))


def _adapter_config(**fields: object) -> Callable[[Path], None]:
    """Rewrite adapter_config.json with `fields` (JSON lets NaN through)."""

    def damage(folder: Path) -> None:
        config = json.loads((folder / "adapter_config.json").read_text())
        (folder / "adapter_config.json").write_text(json.dumps({**config, **fields}))

    return damage


NINE = ", ".join(["*{0}"] * 9)
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{name}: &{name} [{NINE.format(previous)}]\n" for previous, name in zip("abcdef", "bcdefg", strict=True))


RUN_CASES = [
    Case("run-symlink-loop", 2, _symlink_loop, "loop: cannot be resolved"),
    Case("run-adapter-r-nan", 2, _run(_adapter_config(r=float("nan"))), "adapter_config.json"),
    Case("run-adapter-alpha-infinite", 2, _run(_adapter_config(lora_alpha=float("inf"))), "adapter_config.json"),
    Case("run-config-yaml-alias-bomb", 2, _run(_write("sft_config.yaml", ALIAS_BOMB)), "sft_config.yaml"),
    Case("run-config-yaml-recursive-alias", 2, _run(_write("sft_config.yaml", "a: &a [1, *a]\n")), "sft_config.yaml"),
    Case("run-config-too-large", 2, _run(_write("sft_config.yaml", "# " + "x" * (1 << 20) + "\nmax_length: 64\n")),
         "GRADIAN_MAX_CONFIG_BYTES"),
    Case("run-missing-folder", 2, lambda ws, s: diagnose_args(ws, ws.dataset, "--run", str(s / "gone")), "gone"),
    Case("run-is-a-file", 2, lambda ws, s: diagnose_args(ws, ws.dataset, "--run", str(ws.dataset)), "train.jsonl"),
    Case("run-empty-folder", 2, lambda ws, s: diagnose_args(ws, ws.dataset, "--run", str(s)), str(Path("cases"))),
    Case("run-adapter-config-truncated", 2, _run(_write("adapter_config.json", '{"r": 2, "lora_alpha":')),
         "adapter_config.json"),
    Case("run-adapter-config-empty", 2, _run(_write("adapter_config.json", "")), "adapter_config.json"),
    Case("run-adapter-config-array", 2, _run(_write("adapter_config.json", "[1, 2]")), "adapter_config.json"),
    Case("run-adapter-config-not-utf8", 2, _run(_write("adapter_config.json", b'{"r": "\xff\xfe"}')),
         "adapter_config.json"),
    Case("run-adapter-base-name-not-text", 2,
         _run(_write("adapter_config.json", '{"base_model_name_or_path": 5, "r": 2}')), "adapter_config.json"),
    Case("run-trainer-state-truncated", 2, _run(_write("trainer_state.json", '{"log_history": [{"loss": 1.')),
         "trainer_state.json"),
    Case("run-trainer-state-binary", 2, _run(_write("trainer_state.json", bytes(range(200, 256)))),
         "trainer_state.json"),
    Case("run-trainer-state-is-folder", 0, _run(_both(_remove("trainer_state.json"),
                                                     lambda run: (run / "trainer_state.json").mkdir()))),
    Case("run-log-history-not-list", 2, _run(_state(5)), "trainer_state.json"),
    Case("run-trainer-state-links-to-dev-zero", 0, _run(_both(_remove("trainer_state.json"), lambda run: (
        run / "trainer_state.json").symlink_to("/dev/zero")))),  # not a file: the run is read without it
    Case("run-training-args-is-a-pipe", 0, _run(_both(_remove("training_args.bin"), lambda run: os.mkfifo(
        run / "training_args.bin")))),
    Case("run-nan-in-logs", 1, _run(_state([{"step": 1, "loss": 1.0}, {"step": 2, "loss": float("nan")}]))),
    Case("run-infinite-grad-norm", 1, _run(_state([{"step": 1, "loss": 1.0, "grad_norm": float("inf")}]))),
    Case("run-loss-is-text", 0, _run(_state([{"step": s, "loss": "high"} for s in range(8)]))),
    # text steps are skipped; eval loss rising over a flat train loss is not overfitting: nothing to report
    Case("run-step-is-text", 0, _run(_state([{"step": s, "loss": 1.0} for s in range(8)]
                                             + [{"step": str(s), "eval_loss": 1.0 + s} for s in range(8)]))),
    Case("run-log-rows-not-objects", 0, _run(_state([1, "two", None, [3]]))),
    Case("run-adapter-weights-missing", 0, _run(_remove("adapter_model.safetensors"))),
    Case("run-training-args-garbage", 0, _run(_write("training_args.bin", b"\x80\x04garbage that is no pickle"))),
    Case("run-only-checkpoint", 0, _run(_both(lambda run: run.joinpath("checkpoint-4").mkdir(),
                                              lambda run: (run / "trainer_state.json").rename(
                                                  run / "checkpoint-4" / "trainer_state.json")))),
    Case("run-adapter-for-wider-base", 1, _run(lambda run: _other_base(hidden_size=48, num_attention_heads=4)(run))),
    Case("run-config-is-a-pipe", 2, _run(lambda run: os.mkfifo(run / "pipe.yaml"), "--config", "{run}/pipe.yaml"),
         "pipe.yaml"),
    Case("run-config-yaml-broken", 2, _run(_write("sft_config.yaml", "max_length: [1, 2\nlearning_rate: 1e-4\n")),
         "sft_config.yaml"),
    Case("run-config-yaml-list", 2, _run(_write("sft_config.yaml", "- 1\n- 2\n")), "sft_config.yaml"),
    # a max length of 0 or below was audited as given ("400 of 400 rows exceed max_length=-5"); no run trains so:
    # TRL's truncation (pyarrow's list_slice) refuses a negative stop
    Case("run-config-max-length-negative", 2, _run(_write("sft_config.yaml", "max_length: -5\n")),
         "sft_config.yaml: holds a setting Gradian cannot use (max_length is -5"),
    Case("run-config-json-broken", 2, _run(_write("sft_config.json", '{"max_length": }')), "sft_config.json:1:"),
    Case("run-config-not-utf8", 2, _run(_write("sft_config.yaml", b"max_length: \xff\n")), "sft_config.yaml"),
    Case("run-config-explicit-missing", 2, _run(lambda run: None, "--config", "{run}/none.yaml"), "none.yaml"),
    Case("run-config-eos-not-in-vocab", 2, _run(_write("sft_config.yaml", "eos_token: <|im_end|>\n")),
         "sft_config.yaml"),
    Case("run-config-bad-truncation-mode", 2, _run(_write("sft_config.yaml", "truncation_mode: sideways\n")),
         "sft_config.yaml"),
    Case("run-config-template-not-utf8", 2, _run(_both(_write("tpl.jinja", b"\xff\xfe{{ x }}"),
                                                      _write("sft_config.yaml", "chat_template_path: tpl.jinja\n"))),
         "tpl.jinja"),
    Case("run-config-infinite-max-length", 2, _run(_write("sft_config.yaml", "max_length: .inf\n")), "sft_config.yaml"),
    Case("run-config-infinite-batch-size", 2, _run(_write("sft_config.yaml", "per_device_train_batch_size: .inf\n")),
         "sft_config.yaml"),
    Case("run-config-impossible-date", 2, _run(_write("sft_config.yaml", "run_name: 2024-02-30\n")), "sft_config.yaml"),
    Case("run-config-axolotl-datasets-not-list", 2,
         _run(_write("axolotl.yaml", "sequence_len: 512\ntrain_on_inputs: false\ndatasets: 1\n")), "axolotl.yaml"),
    Case("run-config-template-broken-jinja", 2,
         _run(_both(_write("tpl.jinja", "{% for message in %}{{ message }"),
                    _write("sft_config.yaml", "chat_template_path: tpl.jinja\n")), dataset=MESSAGES), "train.jsonl:1:"),
]

# ---------------------------------------------------------------------------------------------- models


def _model(damage: Callable[[Path], None], command: str = "diagnose", dataset: str = "") -> Build:
    """Copy the valid base model, apply `damage` to it, and run `command` on it."""

    def build(ws: Workspace, scratch: Path) -> list[str]:
        import shutil

        model = scratch / "model"
        shutil.copytree(ws.model, model)
        damage(model)
        data = ws.dataset
        if dataset:
            data = scratch / "train.jsonl"
            data.write_text(dataset, encoding="utf-8")
        if command == "attribute":
            return attribute_args(ws, scratch / "out", model=model, dataset=data, extra=("--force",))
        return ["diagnose", "--dataset", str(data), "--base-model", str(model), "--json"]

    return build


def _bigger_vocabulary(model: Path) -> None:
    """Replace the tokenizer with one of 26 more words that sort first: every word's id moves past the embedding."""
    from bad_inputs.workspace import WORDS
    from gradian.scenarios.tokenizer import build_tokenizer

    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        (model / name).unlink(missing_ok=True)
    build_tokenizer([*WORDS, *(f"a{c}" for c in "abcdefghijklmnopqrstuvwxyz")]).save_pretrained(model)


def _truncate(name: str, keep: int | None = None) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        path = folder / name
        data = path.read_bytes()
        path.write_bytes(data[: keep if keep is not None else len(data) // 2])

    return damage


def _drop_chat_template(model: Path) -> None:
    (model / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(config))


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")

MODEL_CASES = [
    Case("model-missing-folder", 2, lambda ws, s: ["diagnose", "--dataset", str(ws.dataset), "--base-model",
                                                   str(s / "no-model"), "--json"], "no-model"),
    Case("model-not-cached-hub-id", 2, lambda ws, s: ["diagnose", "--dataset", str(ws.dataset), "--base-model",
                                                      "nobody/no-such-model", "--json"], "nobody/no-such-model"),
    Case("model-is-a-text-file", 2, lambda ws, s: ["diagnose", "--dataset", str(ws.dataset), "--base-model",
                                                   str(ws.dataset), "--json"], "train.jsonl"),
    Case("model-no-config", 2, _model(_remove("config.json")), "model"),
    Case("model-config-corrupt", 2, _model(_write("config.json", '{"model_type": "llama", ')), "model"),
    Case("model-config-unknown-architecture", 2, _model(_write("config.json", '{"model_type": "no-such-arch"}')),
         "model"),
    Case("model-missing-tokenizer", 2, _model(_remove(*(n for n in TOKENIZER_FILES if n != "chat_template.jinja")))
         , "model"),
    Case("model-tokenizer-json-corrupt", 2, _model(_write("tokenizer.json", '{"version": "1.0", "model": ')), "model"),
    Case("model-garbage-gguf", 2, lambda ws, s: ["diagnose", "--dataset", str(ws.dataset), "--base-model",
                                                 str(_file(s / "model.gguf", b"GGUF" + bytes(60))), "--json"],
         "model.gguf"),
    Case("model-no-chat-template-for-messages", 2, _model(_drop_chat_template, dataset=MESSAGES), "train.jsonl:1:"),
    Case("model-vocabulary-mismatch", 2, _model(_bigger_vocabulary, command="attribute"), "model"),
    Case("model-weights-truncated", 2, _model(_truncate("model.safetensors"), command="attribute"), "model"),
    Case("model-weights-missing", 2, _model(_remove("model.safetensors"), command="attribute"), "model"),
]


def _file(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


# ---------------------------------------------------------------------------------------------- attribute's adapter


def _adapter(damage: Callable[[Path], None], **kwargs: Path) -> Build:
    def build(ws: Workspace, scratch: Path) -> list[str]:
        import shutil

        adapter = scratch / "adapter"
        shutil.copytree(ws.adapter, adapter)
        damage(adapter)
        return attribute_args(ws, scratch / "out", adapter=adapter, extra=("--force",))

    return build


def _other_base(**overrides: int) -> Callable[[Path], None]:
    """Replace the adapter with one trained on a model of other dimensions (same tokenizer)."""

    def damage(adapter: Path) -> None:
        from bad_inputs.workspace import WORDS
        from gradian.scenarios.tokenizer import build_tokenizer

        for child in adapter.iterdir():
            child.unlink()
        save_adapter(tiny_model(build_tokenizer(WORDS), seed=3, **overrides), adapter)

    return damage


ATTRIBUTE_CASES = [
    Case("attribute-adapter-config-missing", 2, _adapter(_remove("adapter_config.json")), "adapter"),
    Case("attribute-adapter-config-corrupt", 2, _adapter(_write("adapter_config.json", "{\"r\": 2,")),
         "adapter_config.json"),
    Case("attribute-adapter-weights-missing", 2, _adapter(_remove("adapter_model.safetensors")), "adapter"),
    Case("attribute-adapter-weights-truncated", 2, _adapter(_truncate("adapter_model.safetensors")),
         "adapter_model.safetensors"),
    Case("attribute-adapter-weights-header-only", 2, _adapter(_truncate("adapter_model.safetensors", keep=8)),
         "adapter_model.safetensors"),
    Case("attribute-adapter-weights-garbage", 2,
         _adapter(_write("adapter_model.safetensors", struct.pack("<Q", 10**12) + b"{}")), "adapter_model.safetensors"),
    Case("attribute-adapter-for-wider-base", 2, _adapter(_other_base(hidden_size=48, num_attention_heads=4)),
         "adapter"),
    Case("attribute-adapter-for-deeper-base", 2, _adapter(_other_base(num_hidden_layers=3)), "adapter"),
    Case("attribute-eval-dataset-missing", 2,
         lambda ws, s: attribute_args(ws, s / "out", eval_dataset=s / "eval-gone.jsonl"), "eval-gone.jsonl"),
    Case("attribute-eval-dataset-broken", 2,
         lambda ws, s: attribute_args(ws, s / "out", eval_dataset=_file(s / "ev.jsonl", b"{\n")), "ev.jsonl:1:"),
    Case("attribute-unknown-capability", 2,
         lambda ws, s: [*attribute_args(ws, s / "out"), "--capability", "no_such_capability"], "no_such_capability"),
]

def _lora_tensors(change: Callable[[Any], Any]) -> Callable[[Path], None]:
    """Apply `change` in place to every lora_A tensor of the adapter's safetensors file."""

    def damage(adapter: Path) -> None:
        from safetensors.torch import load_file, save_file

        tensors = load_file(adapter / "adapter_model.safetensors")
        for name, tensor in tensors.items():
            if "lora_A" in name:
                change(tensor)
        save_file(tensors, adapter / "adapter_model.safetensors", metadata={"format": "pt"})

    return damage


def _schema(schema: object) -> Build:
    def build(ws: Workspace, scratch: Path) -> list[str]:
        path = _file(scratch / "answer.schema.json", json.dumps(schema).encode())
        return [*attribute_args(ws, scratch / "out"), "--capability", f"json_schema:{path}"]

    return build


def _option(flag: str, value: str) -> Build:
    return lambda ws, s: attribute_args(ws, s / "out", extra=(flag, value, "--force"))


ATTRIBUTE_CASES += [
    Case("attribute-option-batch-size-zero", 2, _option("--batch-size", "0"), "batch"),
    Case("attribute-option-max-new-tokens-zero", 2, _option("--max-new-tokens", "0"), "new"),
    Case("attribute-option-min-effect-above-one", 2, _option("--min-effect", "2"), "effect"),
    Case("attribute-option-proj-dim-zero", 2, _option("--proj-dim", "0"), "proj"),
    # a projection smaller than the adapter's LoRA matrices was exit 3 (ValueError) after generating
    Case("attribute-option-proj-dim-below-the-matrices", 2, _option("--proj-dim", "1"), "--proj-dim 1 is smaller"),
    Case("attribute-option-negative-seed", 2, _option("--seed", "-1"), "seed"),
    # a seed past 2**32 - 1 was exit 3 at the clustering, after everything else had run
    Case("attribute-option-seed-past-32-bits", 2, _option("--seed", str(2**32)), "--seed"),
    Case("attribute-option-unknown-device", 2, _option("--device", "bogus"), "bogus"),
    Case("attribute-option-device-mps-absent", 2, _option("--device", "mps"), "mps: MPS"),
    Case("attribute-adapter-r-nan", 2, _adapter(_adapter_config(r=float("nan"))), "adapter_config.json"),
    # late failures, now refused before the first generation (issue 42)
    Case("attribute-adapter-weights-nan", 2, _adapter(_lora_tensors(lambda t: t.fill_(float("nan")))),
         "adapter_model.safetensors: the tensor"),
    Case("attribute-adapter-weights-infinite", 2, _adapter(_lora_tensors(lambda t: t.fill_(float("inf")))),
         "adapter_model.safetensors: the tensor"),
    Case("attribute-adapter-rank-not-the-configs", 2, _adapter(_adapter_config(r=4)),
         "(r=4) implies (4, "),
    Case("attribute-capability-regex-repeat-overflow", 2,
         lambda ws, s: [*attribute_args(ws, s / "out"), "--capability", "regex:a{99999999999}"], "regex:a{99999999999}"),
    Case("attribute-capability-schema-self-ref", 2, _schema({"$ref": "#"}), "answer.schema.json: never finishes"),
    Case("attribute-capability-schema-remote-ref", 2, _schema({"$ref": "https://example.com/answer.schema.json"}),
         "answer.schema.json: refers to another document"),
]

CASES = DATASET_CASES + RUN_CASES + MODEL_CASES + ATTRIBUTE_CASES
