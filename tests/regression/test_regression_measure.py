"""measure_regression end to end on a tiny model: generations.jsonl, summary, cache, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_regression_generation import save_base_and_adapter

from gradian.capabilities import get_capability
from gradian.data.base_model import resolve_base_model
from gradian.data.examples import read_dataset
from gradian.data.render import render_prompt
from gradian.data.setup import TrainingSetup
from gradian.errors import InputError
from gradian.regression import measure
from gradian.regression.generation import generate
from gradian.regression.loading import load_models
from gradian.regression.measure import default_max_new_tokens, measure_regression

torch.set_num_threads(2)
SHORT = r"regex:^.{0,6}$"  # passes answers that stop early: the tiny model's outputs differ on it
ROWS = [
    {"id": "a", "prompt": "refund my order", "completion": '{"refund": 1}'},
    {"id": "b", "prompt": "hello", "completion": '{"hello": "help"}'},
    {"id": "c", "prompt": "please help me with the invoice amount", "completion": '{"amount": 12}'},
    {"id": "d", "prompt": "late", "completion": '{"late": true}'},
    {"id": "e", "prompt": "my order", "completion": '{"order": "late"}'},
    {"id": "f", "messages": [{"role": "user", "content": "my account"},
                             {"role": "assistant", "content": '{"account": 2}'}]},
]


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture
def world(tiny_tokenizer, tmp_path):
    base_dir, adapter_dir = save_base_and_adapter(tiny_tokenizer, tmp_path, stop_early=True)
    model, tokenizer = load_models(resolve_base_model(base_dir), adapter_dir, device="cpu", dtype="float64")
    examples = read_dataset(_write_jsonl(tmp_path / "eval.jsonl", ROWS), eval_set=True)
    return model, tokenizer, examples, tmp_path / "out"


def test_measure_regression_writes_generations_and_a_consistent_summary(world):
    model, tokenizer, examples, out = world
    setup = TrainingSetup()
    result = measure_regression(model, tokenizer, examples, SHORT, setup, out, max_new_tokens=8, batch_size=4)
    capability = get_capability(SHORT)
    prompts = [render_prompt(example, tokenizer, setup) for example in examples]
    tuned = generate(model, tokenizer, prompts, max_new_tokens=8, batch_size=1)
    with model.disable_adapter():
        base = generate(model, tokenizer, prompts, max_new_tokens=8, batch_size=1)
    lines = [json.loads(line) for line in (out / "generations.jsonl").read_text().splitlines()]
    assert [line["id"] for line in lines] == [row.id for row in result.rows] == [e.id for e in examples]
    for line, row, b, t, prompt in zip(lines, result.rows, base, tuned, prompts, strict=True):
        assert (row.base, row.finetuned, row.prompt_ids) == (b, t, prompt)
        assert (line["base_ids"], line["finetuned_ids"], line["base_output"]) == (b.ids, t.ids, b.text)
        assert (line["base_stopped"], line["finetuned_stopped"]) == (b.stopped, t.stopped)
        assert line["base_score"] == capability.score(b.text, line["reference"])
        assert line["finetuned_score"] == capability.score(t.text, line["reference"])
    assert lines[-1]["reference"] == '{"account": 2}' and lines[0]["prompt"] == "refund my order"
    base_scores = np.array([line["base_score"] for line in lines], dtype=np.float64)
    tuned_scores = np.array([line["finetuned_score"] for line in lines], dtype=np.float64)
    summary = result.summary
    assert summary.n == 6 and summary.capability == SHORT
    assert summary.base_rate == pytest.approx(base_scores.mean())
    assert summary.delta == pytest.approx(tuned_scores.mean() - base_scores.mean())
    assert summary.finetuned_no_stop_rate == pytest.approx(np.mean([not g.stopped for g in tuned]))
    assert json.loads((out / "regression.json").read_text())["delta"] == pytest.approx(summary.delta)
    assert result.explain().startswith("The fine-tuned model passes " + SHORT)
    assert [row.id for row in result.failures()] == [line["id"] for line in lines if line["finetuned_score"] < 0.5]


def test_a_rerun_reuses_generations_and_other_settings_regenerate(world, monkeypatch):
    model, tokenizer, examples, out = world
    setup = TrainingSetup()
    first = measure_regression(model, tokenizer, examples, SHORT, setup, out, max_new_tokens=8)
    assert not first.cached
    real_generate, calls = measure.generate, []
    monkeypatch.setattr(measure, "generate", lambda *a, **k: calls.append(1) or real_generate(*a, **k))
    again = measure_regression(model, tokenizer, examples, SHORT, setup, out, max_new_tokens=8)
    assert again.cached and calls == [] and again.rows == first.rows
    rescored = measure_regression(model, tokenizer, examples, "json_formatting", setup, out, max_new_tokens=8)
    assert rescored.cached and calls == [] and rescored.summary.capability == "json_formatting"
    longer = measure_regression(model, tokenizer, examples, SHORT, setup, out, max_new_tokens=9)
    assert not longer.cached and calls == [1, 1]
    with torch.no_grad():  # a retrained adapter in the same folder must not reuse old answers
        next(p for n, p in model.named_parameters() if "lora_B" in n).add_(0.5)
    assert not measure_regression(model, tokenizer, examples, SHORT, setup, out, max_new_tokens=9).cached


def test_a_base_replaced_in_place_regenerates_its_answers(world, tmp_path):
    """The same base folder, its weights saved again with one changed: the eval answers, the base's own answers and
    the gradient caches are keyed by the base's files, not only its folder, so nothing from the old base is reused."""
    from transformers import AutoModelForCausalLM

    from gradian.gradients.extract import SampledGradients
    from gradian.regression.base_answers import answers_key

    model, tokenizer, examples, out = world
    setup, base_dir, adapter_dir = TrainingSetup(), tmp_path / "base", tmp_path / "adapter"
    prompts = [render_prompt(example, tokenizer, setup) for example in examples]
    assert not measure_regression(model, tokenizer, examples, SHORT, setup, out, max_new_tokens=8).cached
    before = (answers_key(model, tokenizer, prompts, 8), SampledGradients.key_of(model, [], [], None))
    same, _ = load_models(resolve_base_model(base_dir), adapter_dir, device="cpu", dtype="float64")
    assert measure_regression(same, tokenizer, examples, SHORT, setup, out, max_new_tokens=8).cached
    assert (answers_key(same, tokenizer, prompts, 8), SampledGradients.key_of(same, [], [], None)) == before

    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float64)
    with torch.no_grad():
        base.lm_head.weight.mul_(1.5)
    base.save_pretrained(base_dir)
    replaced, _ = load_models(resolve_base_model(base_dir), adapter_dir, device="cpu", dtype="float64")
    assert not measure_regression(replaced, tokenizer, examples, SHORT, setup, out, max_new_tokens=8).cached
    assert answers_key(replaced, tokenizer, prompts, 8) != before[0]
    assert SampledGradients.key_of(replaced, [], [], None) != before[1]


