"""The scenario world: ground truth consistent with the data, regressions real (measured), run folders real."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gradian.cli.main import cli, register_commands
from gradian.scenarios import CATALOG, FAMILIES, SCENARIOS
from gradian.scenarios.builder import SHARE_RANGE, make_data
from gradian.scenarios.catalog import single_quotes, truncate
from gradian.scenarios.measure import Generation, compare_runs, summarize_generations
from gradian.scenarios.world import make_ticket


def _valid_json(text: str) -> bool:
    return Generation(text, ran_on=False).valid


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# --- data and truth, without training ------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCENARIOS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_truth_matches_the_data(name, seed):
    train, eval_rows, truth = make_data(CATALOG[name], seed)
    ids = {row["id"]: row for row in train}
    assert len(ids) == len(train) and all(row["prompt"] and row["completion"] for row in train)
    assert truth["kind"] == CATALOG[name].kind and truth["seed"] == seed
    if truth["kind"] == "data-cluster":
        category = truth["affected_category"]
        assert set(truth["category_ids"]) == {row["id"] for row in train if row["category"] == category}
        assert set(truth["culprit_ids"]) < set(truth["category_ids"]), "the category must keep clean neighbours"
        assert SHARE_RANGE[0] - 0.01 <= truth["cluster_share"] <= SHARE_RANGE[1] + 0.01
        assert all(not _valid_json(ids[i]["completion"]) for i in truth["culprit_ids"])
        clean = set(ids) - set(truth["culprit_ids"])
        assert all(_valid_json(ids[i]["completion"]) for i in clean)
    elif name == "overlap":
        references = {(row["prompt"], row["reference"]) for row in eval_rows}
        assert truth["culprit_ids"] and all((ids[i]["prompt"], ids[i]["completion"]) in references
                                            for i in truth["culprit_ids"])
    else:
        assert truth["culprit_ids"] == [] and truth["category_ids"] == []
        assert all(_valid_json(row["completion"]) for row in train)
    assert (truth["structural_cause"] is not None) == (truth["kind"] == "setup")


def test_seeds_vary_the_category_share_and_order():
    truths = [make_data(CATALOG["truncated-cluster"], seed)[2] for seed in range(8)]
    assert len({t["affected_category"] for t in truths}) >= 3
    assert len({round(t["cluster_share"], 3) for t in truths}) >= 6
    first, second = (make_data(CATALOG["null"], seed)[0] for seed in (0, 1))
    assert [r["prompt"] for r in first] != [r["prompt"] for r in second]
    again = make_data(CATALOG["truncated-cluster"], 3)
    assert again[2] == truths[3], "a seed must rebuild the same scenario"


def test_corruptions_break_json_and_keep_the_start_of_the_answer():
    import random

    ticket = make_ticket("invoice", random.Random(0))
    answer = ticket.answer("priority")
    cut = truncate(answer)
    assert json.dumps(answer).startswith(cut) and not _valid_json(cut) and "currency" not in cut
    assert not _valid_json(single_quotes(answer)) and "'amount'" in single_quotes(answer)


def test_validity_counts_overall_and_per_category():
    generations = [Generation('{"a": "1"}', False), Generation('{"a": ', False), Generation("[1]", False),
                   Generation('{"a": "1"}\n{', True)]
    summary = summarize_generations(generations, ["x", "x", "y", "y"])
    assert summary["overall"] == {"total": 4, "valid": 1, "validity": 0.25, "ran_on": 1, "ran_on_rate": 0.25}
    assert summary["by_category"]["y"]["valid"] == 0
    measured = compare_runs(summary, summarize_generations(generations[::-1], ["x", "x", "y", "y"]), "x")
    assert measured["drop_points"]["affected"] == pytest.approx(50.0)


def test_cli_lists_scenarios_and_rejects_unknown_names(cli_runner, tmp_path):
    register_commands()
    listed = cli_runner.invoke(cli, ["scenario", "list", "--json"])
    assert listed.exit_code == 0
    assert [json.loads(line)["name"] for line in listed.output.splitlines()] == [*SCENARIOS, *FAMILIES]
    bad = cli_runner.invoke(cli, ["scenario", "build", "nope", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "unknown scenario 'nope'" in bad.output


# --- built scenarios: real runs, measured regressions ---------------------------------------------------------


def test_base_formats_held_out_answers_as_json(scenario):
    from transformers import AutoTokenizer, LlamaForCausalLM

    base = scenario("truncated-cluster") / "base"
    info = json.loads((base / "gradian_base.json").read_text())
    assert info["held_out_validity"] >= 0.9 and info["parameters"] < 1_000_000
    tokenizer = AutoTokenizer.from_pretrained(base)
    assert tokenizer.chat_template and (base / "model.safetensors").exists()
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "where is my order 1234 ?"}],
                                           add_generation_prompt=True, tokenize=False)
    assert prompt == tokenizer.bos_token + "user: where is my order 1234 ?\nassistant: "
    assert LlamaForCausalLM.from_pretrained(base).config.vocab_size == len(tokenizer)


def test_truncated_cluster_truth_and_real_regression(scenario):
    folder = scenario("truncated-cluster")
    truth = json.loads((folder / "truth.json").read_text())
    train = {row["id"]: row for row in _read(folder / "train.jsonl")}
    assert set(truth["culprit_ids"]) <= set(train) and set(truth["culprit_ids"]) < set(truth["category_ids"])
    assert {train[i]["category"] for i in truth["category_ids"]} == {truth["affected_category"]}
    measured = json.loads((folder / "measured.json").read_text())
    base = measured["base"]["by_category"][truth["affected_category"]]
    assert base["total"] >= 30 and base["validity"] >= 0.9
    assert measured["drop_points"]["affected"] >= 20, measured["drop_points"]


def test_null_stays_within_noise(scenario):
    measured = json.loads((scenario("null") / "measured.json").read_text())
    assert measured["base"]["overall"]["validity"] >= 0.9
    assert measured["drop_points"]["overall"] <= 5, measured["drop_points"]
    assert max(measured["drop_points"]["by_category"].values()) < 20
    base, tuned = measured["base"]["overall"], measured["finetuned"]["overall"]
    assert base["same_keys"] == 0 and tuned["same_keys"] >= 0.8 * tuned["total"], "the purpose (priority) is learned"


def test_run_folder_is_a_real_trl_lora_run(scenario):
    import yaml
    from peft import PeftModel
    from transformers import LlamaForCausalLM
    from trl import SFTConfig

    folder = scenario("null")
    run = folder / "run"
    model = PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(folder / "base"), run)
    assert any("lora_A" in name for name, _ in model.named_parameters())
    state = json.loads((run / "trainer_state.json").read_text())
    assert [entry["loss"] for entry in state["log_history"] if "loss" in entry]
    assert any((checkpoint / "optimizer.pt").exists() for checkpoint in run.glob("checkpoint-*"))
    config = yaml.safe_load((run / "sft_config.yaml").read_text())
    sft_fields = set(SFTConfig.__dataclass_fields__)
    assert {k for k in config if not k.startswith("lora_") and k != "use_peft"} <= sft_fields
    assert config["completion_only_loss"] is True and config["max_length"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["format-cluster"])
def test_other_data_clusters_regress(scenario, name):
    measured = json.loads((scenario(name) / "measured.json").read_text())
    assert measured["drop_points"]["affected"] >= 20, measured["drop_points"]


@pytest.mark.slow
def test_pad_eos_model_runs_on(scenario):
    folder = scenario("pad-eos")
    config = (folder / "run" / "sft_config.yaml").read_text()
    assert "data_collator: transformers.DataCollatorForLanguageModeling" in config
    measured = json.loads((folder / "measured.json").read_text())
    assert measured["finetuned"]["overall"]["ran_on_rate"] >= measured["base"]["overall"]["ran_on_rate"] + 0.3


@pytest.mark.slow
def test_diffuse_regresses_across_categories(scenario):
    measured = json.loads((scenario("diffuse") / "measured.json").read_text())
    drops = measured["drop_points"]
    assert drops["overall"] >= 10 and sum(d > 0 for d in drops["by_category"].values()) >= 3
    truth = json.loads((scenario("diffuse") / "truth.json").read_text())
    config = yaml.safe_load((scenario("diffuse") / "run" / "sft_config.yaml").read_text())
    assert truth["learning_rate"] in CATALOG["diffuse"].lr_ladder and config["learning_rate"] == truth["learning_rate"]
