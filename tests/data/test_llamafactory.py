"""LLaMA-Factory runs are never read as TRL. Where LLaMA-Factory is not installed, its config (passed or in the run
folder), its training_args.bin and the files it writes into output_dir are refused with one sentence naming the
package to install; where it is, its own code prepares the rows (the tests marked `needs_llamafactory`, run in
LLaMA-Factory's venv: benchmarks/harness/llamafactory_conformance.py). Its dataset_info.json given as a dataset is
named as the registry it is, with the data files it lists."""

from __future__ import annotations

import importlib.util
import json
import pickle
import sys
import types

import pytest
import yaml

from bad_inputs.corpus import diagnose_args
from bad_inputs.fixtures import assert_one_line_error, error_line, gradian, workspace  # noqa: F401
from gradian.data.run_folder import read_run
from gradian.errors import InputError

# examples/train_lora/llama3_lora_sft.yaml as LLaMA-Factory ships it (trimmed)
LLAMAFACTORY_SFT = {
    "model_name_or_path": "meta-llama/Meta-Llama-3-8B-Instruct", "stage": "sft", "do_train": True,
    "finetuning_type": "lora", "lora_rank": 8, "lora_target": "all", "dataset": "identity,alpaca_en_demo",
    "template": "llama3", "cutoff_len": 2048, "max_samples": 1000, "output_dir": "saves/llama3-8b/lora/sft",
    "per_device_train_batch_size": 1, "gradient_accumulation_steps": 8, "learning_rate": 1.0e-4,
    "num_train_epochs": 3.0,
}
REFUSAL = ("; Gradian prepares its rows with LLaMA-Factory's own code (its template, cutoff_len and "
           "train_on_prompt), and LLaMA-Factory is not installed here: install it beside Gradian (pip install "
           "llamafactory, the version the run used) and run Gradian again.")
INSTALLED = importlib.util.find_spec("llamafactory") is not None
without_llamafactory = pytest.mark.skipif(INSTALLED, reason="LLaMA-Factory is installed: its code prepares the rows")
needs_llamafactory = pytest.mark.skipif(not INSTALLED, reason="LLaMA-Factory is not installed (a venv of its own)")
REGISTRY = {
    "identity": {"file_name": "identity.json"},
    "alpaca_en_demo": {"file_name": "alpaca_en_demo.json"},
    "tickets": {"file_name": "tickets.jsonl", "formatting": "sharegpt",
                "columns": {"messages": "conversations"}, "tags": {"role_tag": "from", "content_tag": "value"}},
}


@without_llamafactory
def test_llamafactory_config_passed_as_config_is_refused(workspace, gradian, tmp_path):  # noqa: F811
    config = tmp_path / "llama3_lora_sft.yaml"
    config.write_text(yaml.safe_dump(LLAMAFACTORY_SFT), encoding="utf-8")
    result = gradian(diagnose_args(workspace, workspace.dataset, "--run", workspace.run, "--config", config))
    assert_one_line_error(result, "llama3_lora_sft.yaml")
    assert error_line(result) == f"Error: {config}: this is a LLaMA-Factory config{REFUSAL}"


@pytest.mark.parametrize("keys", [{"stage": "sft", "template": "qwen", "dataset": "mine"}, {"cutoff_len": 1024},
                                  {"finetuning_type": "lora"}, {"train_on_prompt": True}],
                         ids=["stage-template", "cutoff_len", "finetuning_type", "train_on_prompt"])
@without_llamafactory
def test_llamafactory_config_in_the_run_folder_is_refused(keys, workspace, tmp_path):  # noqa: F811
    run = tmp_path / "run"
    run.mkdir()
    (run / "adapter_config.json").write_text(json.dumps({"r": 2}), encoding="utf-8")
    (run / "config.yaml").write_text(yaml.safe_dump(keys), encoding="utf-8")
    with pytest.raises(InputError, match="this is a LLaMA-Factory config; Gradian prepares its rows with LLaMA-Factory's own code"):
        read_run(run)


