"""Property-based fuzzing of the readers: whatever the bytes, a result or one `InputError`, never another exception.

Readers: `read_dataset` (JSONL / JSON array), `read_run` (trainer_state.json, adapter_config.json, a config
YAML/JSON), `read_training_args` (a pickle, mutated). Inputs that trigger a bug already recorded in the
corpus (tests/bad_inputs/corpus.py: run-log-history-not-list, run-config-infinite-*, run-config-impossible-date,
run-config-axolotl-datasets-not-list, run-adapter-base-name-not-text, run-step-is-text)
are kept out of the strategies with `assume`, so each test guards everything else; drop the `assume` once fixed.
"""

from __future__ import annotations

import json
import math
import pickle
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gradian.data.examples import Example, read_dataset
from gradian.data.run_folder import RunInfo, read_run
from gradian.data.training_args import read_training_args
from gradian.errors import InputError

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

KEYS = ("id", "prompt", "completion", "messages", "conversations", "text", "instruction", "input", "output",
        "role", "content", "from", "value", "reference")
RUN_KEYS = ("log_history", "global_step", "num_train_epochs", "train_batch_size", "step", "loss", "eval_loss",
            "grad_norm", "epoch", "learning_rate", "base_model_name_or_path", "r", "target_modules")
CONFIG_KEYS = ("max_length", "max_seq_length", "truncation_mode", "completion_only_loss", "assistant_only_loss",
               "packing", "eos_token", "pad_token", "data_collator", "collator_masks_pad", "learning_rate",
               "num_train_epochs", "per_device_train_batch_size", "gradient_accumulation_steps", "sequence_len",
               "train_on_inputs", "sample_packing", "excess_length_strategy", "datasets", "special_tokens",
               "chat_template_jinja", "micro_batch_size", "num_epochs", "adapter", "base_model", "type")

scalars = st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats(allow_nan=True) | st.text(max_size=20)


def json_values(keys: tuple[str, ...], leaves=scalars) -> st.SearchStrategy:
    """JSON-like values whose dicts mostly use `keys`, so the readers' branches are reached."""
    return st.recursive(
        leaves,
        lambda children: st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(keys) | st.text(max_size=8), children, max_size=5),
        max_leaves=12,
    )


def row_dicts() -> st.SearchStrategy:
    message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "x"]),
                                     "content": st.text(max_size=20) | scalars})
    known = st.fixed_dictionaries({}, optional={
        "id": scalars, "prompt": st.text(max_size=20) | st.lists(message, max_size=3) | scalars,
        "completion": st.text(max_size=20) | st.lists(message, max_size=3) | scalars,
        "messages": st.lists(message, max_size=3) | scalars, "text": st.text(max_size=20) | scalars,
        "instruction": st.text(max_size=10) | scalars, "output": st.text(max_size=10) | scalars,
        "conversations": st.lists(st.fixed_dictionaries({"from": st.sampled_from(["human", "gpt", "bot"]),
                                                         "value": st.text(max_size=10)}), max_size=3) | scalars,
    })
    return known | json_values(KEYS)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def _read(path: Path, eval_set: bool = False) -> list[Example] | None:
    try:
        examples = read_dataset(path, eval_set=eval_set)
    except InputError as error:
        assert str(error).startswith(str(path)) and "\n" not in str(error), str(error)
        return None
    assert examples and all(isinstance(e, Example) for e in examples)
    assert len({e.id for e in examples}) == len(examples)
    return examples


@FUZZ
@given(data=st.binary(max_size=2000))
def test_fuzz_dataset_bytes(data, folder):
    path = folder / "bytes.jsonl"
    path.write_bytes(data)
    _read(path)


@FUZZ
@given(rows=st.lists(row_dicts(), min_size=0, max_size=6), eval_set=st.booleans(), blank=st.booleans())
def test_fuzz_dataset_json_lines(rows, eval_set, blank, folder):
    path = folder / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + ("\n\n" if blank else "\n") for row in rows), encoding="utf-8")
    examples = _read(path, eval_set)
    if examples is not None:  # every accepted row is an object with fields Gradian can render
        assert all(e.shape in ("prompt_completion", "conversational_prompt_completion", "messages", "text")
                   for e in examples)


@FUZZ
@given(rows=st.lists(row_dicts(), max_size=6) | json_values(KEYS))
def test_fuzz_dataset_json_array(rows, folder):
    path = folder / "array.json"
    path.write_text(json.dumps(rows, indent=1) if isinstance(rows, list) else "[" + json.dumps(rows), encoding="utf-8")
    _read(path)


def _read_run(run: Path, config: Path | None = None) -> RunInfo | None:
    try:
        info = read_run(run, config)
    except InputError as error:
        assert "\n" not in str(error), str(error)
        return None
    assert isinstance(info, RunInfo) and all(isinstance(row, dict) for row in info.log_history)
    return info


def _fresh_run(folder: Path, name: str) -> Path:
    run = folder / name
    if run.exists():
        shutil.rmtree(run)
    run.mkdir()
    return run


def _known_bug_free(value) -> bool:
    """Not a non-list log_history (corpus case run-log-history-not-list)."""
    return not (isinstance(value, dict) and "log_history" in value and not isinstance(value["log_history"], list))


file_contents = json_values(RUN_KEYS).map(lambda v: json.dumps(v).encode()) | st.binary(max_size=300)


