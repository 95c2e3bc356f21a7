"""The recipe `verify` retrains with, read back from a scenario's run: it must equal what the scenario trained with."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import yaml
from transformers import LlamaForCausalLM

from gradian.data.run_folder import RunInfo, read_run
from gradian.errors import InputError
from gradian.regression.loading import read_adapter_config
from gradian.scenarios.catalog import CATALOG
from gradian.scenarios.finetune import CPU_TRAINING
from gradian.verify.recipe import read_recipe, resolved_precision, training_kwargs


def linear_modules(base_dir) -> list[str]:
    """What PEFT's `all-linear` resolves to: every nn.Linear but the output head."""
    model = LlamaForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    return sorted(name for name, module in model.named_modules()
                  if isinstance(module, torch.nn.Linear) and name != "lm_head")


def assert_trained_with(recipe, scenario_name: str) -> None:
    scenario = CATALOG[scenario_name]
    sft = {**CPU_TRAINING, **scenario.sft_config()}  # as `finetune.train_lora` trained and recorded it
    assert {key: training_kwargs(recipe)[key] for key in sft} == sft
    assert recipe.collator == scenario.collator


@pytest.mark.parametrize("name", ["pad-eos", "truncated-cluster"])
def test_recipe_from_the_run_folder_is_the_scenarios(scenario, name):
    folder = scenario(name, 0)
    recipe = read_recipe(read_run(folder / "run"), read_adapter_config(folder / "run"))
    assert_trained_with(recipe, name)
    assert recipe.seed == 0, "the seed comes from training_args.bin (sft_config.yaml does not hold it)"
    assert recipe.sources["seed"] == "training_args.bin"
    assert recipe.sources["learning_rate"].endswith("sft_config.yaml")
    lora = CATALOG[name].lora_config()
    assert {k: recipe.lora[k] for k in ("r", "lora_alpha", "lora_dropout")} == \
        {k: lora[k] for k in ("r", "lora_alpha", "lora_dropout")}
    assert recipe.lora["target_modules"] == linear_modules(folder / "base")  # all-linear, as PEFT resolved it
    assert recipe.unmapped == []


def test_recipe_from_the_trl_config_alone(scenario):
    folder = scenario("pad-eos", 0)
    recipe = read_recipe(read_run(None, folder / "run" / "sft_config.yaml"))
    assert_trained_with(recipe, "pad-eos")
    assert recipe.lora == {k: CATALOG["pad-eos"].lora_config()[k] for k in ("r", "lora_alpha", "lora_dropout",
                                                                           "target_modules")}
    assert recipe.defaults["seed"] == 42, "a config without the seed names the default used"
    assert "optim" in recipe.defaults


def test_recipe_from_an_equivalent_axolotl_yaml(scenario, tmp_path):
    folder = scenario("pad-eos", 0)
    scenario_sft, lora = {**CPU_TRAINING, **CATALOG["pad-eos"].sft_config()}, CATALOG["pad-eos"].lora_config()
    axolotl = {
        "base_model": str(folder / "base"), "adapter": "lora", "datasets": [{"path": "train.jsonl", "type": "completion"}],
        "sequence_len": scenario_sft["max_length"], "excess_length_strategy": "truncate", "train_on_inputs": False,
        "learning_rate": scenario_sft["learning_rate"], "num_epochs": scenario_sft["num_train_epochs"],
        "micro_batch_size": scenario_sft["per_device_train_batch_size"],
        "gradient_accumulation_steps": scenario_sft["gradient_accumulation_steps"],
        "lr_scheduler": scenario_sft["lr_scheduler_type"], "warmup_steps": scenario_sft["warmup_steps"],
        "weight_decay": scenario_sft["weight_decay"], "max_grad_norm": scenario_sft["max_grad_norm"],
        "gradient_checkpointing": scenario_sft["gradient_checkpointing"], "bf16": scenario_sft["bf16"],
        "special_tokens": {"pad_token": scenario_sft["pad_token"]},
        "data_collator": CATALOG["pad-eos"].collator,
        "lora_r": lora["r"], "lora_alpha": lora["lora_alpha"], "lora_dropout": lora["lora_dropout"],
        "lora_target_linear": True, "seed": 0, "output_dir": "./out", "wandb_project": "x",
        "shuffle_merged_datasets": False,
    }
    path = tmp_path / "axolotl.yaml"
    path.write_text(yaml.safe_dump(axolotl))
    recipe = read_recipe(read_run(None, path))
    assert recipe.framework == "axolotl"
    assert_trained_with(recipe, "pad-eos")
    assert recipe.seed == 0
    assert recipe.lora == {k: lora[k] for k in ("r", "lora_alpha", "lora_dropout", "target_modules")}
    assert recipe.unmapped == ["shuffle_merged_datasets"], "keys with no TRL equivalent are listed, logging ones not"