def fake_run(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoint-4").mkdir(parents=True)
    for folder in (run, run / "checkpoint-4"):
        (folder / "adapter_config.json").write_text(json.dumps({"r": 2}), encoding="utf-8")
    return run


@without_llamafactory
def test_web_ui_training_args_yaml_is_refused(tmp_path):
    run = fake_run(tmp_path)
    (run / "training_args.yaml").write_text(yaml.safe_dump(LLAMAFACTORY_SFT), encoding="utf-8")
    with pytest.raises(InputError) as refused:
        read_run(run / "checkpoint-4")  # a checkpoint folder: LLaMA-Factory's files sit above it
    assert str(refused.value) == f"{run.resolve() / 'training_args.yaml'}: this is a LLaMA-Factory config{REFUSAL}"


def test_its_trainer_log_is_recognised(tmp_path):
    run = fake_run(tmp_path)
    line = {"current_steps": 1, "total_steps": 4, "loss": 1.2, "learning_rate": 1e-4, "epoch": 0.25}
    (run / "trainer_log.jsonl").write_text(json.dumps(line) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match="trainer_log.jsonl: LLaMA-Factory wrote this file"):
        read_run(run)


def test_its_training_args_bin_is_recognised(tmp_path, monkeypatch):
    """LLaMA-Factory's trainer pickles its own TrainingArguments (read without importing anything)."""
    module = types.ModuleType("llamafactory.hparams.training_args")
    holder = type("TrainingArguments", (), {"__module__": module.__name__})
    module.TrainingArguments = holder
    for name in ("llamafactory", "llamafactory.hparams"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    args = holder()
    args.__dict__.update({"learning_rate": 1e-4, "output_dir": "saves/x"})
    run = fake_run(tmp_path)
    (run / "training_args.bin").write_bytes(pickle.dumps(args))
    with pytest.raises(InputError, match="training_args.bin holds LLaMA-Factory's TrainingArguments"):
        read_run(run)


def test_a_trl_run_is_still_read(tmp_path):
    run = fake_run(tmp_path)
    (run / "sft_config.yaml").write_text(yaml.safe_dump({"max_length": 300, "dataset_text_field": "text"}))
    (run / "trainer_log.jsonl").write_text('{"step": 1, "loss": 1.0}\n')  # not LLaMA-Factory's log
    assert read_run(run).setup.max_length == 300


@pytest.mark.parametrize("indent", [2, None], ids=["pretty", "one-line"])
@pytest.mark.parametrize("flag", ["--dataset", "--eval-dataset"])
def test_dataset_info_json_is_named_as_the_registry(indent, flag, workspace, gradian, tmp_path):  # noqa: F811
    registry = tmp_path / "dataset_info.json"
    registry.write_text(json.dumps(REGISTRY, indent=indent) + "\n", encoding="utf-8")
    args = diagnose_args(workspace, registry) if flag == "--dataset" else diagnose_args(
        workspace, workspace.dataset, "--eval-dataset", registry)
    result = gradian(args)
    assert_one_line_error(result, "dataset_info.json")
    assert error_line(result) == (
        f"Error: {registry}: this is LLaMA-Factory's dataset registry (dataset_info.json), not rows; pass the data "
        "file it lists for the run's dataset instead (it lists identity.json, alpaca_en_demo.json, tickets.jsonl, "
        "file names relative to its folder).")


def test_a_llamafactory_config_is_read_by_its_own_names():
    from gradian.data.config_fields import detect_framework, setup_fields

    config = {**LLAMAFACTORY_SFT, "train_on_prompt": True, "cutoff_len": 300, "hf_hub_token": "hf_secret"}
    assert detect_framework(config) == "llamafactory"
    fields = setup_fields(config, "llamafactory")
    assert fields["max_length"] == 300 and fields["completion_only_loss"] is False
    assert fields["llamafactory"]["template"] == "llama3"  # the whole YAML, for its own DataArguments
    assert "hf_hub_token" not in fields["llamafactory"]  # never written into a report


@without_llamafactory
def test_verify_without_llamafactory_refuses_its_run(tmp_path):
    """verify retrains a LLaMA-Factory run on the rows its own code prepares: without it, one sentence."""
    from gradian.data.run_folder import RunInfo
    from gradian.verify.recipe import read_recipe

    run = RunInfo(path=None, config=dict(LLAMAFACTORY_SFT), config_path=tmp_path / "sft.yaml")
    with pytest.raises(InputError) as refused:
        read_recipe(run)
    assert str(refused.value) == f"{tmp_path / 'sft.yaml'}: this is a LLaMA-Factory run{REFUSAL}"


@needs_llamafactory
@pytest.mark.parametrize("keys", [{"stage": "dpo"}, {"finetuning_type": "freeze"}])
def test_verify_refuses_what_is_not_a_supervised_lora_run(keys, tmp_path):
    from gradian.data.run_folder import RunInfo
    from gradian.verify.recipe import read_recipe

    run = RunInfo(path=None, config={**LLAMAFACTORY_SFT, **keys}, config_path=tmp_path / "sft.yaml")
    with pytest.raises(InputError, match="Gradian retrains supervised LoRA runs only"):
        read_recipe(run)


def test_alpaca_history_is_read_as_the_conversation_it_trains(tmp_path, tiny_tokenizer):
    """LLaMA-Factory's Alpaca rows carry earlier turns in `history`: a cut in one of them is a cut trained, unless
    the row's labels say the turn carries no loss (`mask_history` trains the last turn only)."""
    from gradian.audit.truncation import trained_answers
    from gradian.data.examples import read_dataset
    from gradian.data.render import IGNORE, Rendered

    row = {"instruction": "and the next", "input": "", "output": '{"a": 2}', "history": [["first", '{"a": 1, "b']]}
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n", encoding="utf-8")
    (example,) = read_dataset(path)
    assert example.shape == "messages"
    assert trained_answers(example) == ['{"a": 1, "b', '{"a": 2}']
    pieces = [tiny_tokenizer.encode(text, add_special_tokens=False)
              for text in ("first\n", '{"a": 1, "b', "\nand the next\n", '{"a": 2}')]
    ids = [i for piece in pieces for i in piece]

    def rendered(trained: set[int]) -> Rendered:
        labels = [i if n in trained else IGNORE for n, piece in enumerate(pieces) for i in piece]
        return Rendered("0", ids, labels, len(ids), len(pieces[0]))

    assert trained_answers(example, rendered({1, 3}), tiny_tokenizer) == ['{"a": 1, "b', '{"a": 2}']
    assert trained_answers(example, rendered({3}), tiny_tokenizer) == ['{"a": 2}']  # mask_history's labels


def orders_run(model, tmp_path, **keys):
    """A LLaMA-Factory run of 12 Alpaca rows registered in a dataset_info.json, cut at 24 tokens: (its YAML, the
    data folder); `keys` join the YAML."""
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"instruction": f"please json for my {w}", "input": "", "output": f'{{"name": "{w}", "id": {i}}}'}
            for i, w in enumerate(["refund", "order", "invoice", "amount"] * 3)]
    (data / "orders.json").write_text(json.dumps(rows), encoding="utf-8")
    (data / "dataset_info.json").write_text(json.dumps({"orders": {"file_name": "orders.json"}}), encoding="utf-8")
    config = tmp_path / "sft.yaml"
    config.write_text(json.dumps({
        "model_name_or_path": str(model), "stage": "sft", "do_train": True, "finetuning_type": "lora",
        "dataset": "orders", "dataset_dir": str(data), "template": "default", "cutoff_len": 24,
        "output_dir": str(tmp_path / "out"), "overwrite_cache": True, "report_to": "none", **keys}), encoding="utf-8")
    return config, data


