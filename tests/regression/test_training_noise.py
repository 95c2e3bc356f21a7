"""The refusal's training-noise band: which checkpoint it measures, and the sentence that names it."""

from __future__ import annotations

import hashlib
import json

import pytest

from gradian.data.run_folder import RunInfo
from gradian.errors import InputError
from gradian.regression.training_noise import ADAPTER, WEIGHTS, _answers, earlier_checkpoint
from gradian.verdict.wording import no_regression


def run_folder(tmp_path, checkpoints: dict[int, bytes], final: bytes, global_step: int | None) -> RunInfo:
    """A run folder's shape: the final adapter's weights and `checkpoint-N/` folders, each with its weights' bytes."""
    (tmp_path / WEIGHTS).write_bytes(final)
    folders = []
    for step, weights in checkpoints.items():
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        (folder / WEIGHTS).write_bytes(weights)
        folders.append(folder)
    state = {"global_step": global_step} if global_step is not None else None
    return RunInfo(tmp_path, adapter_dir=tmp_path, trainer_state=state, checkpoints=folders)


def test_the_newest_checkpoint_before_the_final_step_is_measured(tmp_path):
    run = run_folder(tmp_path, {25: b"a", 50: b"b", 75: b"c"}, final=b"c", global_step=75)
    assert earlier_checkpoint(run) == (tmp_path / "checkpoint-50", 50, hashlib.sha256(b"b").hexdigest())


def test_a_checkpoint_holding_the_final_weights_is_skipped_without_a_step(tmp_path):
    run = run_folder(tmp_path, {25: b"a", 50: b"b", 75: b"c"}, final=b"c", global_step=None)
    assert earlier_checkpoint(run)[:2] == (tmp_path / "checkpoint-50", 50)


def test_training_past_the_last_checkpoint_measures_that_checkpoint(tmp_path):
    run = run_folder(tmp_path, {40: b"a", 80: b"b"}, final=b"c", global_step=90)
    assert earlier_checkpoint(run)[:2] == (tmp_path / "checkpoint-80", 80)


def test_no_earlier_checkpoint_no_band(tmp_path):
    assert earlier_checkpoint(run_folder(tmp_path, {75: b"c"}, final=b"c", global_step=75)) is None
    assert earlier_checkpoint(None) is None


def test_the_refusal_names_the_band_and_its_source():
    regression = {"capability": "json_formatting", "base_rate": 1.0, "finetuned_rate": 0.95, "delta": -0.05,
                  "ci_low": -0.1, "ci_high": 0.0, "p_value": 0.06, "n": 80, "significant": False}
    plain, _ = no_regression(regression)
    assert "Training noise" not in plain
    band = {"source": "checkpoint", "checkpoint": "checkpoint-50", "step": 50, "final_step": 75, "moved": -0.0375,
            "ci_low": -0.09, "ci_high": 0.01}
    summary, _ = no_regression({**regression, "training_noise": band})
    assert summary.startswith(plain)
    assert ("between checkpoint-50 (step 50) and the final adapter (step 75) the capability moved -3.8% "
            "(95% CI -9.0% to +1.0%)") in summary


@pytest.mark.parametrize("config", ["{}", json.dumps({"peft_type": "LORA", "r": 2, "target_modules": ["q_proj"]})])
def test_a_checkpoint_that_does_not_load_is_one_sentence_naming_it(tmp_path, config):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    base = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2))
    model = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj"]))
    folder = tmp_path / "checkpoint-5"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(config)
    (folder / WEIGHTS).write_bytes(b"not safetensors")
    with pytest.raises(InputError, match="checkpoint-5: this checkpoint does not load"):
        _answers(model, None, folder, [[1, 2]], max_new_tokens=2, batch_size=1)
    assert model.active_adapter == "default" and ADAPTER not in model.peft_config