def test_axolotl_dropping_overlong_rows_is_listed(tmp_path):
    path = tmp_path / "axolotl.yaml"
    path.write_text(yaml.safe_dump({"sequence_len": 256, "train_on_inputs": False, "lora_r": 8, "lora_alpha": 16,
                                    "lora_target_linear": True}))
    recipe = read_recipe(read_run(None, path))
    assert training_kwargs(recipe)["max_length"] == 256
    assert any(item.startswith("excess_length_strategy") for item in recipe.unmapped)


@pytest.mark.parametrize("stated", [{"bf16": "auto"}, {}])
def test_axolotl_bf16_auto_is_resolved_as_axolotl_resolves_it(tmp_path, monkeypatch, stated):
    """axolotl's `bf16: auto` (also its default) is bf16 where a GPU supports it, else fp16 where the config left it
    unset (axolotl's `resolve_dtype`; a CPU retrain then drops fp16): SFTConfig would take "auto" as true."""
    path = tmp_path / "axolotl.yaml"
    path.write_text(yaml.safe_dump({"sequence_len": 256, "lora_r": 8, "lora_alpha": 16, "lora_target_linear": True,
                                    **stated}))
    settings = training_kwargs(read_recipe(read_run(None, path)))
    assert settings["bf16"] == "auto"
    monkeypatch.setattr("transformers.utils.is_torch_bf16_gpu_available", lambda: True)
    assert {k: resolved_precision(settings, "cuda:0")[k] for k in ("bf16", "fp16")} == {"bf16": True, "fp16": False}
    assert resolved_precision({**settings, "fp16": True}, "cuda:0")["bf16"] is False  # an fp16 run stays fp16
    monkeypatch.setattr("transformers.utils.is_torch_bf16_gpu_available", lambda: False)
    assert {k: resolved_precision(settings, "cpu")[k] for k in ("bf16", "fp16")} == {"bf16": False, "fp16": True}
    assert resolved_precision({**settings, "fp16": False}, "cpu")["fp16"] is False
    assert resolved_precision({"bf16": True}, "cpu") == {"bf16": True}  # a run's own bf16 is kept, on a CPU too
    recorded = read_run(None, path)
    recorded.training_args = {"bf16": True}  # what axolotl resolved `auto` to where the run trained
    assert training_kwargs(read_recipe(recorded))["bf16"] is True


@pytest.mark.skipif(importlib.util.find_spec("axolotl") is None, reason="axolotl is not installed (a venv of its own)")
@pytest.mark.parametrize("gpu_bf16", [True, False])
@pytest.mark.parametrize("fp16", [None, True, False])
def test_the_bf16_port_is_axolotls_resolve_dtype(monkeypatch, gpu_bf16, fp16):
    from axolotl.utils import config
    from axolotl.utils.dict import DictDefault

    from gradian.verify.recipe import _resolve_dtype

    monkeypatch.setattr(config, "is_torch_bf16_gpu_available", lambda: gpu_bf16)
    monkeypatch.setattr("transformers.utils.is_torch_bf16_gpu_available", lambda: gpu_bf16)
    cfg = DictDefault({"bf16": "auto", "fp16": fp16, "device": "cuda:0"})
    config.resolve_dtype(cfg)
    assert _resolve_dtype("auto", fp16) == (cfg.bf16, cfg.fp16)