@needs_llamafactory
@pytest.mark.parametrize(("template", "check"), [("default", "truncated_completion"), ("falcon", "eos_after_cut")])
def test_its_own_code_prepares_the_rows_diagnose_reads(template, check, workspace, gradian, tmp_path):  # noqa: F811
    """Rows equal LLaMA-Factory's own `get_dataset` (what `llamafactory-cli train` runs), cut rows named with the
    setting's own name (a template with `efficient_eos` appends EOS after the cut: the rows teach stopping
    mid-answer), and the report says whose code prepared them."""
    from benchmarks.harness.axolotl_conformance import gradian_rows
    from benchmarks.harness.llamafactory_conformance import llamafactory_rows

    config, data = orders_run(workspace.model, tmp_path, template=template)
    rows = json.loads((data / "orders.json").read_text())
    result = gradian(diagnose_args(workspace, data / "orders.json", "--config", config))
    assert result.exit_code in (0, 1), result.output[-3000:]
    report = json.loads(result.stdout)
    theirs = sorted(llamafactory_rows(config))
    assert sorted(gradian_rows(config, workspace.model, data / "orders.json")[0]) == theirs  # ids and loss positions
    assert report["preparation"]["code"] == "trainer"
    assert report["preparation"]["text"].startswith("rows as LLaMA-Factory prepares them (LLaMA-Factory ")
    assert len(theirs) == len(rows) and any(len(ids) == 24 for ids, _ in theirs)  # rows cut at cutoff_len
    cut = [f for f in report["findings"] if f["check"] == check]
    assert cut and "cutoff_len" in cut[0]["fix"]


