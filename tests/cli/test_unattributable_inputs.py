"""What Gradian cannot attribute is refused with one sentence and exit 2, before any generation: a DoRA adapter, an
adapter with modules_to_save, and preference (DPO, KTO) rows given as the training data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bad_inputs.corpus import attribute_args, diagnose_args
from bad_inputs.fixtures import assert_one_line_error, error_line, gradian, workspace  # noqa: F401
from bad_inputs.workspace import WORDS, tiny_model, write_jsonl
from gradian.scenarios.tokenizer import build_tokenizer


def save_adapter(folder, **lora):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_model(build_tokenizer(WORDS), seed=0),
                           LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], **lora))
    model.save_pretrained(folder)
    return folder


@pytest.mark.parametrize(("lora", "sentence"), [
    ({"use_dora": True}, "the adapter is DoRA (use_dora: true), and Gradian attributes plain "
                         "LoRA only (its gradients miss DoRA's magnitude vectors); retrain with use_dora=False to "
                         "attribute the regression, or run `gradian diagnose` to audit the rows."),
    ({"modules_to_save": ["lm_head"]}, "the adapter also trains whole modules (modules_to_save: lm_head), whose "
                                       "full-weight updates Gradian does not attribute, so rows that changed them "
                                       "would go unseen; retrain with those modules frozen (no modules_to_save) to "
                                       "attribute the regression, or run `gradian diagnose` to audit the rows."),
], ids=["dora", "modules-to-save"])
@pytest.mark.parametrize("command", ["attribute", "extract"])
def test_adapter_gradian_cannot_attribute_is_refused_before_generation(command, lora, sentence, workspace,  # noqa: F811
                                                                        gradian, tmp_path):  # noqa: F811
    adapter = save_adapter(tmp_path / "adapter", **lora)
    args = attribute_args(workspace, tmp_path / "out", adapter=adapter) if command == "attribute" else [
        "extract", "--base-model", workspace.model, "--adapter", adapter, "--dataset", workspace.dataset,
        "--out", tmp_path / "out", "--proj-dim", "16", "--batch-size", "4"]
    result = gradian(args)
    assert_one_line_error(result, "adapter_config.json")
    assert error_line(result) == f"Error: {adapter / 'adapter_config.json'}: {sentence}"
    assert not (tmp_path / "out" / "generations.jsonl").exists()


@pytest.mark.parametrize(("rows", "sentence"), [
    ([{"prompt": "please help", "chosen": "the order", "rejected": "no"}],
     "rows look like DPO preference data (prompt/chosen/rejected)"),
    ([{"chosen": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "help"}],
       "rejected": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "no"}]}],
     "rows look like DPO preference data (chosen/rejected)"),
    ([{"prompt": "please help", "completion": "the order", "label": True},
      {"prompt": "please help", "completion": "no", "label": False}],
     'rows look like KTO preference data (prompt/completion with a true/false "label")'),
], ids=["dpo", "dpo-implicit-prompt", "kto"])
def test_preference_rows_are_named_as_preference_data(rows, sentence, workspace, gradian, tmp_path):  # noqa: F811
    dataset = write_jsonl(tmp_path / "prefs.jsonl", rows)
    result = gradian(diagnose_args(workspace, dataset))
    assert_one_line_error(result, "prefs.jsonl:1:")
    sft = ' (if these rows are SFT data, drop the "label" column)' if "KTO" in sentence else ""
    assert error_line(result) == (f"Error: {dataset}:1: {sentence}; Gradian attributes SFT runs, not preference "
                                  f"tuning, so pass the SFT dataset the adapter was trained on{sft}.")


def test_a_pair_beside_messages_is_read_as_the_messages():
    """UltraFeedback-style rows carry prompt/chosen/rejected beside the `messages` an SFT run trains on."""
    from gradian.data.examples import _fields

    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "help"}]
    row = {"prompt": "hi", "chosen": chat, "rejected": chat, "messages": chat}
    assert _fields(row, 1, Path("train.jsonl"), eval_set=False) == {"messages": chat}


def test_an_eval_set_may_hold_a_label_column(workspace, gradian, tmp_path):  # noqa: F811
    """Only training rows are read as preference data: an eval set's extra columns stay its own business."""
    rows = [{"id": f"e{i}", "prompt": "json for the order", "completion": json.dumps({"name": "order", "id": i}),
             "label": True} for i in range(2)]
    result = gradian(diagnose_args(workspace, workspace.dataset, "--eval-dataset",
                                   str(write_jsonl(tmp_path / "ev.jsonl", rows))))
    assert result.exit_code in (0, 1), result.output[-2000:]