def test_a_pipeline_that_appends_eos_after_the_cut_is_replayed_not_unmapped(tmp_path):
    """`add_eos_token: true` has no SFTConfig field: the retrains tokenize the rows that way (`retrain`)."""
    path = tmp_path / "sft_config.yaml"
    path.write_text(yaml.safe_dump({"max_length": 56, "add_eos_token": True, "learning_rate": 1e-3}))
    recipe = read_recipe(read_run(None, path), {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]})
    assert recipe.eos_after_truncation and recipe.unmapped == [] and training_kwargs(recipe)["max_length"] == 56
    path.write_text(yaml.safe_dump({"max_length": 56, "learning_rate": 1e-3}))
    assert not read_recipe(read_run(None, path), {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}
                           ).eos_after_truncation


def test_another_trainer_is_refused():
    run = RunInfo(path=None, training_args={"__class__": "trl.trainer.dpo_config.DPOConfig", "seed": 0})
    with pytest.raises(InputError, match="DPOConfig"):
        read_recipe(run, {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]})


def test_a_run_without_recorded_settings_is_refused():
    with pytest.raises(InputError, match="cannot retrain it faithfully"):
        read_recipe(RunInfo(path=None), {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]})


def test_a_non_lora_adapter_is_refused():
    run = RunInfo(path=None, config={"learning_rate": 1e-4})
    with pytest.raises(InputError, match="not LoRA"):
        read_recipe(run, {"peft_type": "IA3", "target_modules": ["q_proj"]})


def test_a_setup_fix_is_the_setting_the_finding_states(tiny_tokenizer):
    """verify retrains with the training settings a check wrote into its finding (the max-length cut: the length
    that stops every cut), and says when a finding states none."""
    from gradian.audit.truncation import eos_after_cut_finding
    from gradian.verify.plan import setup_fix
    from gradian.verify.recipe import Recipe

    recipe = Recipe(training={}, lora={}, seed=0)
    cut = eos_after_cut_finding(["t1", "t2"], 10, 52, 64).to_dict()
    fix, why = setup_fix(cut, recipe, tiny_tokenizer)
    assert why is None and fix is not None and fix.changes == {"max_length": 64} and fix.check == "eos_after_cut"
    unknown_length = eos_after_cut_finding(["t1"], 10, 52, None).to_dict()  # only the cut tokens: no length to set
    fix, why = setup_fix(unknown_length, recipe, tiny_tokenizer)
    assert fix is None and "no automatic fix for the eos_after_cut finding" in why


@pytest.mark.parametrize(("evidence", "recorded", "after"), [
    ({"eos_after_cut": True}, False, True),  # the fine-tune's own evidence: EOS followed the cut
    ({"eos_after_cut": False}, False, False),
    (None, False, False),  # the settings said nothing and no evidence was weighed
    (None, True, True),  # the config said so (add_eos_token): kept
])
def test_retrains_append_eos_after_the_cut_where_the_reports_evidence_says(evidence, recorded, after):
    from gradian.verify.recipe import Recipe, with_report_evidence

    recipe = Recipe(training={"max_length": 64}, lora={"r": 4}, seed=0, eos_after_truncation=recorded)
    replayed, line = with_report_evidence(recipe, {"run": {"rendering_evidence": evidence}})
    assert replayed.eos_after_truncation is after
    assert (line is not None) == (after and not recorded)
    assert recipe.eos_after_truncation is recorded  # the recipe read from the run is left as it was