@needs_llamafactory
def test_its_rows_are_kept_by_content_and_read_back(workspace, tmp_path, monkeypatch):  # noqa: F811
    """A second pass over the same rows, tokenizer and YAML reads LLaMA-Factory's rows back from the cache, equal."""
    from gradian.data import trainer_code
    from gradian.data.base_model import load_tokenizer, resolve_base_model
    from gradian.data.examples import read_dataset
    from gradian.data.render import render_dataset
    from gradian.data.rows_cache import MIN_ROWS
    from gradian.data.trl_prepare import Preparation

    monkeypatch.setenv("GRADIAN_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"instruction": f"json for my order {i}", "input": "", "output": f'{{"id": {i}}}'}) + "\n"
                            for i in range(MIN_ROWS)), encoding="utf-8")
    config = tmp_path / "sft.yaml"
    config.write_text(yaml.safe_dump({"stage": "sft", "template": "default", "cutoff_len": 64}), encoding="utf-8")
    setup = read_run(None, config).setup
    tokenizer, examples = load_tokenizer(resolve_base_model(str(workspace.model))), read_dataset(data)
    passes = []
    for _ in range(2):
        trainer_code._BUILT.clear()  # a new run of Gradian: nothing held in memory
        tally = Preparation()
        passes.append(([(r.input_ids, r.labels) for r in render_dataset(examples, tokenizer, setup, tally)], tally))
    assert passes[0][1].cached_rows == 0 and passes[1][1].cached_rows == MIN_ROWS
    assert passes[0][0] == passes[1][0]


@needs_llamafactory
def test_a_column_its_converter_reads_and_no_row_has_is_one_sentence(workspace, gradian, tmp_path):  # noqa: F811
    """LLaMA-Factory's Alpaca converter reads `input` unless the entry names other columns: a file with no such
    column fails `llamafactory-cli train` with a KeyError, and Gradian says so in one sentence."""
    data = tmp_path / "rows.json"
    data.write_text(json.dumps([{"instruction": "json for my order", "output": "{}"}]), encoding="utf-8")
    config = tmp_path / "sft.yaml"
    config.write_text(yaml.safe_dump({"stage": "sft", "template": "default", "dataset": "x"}), encoding="utf-8")
    result = gradian(diagnose_args(workspace, data, "--config", config))
    assert_one_line_error(result, "rows.json")
    assert "converter reads the column 'input', which no row has" in error_line(result)


