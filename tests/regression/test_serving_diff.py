"""Each rule that diffs the served path with the training path fires on the export built for it, with its numbers."""

from __future__ import annotations

import json

import pytest

from gradian.capabilities import get_capability
from gradian.data.examples import read_dataset
from gradian.data.render import render_prompt
from gradian.data.setup import TrainingSetup
from gradian.errors import InputError
from gradian.regression.generation import GeneratedAnswer
from gradian.regression.measure import RegressionResult, RegressionRow
from gradian.regression.served import measure_served, read_served, read_served_outputs
from gradian.regression.serving_diff import differences, read_export
from gradian.regression.statistics import compare
from gradian.scenarios.tokenizer import build_tokenizer

WORDS = "json for the refund order name id user assistant system be brief".split()
ANSWER = '{"name": "refund", "id": 1}'
OTHER_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{{ message['role'] }} : {{ message['content'] }}\n{% endfor %}"
                  "{% if add_generation_prompt %}assistant: {% endif %}")


@pytest.fixture
def tokenizer():
    return build_tokenizer(WORDS)


def world(tmp_path, tokenizer, *, rows=1, system=False, served_text=None):
    """`rows` chat eval rows that Gradian's fine-tune answers correctly, ending on EOS, and its measured result."""
    messages = [{"role": "system", "content": "be brief"}] if system else []
    lines = [{"id": f"e{i}", "prompt": [*messages, {"role": "user", "content": "json for the refund"}],
              "completion": [{"role": "assistant", "content": ANSWER}]} for i in range(rows)]
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    examples = read_dataset(tmp_path / "eval.jsonl", eval_set=True)
    setup = TrainingSetup()
    ids = tokenizer(ANSWER, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    result = []
    for example in examples:
        own = GeneratedAnswer(ids, ANSWER, True)
        result.append(RegressionRow(example.id, example.prompt_text, render_prompt(example, tokenizer, setup), ANSWER,
                                    own, own, 1.0, 1.0))
    measured = RegressionResult(result, compare([1.0] * rows, [1.0] * rows, binary=True, capability="json_formatting"))
    served_file = tmp_path / "served.jsonl"
    served_file.write_text("".join(json.dumps({"id": e.id, "output": served_text or ANSWER}) + "\n"
                                   for e in examples), encoding="utf-8")
    answers = read_served(served_file, None, [e.id for e in examples])
    served = measure_served(measured, get_capability("json_formatting"), answers)
    return measured, served, examples, setup


def export(tmp_path, tokenizer, *, generation=None, template=None):
    """A served folder: its tokenizer (with `template` as chat template) and generation_config.json."""
    folder = tmp_path / "served-model"
    saved = build_tokenizer(WORDS)
    if template is not None:
        saved.chat_template = template
    saved.save_pretrained(folder)
    (folder / "generation_config.json").write_text(json.dumps(generation or {}), encoding="utf-8")
    return read_export(folder)


def rules(found):
    return {d.rule: d.evidence for d in found}


def test_served_answers_running_past_the_trained_eos_name_both_stop_ids(tmp_path, tokenizer):
    measured, served, examples, setup = world(tmp_path, tokenizer, served_text=ANSWER + " assistant: json")
    stop = rules(differences(measured, served, export(tmp_path, tokenizer, generation={"eos_token_id": [1, 2]}),
                             examples, tokenizer, setup))["stop_token"]
    assert stop == {"n_rows": 1, "example_id": "e0", "trained_eos_id": tokenizer.eos_token_id,
                    "served_eos_ids": [1, 2]}
    listed = export(tmp_path, tokenizer, generation={"eos_token_id": tokenizer.eos_token_id})
    assert "stop_token" not in rules(differences(measured, served, listed, examples, tokenizer, setup))


def test_a_served_template_that_renders_otherwise_shows_the_first_differing_token(tmp_path, tokenizer):
    measured, served, examples, setup = world(tmp_path, tokenizer)
    found = rules(differences(measured, served, export(tmp_path, tokenizer, template=OTHER_TEMPLATE), examples,
                              tokenizer, setup))
    # trained: <s> user : " " json ...   served: <s> user " " : " " json ...
    assert found["chat_template"] == {"n_rows": 1, "example_id": "e0", "position": 2, "trained_token": ":",
                                      "served_token": " ", "before": "<s>user"}
    same = rules(differences(measured, served, export(tmp_path, tokenizer), examples, tokenizer, setup))
    assert "chat_template" not in same


def test_a_template_writing_bos_that_the_tokenizer_adds_again_is_a_doubled_bos(tmp_path, tokenizer):
    measured, served, examples, setup = world(tmp_path, tokenizer, rows=2)
    found = rules(differences(measured, served, export(tmp_path, tokenizer), examples, tokenizer, setup))
    assert found["double_bos"] == {"n_rows": 2, "example_id": "e0", "where": "tokenizer", "bos_token": "<s>",
                                   "bos_token_id": tokenizer.bos_token_id}
    twice = export(tmp_path, tokenizer, template="{{ bos_token }}" + tokenizer.chat_template)
    found = rules(differences(measured, served, twice, examples, tokenizer, setup))
    assert found["double_bos"]["where"] == "template"
    assert "chat_template" not in found  # the doubled BOS is the only difference, named once


def test_a_served_template_without_the_system_turn_misses_the_system_prompt(tmp_path, tokenizer):
    measured, served, examples, setup = world(tmp_path, tokenizer, system=True)
    users_only = ("{{ bos_token }}{% for message in messages %}{% if message['role'] != 'system' %}"
                  "{{ message['role'] }}: {{ message['content'] }}\n{% endif %}{% endfor %}"
                  "{% if add_generation_prompt %}assistant: {% endif %}")
    found = rules(differences(measured, served, export(tmp_path, tokenizer, template=users_only), examples, tokenizer,
                              setup))
    assert found["system_prompt"] == {"n_rows": 1, "example_id": "e0"}


def test_a_served_token_limit_below_the_longest_reference_cuts_the_answers(tmp_path, tokenizer):
    measured, served, examples, setup = world(tmp_path, tokenizer)
    longest = len(tokenizer(ANSWER, add_special_tokens=False)["input_ids"])
    found = rules(differences(measured, served, export(tmp_path, tokenizer, generation={"max_new_tokens": 4}),
                              examples, tokenizer, setup))
    assert found["max_new_tokens"] == {"max_new_tokens": 4, "longest_reference": longest, "example_id": "e0",
                                       "n_rows": 1}
    room = export(tmp_path, tokenizer, generation={"max_new_tokens": longest})
    assert "max_new_tokens" not in rules(differences(measured, served, room, examples, tokenizer, setup))


@pytest.mark.parametrize(("content", "says"), [
    ("", "holds no served answers"),
    ('{"id": "e0", "output": "x"}\n{"id": "e9", "output": "y"}\n', "served.jsonl:2: id 'e9' is not an eval row id"),
    ('{"id": "e0", "output": "x"}\n{"id": "e1"', "served.jsonl:2: this line is not valid JSON"),
    ('{"id": "e0", "output": "x"}\n', "1 eval row(s) have no served answer, the first 'e1'"),
    ('{"id": "e0", "output": 3}\n', 'served.jsonl:1: each line needs an "id" and an "output" string'),
    ('{"id": "e0", "output": "x"}\n{"id": "e0", "output": "y"}\n', "served.jsonl:2: id 'e0' is answered twice"),
])
def test_bad_served_answers_name_the_file_and_line(tmp_path, content, says):
    path = tmp_path / "served.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(InputError) as raised:
        read_served_outputs(path, ["e0", "e1"])
    assert says in str(raised.value) and str(path) in str(raised.value)


def merged_export(tmp_path, tokenizer, *, seed, dtype):
    """A served folder with merged weights: a tiny Llama drawn from `seed`, saved in `dtype`."""
    import torch

    from conftest import make_tiny_model

    folder = tmp_path / f"merged-{seed}-{dtype}"
    make_tiny_model(tokenizer, seed=seed).to(getattr(torch, dtype)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return read_export(folder)


def test_merged_weights_that_answer_otherwise_and_fail_are_named_with_their_dtype(tmp_path, tokenizer):
    """The export's weights answer the prompts Gradian's path answered; where those weights are another model (in
    bf16 here) the fine-tune's right answers come out otherwise and fail; the export of the weights Gradian's path ran
    (float32, the same answers) is no difference."""
    from conftest import make_tiny_model
    from gradian.regression.generation import generate

    measured, served, examples, setup = world(tmp_path, tokenizer, rows=3)
    capability = get_capability("json_formatting")
    same = merged_export(tmp_path, tokenizer, seed=0, dtype="float32")
    model = make_tiny_model(tokenizer, seed=0)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    own = generate(model, tokenizer, [row.prompt_ids for row in measured.rows], max_new_tokens=12)
    for row, answer in zip(measured.rows, own, strict=True):
        row.finetuned = answer  # the path's own answers, counted right: only a change of weights can break them
    assert same.weights and same.dtype == "float32"
    assert "merged_weights" not in rules(differences(measured, served, same, examples, tokenizer, setup, capability))
    other = merged_export(tmp_path, tokenizer, seed=7, dtype="bfloat16")
    found = rules(differences(measured, served, other, examples, tokenizer, setup, capability))["merged_weights"]
    assert found["dtype"] == "bfloat16" and found["n_rows"] == found["n_changed"] == 3 and found["example_id"] == "e0"
    without = export(tmp_path, tokenizer)  # no weights: nothing loaded
    assert not without.weights
    assert "merged_weights" not in rules(differences(measured, served, without, examples, tokenizer, setup,
                                                     capability))
