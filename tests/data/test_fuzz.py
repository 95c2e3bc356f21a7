"""Property-based fuzzing of the readers: whatever the bytes, a result or one `InputError`, never another exception.

Readers: `read_dataset` (JSONL / JSON array, train and eval set), `read_run` (trainer_state.json,
adapter_config.json, gradian_run.json, a config YAML/JSON through `data.safe_yaml`), `read_training_args` (a pickle,
mutated, through its safe unpickler), `read_recorded_rows` (gradian_rows.safetensors), the served answers and the
served model folder (`--served-outputs`, `--served-model`), and the audit over a fuzzed run folder. The budget, the time limit per input
and the checks (one sentence, input unchanged) are `tests/fuzzing.py`'s. A failure the fuzzer found is pinned with
`@example` under its test.
"""

from __future__ import annotations

import hashlib
import json
import math
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fuzzing import EXAMPLES, FUZZ, answer, bounded
from gradian.data.examples import Example, read_dataset
from gradian.data.run_folder import RunInfo, read_run
from gradian.data.training_args import read_training_args

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
    examples = answer(lambda: read_dataset(path, eval_set=eval_set), path, names=str(path))
    if examples is None:
        return None
    assert examples and all(isinstance(e, Example) for e in examples)
    assert len({e.id for e in examples}) == len(examples)
    return examples


@FUZZ
@given(data=st.binary(max_size=2000), eval_set=st.booleans())
@bounded
def test_fuzz_dataset_bytes(data, eval_set, folder):
    path = folder / "bytes.jsonl"
    path.write_bytes(data)
    _read(path, eval_set)


@FUZZ
@given(rows=st.lists(row_dicts(), min_size=0, max_size=6), eval_set=st.booleans(), blank=st.booleans())
@bounded
def test_fuzz_dataset_json_lines(rows, eval_set, blank, folder):
    path = folder / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + ("\n\n" if blank else "\n") for row in rows), encoding="utf-8")
    examples = _read(path, eval_set)
    if examples is not None:  # every accepted row is an object with fields Gradian can render
        assert all(e.shape in ("prompt_completion", "conversational_prompt_completion", "messages", "text")
                   for e in examples)


@FUZZ
@given(rows=st.lists(row_dicts() | st.fixed_dictionaries({"messages": st.just([{"role": "user", "content": "my order"}]),
                                                           "tools": scalars | json_values(KEYS),
                                                           "chat_template_kwargs": scalars | json_values(KEYS)}),
                     min_size=1, max_size=6),
       assistant_only=st.booleans())
@bounded
def test_fuzz_rows_through_trls_preparation(rows, assistant_only, folder, tiny_tokenizer):
    """Rows the reader accepts, prepared by TRL's own code (or the port where TRL's code refuses them): rows or one
    InputError, never another exception."""
    from gradian.data.render import render_dataset
    from gradian.data.setup import TrainingSetup

    path = folder / "prepared.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    examples = _read(path)
    if examples is not None:
        setup = TrainingSetup(assistant_only_loss=assistant_only, max_length=16)
        rendered = answer(lambda: render_dataset(examples, tiny_tokenizer, setup), path)
        assert rendered is None or len(rendered) == len(examples)


@FUZZ
@given(rows=st.lists(row_dicts(), max_size=6) | json_values(KEYS))
@bounded
def test_fuzz_dataset_json_array(rows, folder):
    path = folder / "array.json"
    path.write_text(json.dumps(rows, indent=1) if isinstance(rows, list) else "[" + json.dumps(rows), encoding="utf-8")
    _read(path)


def _read_run(run: Path | None, config: Path | None = None) -> RunInfo | None:
    info = answer(lambda: read_run(run, config), *(p for p in (run, config) if p is not None))
    if info is None:
        return None
    assert isinstance(info, RunInfo) and all(isinstance(row, dict) for row in info.log_history)
    return info


def _fresh_run(folder: Path, name: str) -> Path:
    run = folder / name
    if run.exists():
        shutil.rmtree(run)
    run.mkdir()
    return run


