"""The real-model suite's families and every builder path it uses, run here on a tiny ChatML model.

SmolLM2 itself is for the benchmark (`benchmarks/smollm2_build.py`); `model_dir=` swaps in a tiny BPE model whose
tokenizer speaks the same ChatML, so the stage-one base, both row formats, the pad-masking collator and the
pipeline that appends EOS after truncating all run in CI.
"""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from transformers import AutoTokenizer

from gradian import AttributeSettings, attribute
from gradian.audit import diagnose
from gradian.scenarios import base
from gradian.scenarios.smollm2_suite import SMOL_FAMILIES, build_smollm2_family, tokenize_with_eos_after_cut
from gradian.scenarios.suite import LAYOUTS


def test_the_split_is_fixed_and_each_half_spans_causes_and_recipes():
    for split in ("dev", "test"):
        half = [f for f in SMOL_FAMILIES.values() if f.split == split]
        assert {f.family.kind for f in half} == {"data-cluster", "setup", "no-regression"}
        assert {f.family.structural for f in half} >= {"max-length-eos"}
        assert any(len(f.family.plants) == 2 for f in half)  # two causes at once
        assert any(p.layout == "elsewhere" for f in half for p in f.family.plants)
        assert {f.rows for f in half} == {"messages", "prompt"} and {f.targets for f in half} == {"all", "attn"}
        assert {f.save for f in half} == {"epoch", "none"}
    everything = list(SMOL_FAMILIES.values())
    assert {p.layout for f in everything for p in f.family.plants} == set(LAYOUTS)
    assert {p.cause for f in everything for p in f.family.plants} >= {"cut", "fence", "prose", "drop-field"}
    assert {f.family.structural for f in everything} >= {"pad-eos", "max-length-eos"}
    assert min(f.epochs for f in everything) == 2 and max(f.epochs for f in everything) >= 4  # rename-volume: 5


@pytest.fixture(scope="module")
def tiny_chatml(tmp_path_factory):
    """A tiny BPE model of the travel domain (ChatML, eos <|im_end|>), as SmolLM2's stand-in."""
    return base.base_model(0, tmp_path_factory.mktemp("bases"), None, "travel", "bpe")


def test_eos_after_cut_ends_every_long_row_mid_answer_in_a_supervised_eos(tiny_chatml):
    tokenizer = AutoTokenizer.from_pretrained(tiny_chatml)
    rows = [{"id": f"t{i}", "prompt": "<|im_start|>user\nbook a seat<|im_end|>\n<|im_start|>assistant\n",
             "completion": '{"action": "seat", "row": ' + str(i) + "}" * 1 + " " * i} for i in range(10)]
    tokenized, limit, cut, longest = tokenize_with_eos_after_cut(rows, tokenizer)
    assert longest > limit
    assert cut and len(cut) < len(rows)
    for row in tokenized:
        assert len(row["input_ids"]) <= limit and row["input_ids"][-1] == tokenizer.eos_token_id
        assert row["completion_mask"][-1] == 1 and len(row["completion_mask"]) == len(row["input_ids"])
    for row in (r for r in tokenized if r["id"] in cut):
        assert len(row["input_ids"]) == limit


# The tiny stand-in trains at a tiny model's step size. At SmolLM2's 1e-3 it garbles more than it stops: built
# here at seeds 0, 1, 2, 41%, 63% and 57% of its failing answers stop early (the rest repeat keys or run on), so
# the setting's symptom is a coin toss across machines; at 2e-3, 82%, 72% and 72% do, as on SmolLM2 itself.
TINY_MAX_LENGTH_RATE = 2e-3


@pytest.fixture(scope="module")
def max_length_build(tiny_chatml, tmp_path_factory):
    """The max-length family built once, at seed 0: its rows cut by the run's max length, EOS after the cut."""
    root = tmp_path_factory.mktemp("max-length")
    return build_smollm2_family("smol-travel-max-length", root / "run", 0, root=root / "cache",
                                model_dir=tiny_chatml, learning_rate=TINY_MAX_LENGTH_RATE)