@needs_llamafactory
def test_the_web_uis_training_args_yaml_is_the_runs_config(tmp_path):
    """With LLaMA-Factory installed, the YAML its web UI saved into output_dir says how the run prepared its rows."""
    run = fake_run(tmp_path)
    (run / "training_args.yaml").write_text(yaml.safe_dump(LLAMAFACTORY_SFT), encoding="utf-8")
    setup = read_run(run / "checkpoint-4").setup
    assert setup.framework == "llamafactory" and setup.source == str(run.resolve() / "training_args.yaml")
    assert setup.max_length == 2048 and setup.llamafactory["template"] == "llama3"


@needs_llamafactory
@pytest.mark.parametrize(("keys", "says"), [({"template": "no_such_template"}, "Template no_such_template does not exist"),
                                            ({"template": "default", "mask_history": True, "train_on_prompt": True},
                                             "`mask_history` is incompatible with `train_on_prompt`")])
def test_a_config_its_own_checks_refuse_is_one_sentence(keys, says, workspace, gradian, tmp_path):  # noqa: F811
    """What LLaMA-Factory's own DataArguments or template set-up refuses is exit 2 with its reason, not a traceback."""
    data = tmp_path / "rows.json"
    data.write_text(json.dumps([{"instruction": "json for my order", "input": "", "output": "{}"}]), encoding="utf-8")
    config = tmp_path / "sft.yaml"
    config.write_text(yaml.safe_dump({"stage": "sft", "dataset": "x", **keys}), encoding="utf-8")
    result = gradian(diagnose_args(workspace, data, "--config", config))
    assert_one_line_error(result, "sft.yaml")
    assert says in error_line(result) and "refused the config" in error_line(result)


@needs_llamafactory
def test_verify_retrains_on_the_rows_its_own_code_prepares(workspace, tmp_path):  # noqa: F811
    """A LLaMA-Factory run's retrain trains on the rows `get_dataset` gives (its template, cutoff_len, max_samples),
    with its YAML's training settings, transformers' own defaults where it is silent and its LoRA defaults."""
    from benchmarks.harness.llamafactory_conformance import llamafactory_rows
    from gradian.data.base_model import resolve_base_model
    from gradian.data.examples import read_dataset
    from gradian.scenarios.base import one_thread
    from gradian.verify.recipe import read_recipe, training_kwargs
    from gradian.verify.retrain import Retrain, build_trainer

    config, data = orders_run(workspace.model, tmp_path, lora_rank=4, max_samples=10, learning_rate=1e-3,
                              quantization_bit=4)
    recipe = read_recipe(read_run(None, config))
    assert recipe.lora == {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": "all-linear"}
    settings = training_kwargs(recipe)
    assert settings["learning_rate"] == 1e-3 and settings["bf16"] is False  # SFTConfig's own default differs
    assert recipe.unmapped == ["quantization_bit"]
    assert "packing" not in recipe.defaults and "max_length" not in recipe.defaults  # its own code prepares rows
    examples = read_dataset(data / "orders.json")
    job = Retrain("zero", examples, recipe.seed, zero_ids=frozenset({examples[1].id}))
    theirs = sorted(llamafactory_rows(config))  # first: its argument parser resets accelerate's state
    with one_thread():
        trainer = build_trainer(job, recipe, resolve_base_model(str(workspace.model)), tmp_path / "retrain",
                                max_steps=1)
        ours = sorted((tuple(r["input_ids"]), tuple(i for i, m in enumerate(r["completion_mask"]) if m))
                      for r in trainer.train_dataset)
        assert ours == theirs and len(ours) == 10  # max_samples: the first 10 rows
        assert trainer.zero_rows == frozenset({1})
        assert trainer.train().training_loss > 0
