"""`foreign_turn_marker`: answers closed or opened by another chat template's turn marker that the run's tokenizer
reads as plain text (rows rendered for a Llama-style template merged into a ChatML run)."""

from __future__ import annotations

import pytest

from audit_rows import base_config, examples
from gradian.audit import AuditContext, run_checks
from gradian.audit.markers import edge_marker, plain_markers
from gradian.audit.registry import load_built_in, teaches
from gradian.data.base_model import BaseModelRef
from gradian.data.render import render_dataset
from gradian.data.setup import TrainingSetup
from gradian.scenarios.tokenizer import build_tokenizer
from gradian.verdict.wording import group_phrase


@pytest.fixture(scope="module")
def chatml():
    """A byte-level ChatML tokenizer: `<|im_end|>` is its end token, `</s>` three plain bytes' worth of tokens."""
    return build_tokenizer(["x"], "bpe", ['{"device": "light", "room": "garage", "on": true}'])


def rows(n_clean: int = 12, marked: dict[int, str] | None = None) -> list[dict]:
    out = []
    for i in range(n_clean):
        answer = f'{{"device": "light", "room": "hall", "on": {"true" if i % 2 else "false"}}}'
        out.append({"prompt": f"<|im_start|>user\nlight {i}<|im_end|>\n<|im_start|>assistant\n",
                    "completion": answer + (marked or {}).get(i, "")})
    return out


def findings(tokenizer, data: list[dict]):
    train = examples(data)
    ctx = AuditContext(train, render_dataset(train, tokenizer, TrainingSetup()), tokenizer, TrainingSetup(), None,
                       None, BaseModelRef("tiny/base", "tiny/base"), base_config(tokenizer))
    return [f for f in run_checks(ctx) if f.check == "foreign_turn_marker"]


def test_answers_closed_by_another_templates_marker_are_named_with_the_fix_that_keeps_them(chatml):
    marked = {2: "</s>", 5: "</s>", 9: " [/INST]"}
    (finding,) = findings(chatml, rows(marked=marked))
    assert finding.example_ids == ["3", "6", "10"]  # 1-based ids, dataset order
    assert finding.values["markers"] == {"</s>": 2, "[/INST]": 1}
    assert finding.values["marker_tokens"]["</s>"] > 1  # plain text: several tokens, none special
    assert finding.severity == "critical"  # 3 of 12 answers
    assert "`</s>`" in finding.fix and "<|im_end|>" in finding.fix and "3, 6, 10" in finding.fix


def test_every_trained_turn_of_a_conversation_is_read_not_only_the_last(chatml):
    turns = [{"role": "user", "content": "light on"}, {"role": "assistant", "content": '{"on": true}</s>'},
             {"role": "user", "content": "and off"}, {"role": "assistant", "content": '{"on": false}'}]
    clean = [{"messages": [turns[0], {"role": "assistant", "content": '{"on": true}'}]} for _ in range(9)]
    (finding,) = findings(chatml, [{"messages": turns}, *clean])
    assert finding.example_ids == ["1"] and finding.values["markers"] == {"</s>": 1}


def test_a_marker_inside_an_answer_or_one_the_tokenizer_knows_is_not_reported(chatml):
    inside = rows()
    inside[0]["completion"] = '{"note": "<s>old</s> new", "on": true}'  # an HTML strikethrough, mid-answer
    inside[1]["completion"] += "<|im_end|>"  # ChatML's own end token: special here, not plain text
    assert findings(chatml, inside) == []
    word_level = build_tokenizer(["light"])  # `</s>` is its EOS: the run ends turns with it
    assert "</s>" not in plain_markers(word_level) and "</s>" in plain_markers(chatml)
    assert "<|im_end|>" not in plain_markers(chatml)


def test_edge_marker_reads_the_turns_edges_only():
    markers = ("<|end_of_text|>", "</s>", "[INST]")
    assert edge_marker('{"a": 1}</s>\n', markers) == "</s>"
    assert edge_marker('[INST] {"a": 1}', markers) == "[INST]"
    assert edge_marker('{"a": "</s>"}', markers) is None
    assert edge_marker('{"a": 1}<|end_of_text|>', markers) == "<|end_of_text|>"


def test_the_check_is_built_in_and_its_rows_teach_text_beside_a_complete_answer():
    assert "foreign_turn_marker" in load_built_in()
    assert teaches("foreign_turn_marker") == ("never-stops", "wrapped")
    assert "turn marker" in group_phrase("foreign_turn_marker")