def test_max_length_family_regresses_and_the_audit_names_the_setting_with_the_length_that_stops_the_cuts(
        max_length_build, tmp_path):
    out = max_length_build
    truth = json.loads((out / "truth.json").read_text())
    measured = json.loads((out / "measured.json").read_text())
    config = yaml.safe_load((out / "run" / "sft_config.yaml").read_text())
    assert config["add_eos_token"] is True and config["max_length"] == truth["max_length"]
    assert truth["structural_cause"] == "max-length-eos" and truth["culprit_ids"]
    assert truth["recipe"]["learning_rate"] == TINY_MAX_LENGTH_RATE
    assert truth["summary"].endswith(f"{truth['recipe']['epochs']} epochs at {TINY_MAX_LENGTH_RATE:g}, LoRA all)")
    assert measured["drop_points"]["overall"] >= 10  # the cut rows teach stopping mid-answer
    report = diagnose(dataset=out / "train.jsonl", run=out / "run", base_model=out / "base")
    finding = next(f for f in report.findings if f.check == "eos_after_cut")
    assert finding.severity == "critical" and finding.category == "setup"
    assert not any(f.check == "truncated_completion" for f in report.findings)  # one finding for the cut rows
    assert sorted(finding.example_ids) == sorted(truth["culprit_ids"])
    assert f"raise max_length to ≥ {truth['needed_max_length']}" in finding.fix
    # end to end: attribute's verdict is the setting and its fix, not the rows
    result = attribute(AttributeSettings(base_model=str(out / "base"), adapter=str(out / "run"), run=str(out / "run"),
                                         dataset=str(out / "train.jsonl"), eval_dataset=str(out / "eval.jsonl"),
                                         capability="json_formatting", out=str(tmp_path / "report")))
    verdict = json.loads((tmp_path / "report" / "report.json").read_text())["verdict"]
    assert result.verdict.kind == verdict["kind"] == "setup" and verdict["culprit_ids"] == []
    assert verdict["next_action"].startswith(f"raise max_length to ≥ {truth['needed_max_length']}")


def test_eos_after_the_cut_is_read_from_the_fine_tune_when_the_run_does_not_say_so(max_length_build, tmp_path):
    """The seed's story: the run tokenized its rows itself, so no setting says EOS followed the cut. With the
    config's add_eos_token taken away, the settings' rendering cuts without EOS; the fine-tune's own P(EOS) where the
    cut rows' trained tokens end says otherwise, and attribute renders the rows so, names the setting and says why."""
    out = max_length_build
    truth = json.loads((out / "truth.json").read_text())
    run = tmp_path / "run"
    shutil.copytree(out / "run", run)
    config = yaml.safe_load((run / "sft_config.yaml").read_text())
    del config["add_eos_token"]
    (run / "sft_config.yaml").write_text(yaml.safe_dump(config))
    unsaid = diagnose(dataset=out / "train.jsonl", run=run, base_model=out / "base")
    assert not any(f.check == "eos_after_cut" for f in unsaid.findings)  # the settings alone do not tell
    attribute(AttributeSettings(base_model=str(out / "base"), adapter=str(run), run=str(run),
                                dataset=str(out / "train.jsonl"), eval_dataset=str(out / "eval.jsonl"),
                                capability="json_formatting", out=str(tmp_path / "report")))
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    evidence = report["run"]["rendering_evidence"]
    assert evidence["eos_after_cut"] is True, evidence
    assert evidence["cut_lift"] >= 10 * evidence["control_lift"] and evidence["cut_eos_prob"] >= 0.05
    assert report["run"]["setup"]["eos_after_truncation"] is True
    finding = next(f for f in report["findings"] if f["check"] == "eos_after_cut")
    assert sorted(finding["example_ids"]) == sorted(truth["culprit_ids"])
    assert report["verdict"]["kind"] == "setup" and "still end in EOS" in report["verdict"]["summary"]
    assert report["verdict"]["next_action"].startswith(f"raise max_length to ≥ {truth['needed_max_length']}")


@pytest.mark.parametrize("name", ["smol-tickets-cut-prose", "smol-home-pad-eos"])
def test_messages_and_setup_families_build_with_their_recipe(name, tmp_path):
    family = SMOL_FAMILIES[name]
    tiny = base.base_model(0, tmp_path / "bases", None, family.family.domain, "bpe")
    out = build_smollm2_family(name, tmp_path / "run", 1, root=tmp_path / "cache", model_dir=tiny, rows=80,
                               eval_per_category=2)
    truth = json.loads((out / "truth.json").read_text())
    config = yaml.safe_load((out / "run" / "sft_config.yaml").read_text())
    adapter = json.loads((out / "run" / "adapter_config.json").read_text())
    first = json.loads((out / "train.jsonl").read_text().splitlines()[0])
    assert ("messages" in first) == (family.rows == "messages")
    assert config.get("assistant_only_loss", False) == (family.rows == "messages")
    assert sorted(adapter["target_modules"]) == sorted(["q_proj", "k_proj", "v_proj", "o_proj"]
                                                        if family.targets == "attn" else adapter["target_modules"])
    assert len(truth["causes"]) == len(family.family.plants) and truth["seed"] == 1
    assert truth["summary"] == family.describe()  # the recipe the run trained with, not the tiny family's
    if family.family.structural == "pad-eos":
        assert config["data_collator"] == "transformers.DataCollatorForLanguageModeling"
        assert config["pad_token"] == "<|im_end|>"