def test_max_new_tokens_defaults_from_the_longest_reference(tiny_tokenizer):
    references = ['{"a": 1}', None, '{"amount": 12, "currency": "refund"}']
    longest = max(len(tiny_tokenizer(r, add_special_tokens=False)["input_ids"]) for r in references if r)
    assert default_max_new_tokens(tiny_tokenizer, references) == int(1.5 * longest) + 8
    assert default_max_new_tokens(tiny_tokenizer, [None]) == 256


def test_bad_eval_sets_are_input_errors(world, tmp_path):
    model, tokenizer, examples, out = world
    setup = TrainingSetup()
    with pytest.raises(InputError, match="eval set is empty"):
        measure_regression(model, tokenizer, [], "json_formatting", setup, out)
    no_prompt = read_dataset(_write_jsonl(tmp_path / "text.jsonl", [ROWS[0], {"text": "hello"}]), eval_set=True)
    with pytest.raises(InputError, match="text.jsonl:2: this eval row has no prompt"):
        measure_regression(model, tokenizer, no_prompt, "json_formatting", setup, out)
    no_reference = read_dataset(_write_jsonl(tmp_path / "noref.jsonl", [{"prompt": "hello"}]), eval_set=True)
    with pytest.raises(InputError, match="noref.jsonl:1: .*exact_match needs"):
        measure_regression(model, tokenizer, no_reference, "exact_match", setup, out)
    with pytest.raises(InputError, match="unknown capability"):
        measure_regression(model, tokenizer, examples, "json_fromatting", setup, out)
    with pytest.raises(InputError, match="could not be imported"):
        measure_regression(model, tokenizer, examples, "no_such_plugin_module:score", setup, out)