@FUZZ
@given(state=file_contents, adapter=file_contents | st.none())
def test_fuzz_run_folder(state, adapter, folder):
    for content in (state, adapter):
        if content is not None:
            try:
                assume(_known_bug_free(json.loads(content)))
            except ValueError:
                pass
    run = _fresh_run(folder, "run")
    (run / "trainer_state.json").write_bytes(state)
    if adapter is not None:
        (run / "adapter_config.json").write_bytes(adapter)
    _read_run(run)


@FUZZ
@given(log=st.lists(json_values(RUN_KEYS, scalars), max_size=8))
def test_fuzz_log_history(log, folder):
    """Any list of log rows reads; rows that are not objects are skipped."""
    run = _fresh_run(folder, "log")
    (run / "trainer_state.json").write_text(json.dumps({"log_history": log}))
    info = _read_run(run)
    assert info is not None and len(info.log_history) == sum(isinstance(row, dict) for row in log)


finite = st.none() | st.booleans() | st.integers(-(10**9), 10**9) | st.floats(allow_nan=False, allow_infinity=False) \
    | st.text(max_size=20)


@FUZZ
@given(config=st.dictionaries(st.sampled_from(CONFIG_KEYS), json_values(CONFIG_KEYS, finite), max_size=8)
       | json_values(CONFIG_KEYS, finite), as_json=st.booleans())
def test_fuzz_config(config, as_json, folder):
    datasets = config.get("datasets") if isinstance(config, dict) else None
    assume(not datasets or isinstance(datasets, list))  # corpus case run-config-axolotl-datasets-not-list
    path = folder / ("config.json" if as_json else "config.yaml")
    path.write_text(json.dumps(config) if as_json else yaml.safe_dump(config), encoding="utf-8")
    info = _read_run(None, path)
    if info is not None and info.setup.max_length is not None:
        assert isinstance(info.setup.max_length, int)


@FUZZ
@given(text=st.text(max_size=300))
def test_fuzz_config_text(text, folder):
    assume(not any(c.isdigit() for c in text) or "-" not in text)  # dates: corpus case run-config-impossible-date
    assume(".inf" not in text.lower())  # corpus case run-config-infinite-max-length
    path = folder / "text.yaml"
    path.write_text(text, encoding="utf-8")
    _read_run(None, path)


@pytest.fixture(scope="module")
def real_training_args() -> bytes:
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir="out", learning_rate=3e-4, num_train_epochs=2, report_to=[])
    return pickle.dumps(args, protocol=2)


@FUZZ
@given(flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=6),
       cut=st.integers(0, 10**6) | st.none())
def test_fuzz_training_args(flips, cut, real_training_args, folder):
    """A real training_args pickle with bytes changed or cut: fields or InputError, never another exception."""
    data = bytearray(real_training_args)
    for position, value in flips:
        data[position % len(data)] = value
    if cut is not None:
        data = data[: cut % len(data)]
    path = folder / "training_args.bin"
    path.write_bytes(bytes(data))
    try:
        fields = read_training_args(path)
    except InputError as error:
        assert str(error).startswith(str(path)), str(error)
        return
    assert isinstance(fields, dict)


def test_training_args_unmutated_reads(real_training_args, folder):
    """The fuzzed file is a real one: unmutated, its fields come back (so mutations start from a valid file)."""
    path = folder / "training_args.bin"
    path.write_bytes(real_training_args)
    fields = read_training_args(path)
    assert fields["learning_rate"] == 3e-4 and math.isclose(fields["num_train_epochs"], 2)
    torch.save({"learning_rate": 1e-3}, path)  # the zip form (torch.save) reads too
    assert read_training_args(path)["learning_rate"] == 1e-3


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from bad_inputs.workspace import build_workspace

    return build_workspace(tmp_path_factory.mktemp("fuzz-world"))


log_values = st.none() | st.booleans() | st.integers(-5, 10**4) | st.floats(allow_infinity=False) | st.text(max_size=8)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(adapter=st.dictionaries(st.sampled_from(RUN_KEYS + ("lora_alpha", "use_rslora")), json_values(RUN_KEYS, finite),
                               max_size=5),
       log=st.lists(st.dictionaries(st.sampled_from(RUN_KEYS), log_values, max_size=5), max_size=12))
def test_fuzz_diagnose_run_folder(adapter, log, world):
    """The audit checks over a fuzzed adapter_config.json and log_history: findings or InputError, nothing else."""
    from gradian.audit import diagnose

    # known bugs, kept out (corpus cases run-adapter-base-name-not-text, run-step-is-text)
    assume(isinstance(adapter.get("base_model_name_or_path"), (str, type(None))))
    assume(all(isinstance(row.get("step", 0), (int, float)) for row in log))
    run = world.root / "fuzz-run"
    if run.exists():
        shutil.rmtree(run)
    shutil.copytree(world.run, run)
    (run / "adapter_config.json").write_text(json.dumps(adapter))
    (run / "trainer_state.json").write_text(json.dumps({"global_step": 4, "log_history": log}))
    try:
        result = diagnose(world.dataset, base_model=str(world.model), run=run)
    except InputError as error:
        assert "\n" not in str(error)
        return
    assert all(f.severity in ("critical", "warning", "info") for f in result.findings)