file_contents = json_values(RUN_KEYS).map(lambda v: json.dumps(v).encode()) | st.binary(max_size=300)


@FUZZ
@given(state=file_contents, adapter=file_contents | st.none())
@bounded
def test_fuzz_run_folder(state, adapter, folder):
    run = _fresh_run(folder, "run")
    (run / "trainer_state.json").write_bytes(state)
    if adapter is not None:
        (run / "adapter_config.json").write_bytes(adapter)
    _read_run(run)


@FUZZ
@given(log=st.lists(json_values(RUN_KEYS, scalars), max_size=8))
@bounded
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
@bounded
def test_fuzz_config(config, as_json, folder):
    path = folder / ("config.json" if as_json else "config.yaml")
    path.write_text(json.dumps(config) if as_json else yaml.safe_dump(config), encoding="utf-8")
    info = _read_run(None, path)
    if info is not None and info.setup.max_length is not None:
        assert isinstance(info.setup.max_length, int)


@FUZZ
@given(text=st.text(max_size=300))
@bounded
def test_fuzz_config_text(text, folder):
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
@bounded
def test_fuzz_training_args(flips, cut, real_training_args, folder):
    """A real training_args pickle with bytes changed or cut: fields or InputError, never another exception."""
    data = bytearray(real_training_args)
    for position, value in flips:
        data[position % len(data)] = value
    if cut is not None:
        data = data[: cut % len(data)]
    path = folder / "training_args.bin"
    path.write_bytes(bytes(data))
    fields = answer(lambda: read_training_args(path), path, names=str(path))
    assert fields is None or isinstance(fields, dict)


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


@settings(FUZZ, max_examples=max(10, EXAMPLES // 2))
@given(adapter=st.dictionaries(st.sampled_from(RUN_KEYS + ("lora_alpha", "use_rslora")), json_values(RUN_KEYS, finite),
                               max_size=5),
       log=st.lists(st.dictionaries(st.sampled_from(RUN_KEYS), log_values, max_size=5), max_size=12))
@bounded
def test_fuzz_diagnose_run_folder(adapter, log, world):
    """The audit checks over a fuzzed adapter_config.json and log_history: findings or InputError, nothing else."""
    from gradian.audit import diagnose

    run = world.root / "fuzz-run"
    if run.exists():
        shutil.rmtree(run)
    shutil.copytree(world.run, run)
    (run / "adapter_config.json").write_text(json.dumps(adapter))
    (run / "trainer_state.json").write_text(json.dumps({"global_step": 4, "log_history": log}))
    result = answer(lambda: diagnose(world.dataset, base_model=str(world.model), run=run), run, world.dataset)
    if result is None:
        return
    assert all(f.severity in ("critical", "warning", "info") for f in result.findings)


yaml_text = st.text(alphabet=st.sampled_from(list("ab:-[]{}&*!|>'\"#\n ,.?0129e+x")), max_size=200)


@FUZZ
@given(text=yaml_text | st.text(max_size=200))
@bounded
def test_fuzz_safe_yaml(text, folder):
    """YAML's own syntax, fuzzed (anchors, aliases, tags, flow collections): a value or one sentence."""
    from gradian.data.run_folder import read_config_file

    path = folder / "fuzz.yaml"
    path.write_text(text, encoding="utf-8")
    config = answer(lambda: read_config_file(path), path, names=str(path))
    assert config is None or isinstance(config, dict)


record_keys = ("format", "version", "steps", "rows", "hashes", "step", "epoch", "learning_rate", "collator",
               "masks_pad", "rendering", "trainer", "versions", "class", "trl", "transformers", "dataset", "ids",
               "seeds", "seed", "complete", "max_length", "num_train_epochs")


@FUZZ
@given(record=st.fixed_dictionaries({"format": st.just("gradian_run"), "version": st.just(1)},
                                    optional={key: json_values(record_keys) for key in record_keys[2:]}))
# found by this test: a record field of another type crashed the property reading it (AttributeError, TypeError)
@example(record={"format": "gradian_run", "version": 1, "collator": 0})
@example(record={"format": "gradian_run", "version": 1, "trainer": {"versions": 1}})
@example(record={"format": "gradian_run", "version": 1, "steps": True})
@example(record={"format": "gradian_run", "version": 1, "steps": [0]})
@example(record={"format": "gradian_run", "version": 1, "steps": [{"rows": ["a"], "epoch": 0}]})
@example(record={"format": "gradian_run", "version": 1, "steps": [{"rows": [1], "epoch": 10**12}]})
@example(record={"format": "gradian_run", "version": 1, "steps": [{"step": 1, "learning_rate": "x"}]})
@example(record={"format": "gradian_run", "version": 1, "collator": {"class": True}})
@bounded
def test_fuzz_run_record(record, folder):
    """gradian_run.json of the right format and version, its fields fuzzed: every property a reader uses answers."""
    run = _fresh_run(folder, "record")
    (run / "trainer_state.json").write_text(json.dumps({"global_step": 1, "log_history": []}))
    (run / "gradian_run.json").write_text(json.dumps(record))

    def read_all():
        info = read_run(run)
        record = info.record
        return record and (record.order, record.epochs if record.steps else None, record.learning_rates,
                           record.setup_fields(), record.framework(), record.version_range(), record.describe())

    answer(read_all, run)


def _rows_file(tensors: dict[str, np.ndarray]) -> bytes:
    from safetensors.numpy import save

    return save(tensors, metadata={"format": "gradian_rows", "version": "1"})


def _valid_rows() -> dict[str, np.ndarray]:
    from safetensors.numpy import load

    from gradian.data.recorded_rows import rows_file_bytes
    from gradian.data.render import IGNORE, Rendered

    rows = [Rendered("a", [1, 5, 7, 2], [IGNORE, IGNORE, 7, 2], 4, 2, False, False, ""),
            Rendered("b", [1, 6, 2], [IGNORE, 6, 2], 3, 1, False, False, "truncated")]
    return load(rows_file_bytes(rows, [b"\x01" * 8, None]))


tensor_names = st.sampled_from(sorted(_valid_rows()))
arrays = hnp.arrays(st.sampled_from([np.int32, np.int64, np.uint8, np.float32]),
                    hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=5))


@FUZZ
@given(replaced=st.dictionaries(tensor_names, arrays, max_size=3), removed=st.sets(tensor_names, max_size=2),
       flips=st.lists(st.tuples(st.integers(0, 10**4), st.integers(0, 255)), max_size=4),
       rows=st.integers(-1, 4) | st.none())
# found by this test: an offsets tensor of no dimension crashed the check of the tensors' shapes (TypeError)
@example(replaced={"offsets": np.zeros((), np.int64)}, removed=set(), flips=[], rows=2)
@bounded
def test_fuzz_recorded_rows(replaced, removed, flips, rows, folder):
    """gradian_rows.safetensors with tensors replaced, removed or bytes changed, its SHA-256 in the record made to
    match (the file and the record edited together): every row and content hash reads, or one InputError."""
    from gradian.data.recorded_rows import read_recorded_rows

    tensors = {**_valid_rows(), **replaced}
    data = bytearray(_rows_file({k: v for k, v in tensors.items() if k not in removed}))
    for position, value in flips:
        data[position % len(data)] = value
    path = folder / "gradian_rows.safetensors"
    path.write_bytes(bytes(data))
    reference = {"file": path.name, "sha256": hashlib.sha256(bytes(data)).hexdigest(), "rows": rows}

    def read_all():
        recorded = read_recorded_rows(path, reference)
        return [(recorded.row(j, str(j)), recorded.content(j)) for j in range(len(recorded))]

    answer(read_all, path, names=str(path))


def test_recorded_rows_unmutated_read():
    """The fuzzed rows file is a valid one: unmutated, both rows come back as written."""
    from gradian.data.recorded_rows import RecordedRows

    recorded = RecordedRows(Path("rows"), _valid_rows())
    assert recorded.row(0, "a").labels == [-100, -100, 7, 2] and recorded.row(1, "b").over_limit == "truncated"
    assert recorded.content(0) == b"\x01" * 8 and recorded.content(1) is None


DEEP = "[" * 5000 + "]" * 5000  # past the JSON parser's recursion limit: json.loads raises RecursionError


@pytest.mark.parametrize("where", ["trainer_state.json", "adapter_config.json", "config.json", "gradian_run.json",
                                   "served.jsonl", "completion"])
def test_json_nested_too_deeply_is_one_sentence(where, folder, tmp_path):
    """Found by hand after the fuzz budgets never generated it: JSON nested past the parser's recursion limit
    raised RecursionError (exit 3) in every reader that caught only JSONDecodeError. Each refuses it in one sentence,
    or reads past it where the text is a training answer (a row cut in the data is told by its brackets)."""
    from gradian.audit.truncation import json_cut
    from gradian.regression.served import read_served_outputs

    if where == "completion":
        assert json_cut(DEEP) is None and json_cut(DEEP[:-1]) == "unbalanced JSON (1 unclosed bracket)"
        return
    if where == "served.jsonl":
        path = tmp_path / where
        path.write_text(DEEP + "\n")
        assert answer(lambda: read_served_outputs(path, ["e1"]), path, names=str(path)) is None
        return
    run = _fresh_run(folder, "deep")
    (run / "trainer_state.json").write_text(json.dumps({"global_step": 1, "log_history": []}))
    (run / where).write_text(DEEP)
    read = (lambda: read_run(run)) if where != "config.json" else (lambda: read_run(run, config=run / where))
    assert answer(read, run, names=str(run / where)) is None


SERVE_KEYS = ("eos_token_id", "max_new_tokens", "dtype", "torch_dtype", "pad_token_id", "chat_template", "name",
              "template")


@FUZZ
@given(generation=json_values(SERVE_KEYS) | st.none(), config=json_values(SERVE_KEYS) | st.none(),
       template=st.binary(max_size=60) | st.none())
@example(generation={"eos_token_id": ["x"]}, config=None, template=None)  # found by this test: ValueError
@example(generation={"eos_token_id": 1.5}, config=None, template=None)  # TypeError
@example(generation=None, config=None, template=b"\xff")  # UnicodeDecodeError
@bounded
def test_fuzz_served_export(generation, config, template, folder):
    """The served model folder's generation_config.json, config.json and chat_template.jinja with any values: what
    serving says (stop ids, token limit, dtype, template) of the types the differences read, or one InputError."""
    from gradian.regression.serving_diff import read_export

    served = _fresh_run(folder, "served")
    for name, value in (("generation_config.json", generation), ("config.json", config)):
        if value is not None:
            (served / name).write_text(json.dumps(value))
    if template is not None:
        (served / "chat_template.jinja").write_bytes(template)
    export = answer(lambda: read_export(served), served)
    if export is not None:
        assert export.eos_token_ids is None or all(isinstance(i, int) and i >= 0 for i in export.eos_token_ids)
        assert export.max_new_tokens is None or (isinstance(export.max_new_tokens, int) and export.max_new_tokens > 0)
        assert export.chat_template is None or isinstance(export.chat_template, str)


@FUZZ
@given(lines=st.lists(json_values(("id", "output")) | st.fixed_dictionaries(
    {"id": scalars, "output": scalars}), max_size=4) | st.binary(max_size=200))
@bounded
def test_fuzz_served_outputs(lines, tmp_path_factory):
    """--served-outputs as bytes or JSON lines of any shape: {eval id: text} for every eval row, or one InputError."""
    from gradian.regression.served import read_served_outputs

    path = tmp_path_factory.mktemp("served") / "served.jsonl"
    path.write_bytes(lines if isinstance(lines, bytes) else "\n".join(json.dumps(v) for v in lines).encode())
    outputs = answer(lambda: read_served_outputs(path, ["e1", "1"]), path, names=str(path))
    assert outputs is None or (set(outputs) == {"e1", "1"} and all(isinstance(v, str) for v in outputs.values()))
