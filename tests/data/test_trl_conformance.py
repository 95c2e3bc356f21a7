"""Rows as TRL trains them, on the shapes Gradian's own rendering got wrong: the real `SFTTrainer`'s train_dataset
against Gradian's rows, token for token (input ids and labels), every row read from a JSONL file as a user's is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trl
from datasets import Dataset
from trl import SFTConfig, SFTTrainer

from gradian.data.examples import read_dataset
from gradian.data.render import IGNORE, render_dataset
from gradian.data.setup import TrainingSetup
from gradian.data.trl_prepare import Preparation

STOCK = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()  # no {% generation %} markers
TOOLS = [{"type": "function", "function": {"name": "refund", "description": "refund an order",
                                           "parameters": {"type": "object", "properties": {"order": {"type": "string"}}}}}]
CHAT = [
    {"messages": [{"role": "user", "content": "my order is late"}, {"role": "assistant", "content": "please help"}]},
    {"messages": [{"role": "system", "content": "help"}, {"role": "user", "content": "refund my invoice"},
                  {"role": "assistant", "content": "the invoice amount"}, {"role": "user", "content": "hello"},
                  {"role": "assistant", "content": "the order was late"}]},
]
WITH_TOOLS = [{**row, "tools": json.dumps(TOOLS)} for row in CHAT]
TOOL_CALL = [{"messages": [
    {"role": "user", "content": "refund my order"},
    {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "refund",
                                                                           "arguments": {"order": "late"}}}]},
    {"role": "tool", "content": "refund please"},
    {"role": "assistant", "content": "the refund was late"}]}]
SHAREGPT = [{"conversations": [{"from": "human", "value": "my order is late"}, {"from": "gpt", "value": "please help"}]},
            {"conversations": [{"from": "human", "value": "refund"}, {"from": "gpt", "value": "my invoice amount"}]}]
KWARGS = [{**row, "chat_template_kwargs": {"add_generation_prompt": False}} for row in CHAT]

CASES = [
    ("stock_template_assistant_only", CHAT, STOCK, {"assistant_only_loss": True}),
    ("tools_column", WITH_TOOLS, STOCK, {}),
    ("tools_assistant_only_cut", WITH_TOOLS, STOCK, {"assistant_only_loss": True, "max_length": 60}),
    ("tool_call_without_content", TOOL_CALL, STOCK, {}),
    ("sharegpt_roles_kept", SHAREGPT, None, {}),
    ("chat_template_kwargs", KWARGS, STOCK, {}),
    ("keep_end", CHAT, None, {"max_length": 12, "truncation_mode": "keep_end"}),
]


def _trl(rows, tokenizer, model, tmp_path, template, config):
    if template is not None:
        tokenizer = _with_template(tokenizer, template)
    args = SFTConfig(output_dir=str(tmp_path / "trl"), report_to=[], use_cpu=True, dataset_num_proc=None, **config)
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer)
    return [(list(r["input_ids"]), list(r["labels"])) for r in trainer.train_dataset]


def _with_template(tokenizer, template):
    import copy

    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = template
    return tokenizer


@pytest.mark.parametrize(("name", "rows", "template", "config"), CASES, ids=[c[0] for c in CASES])
def test_rows_equal_trls_own(name, rows, template, config, tiny_tokenizer, tiny_model, tmp_path):
    expected = _trl(rows, tiny_tokenizer, tiny_model, tmp_path, template, config)
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    tokenizer = _with_template(tiny_tokenizer, template) if template is not None else tiny_tokenizer
    tally = Preparation()
    rendered = render_dataset(read_dataset(path), tokenizer, TrainingSetup(**config), tally)
    assert [(r.input_ids, r.labels) for r in rendered if not r.dropped] == expected
    assert tally.trainer_rows == len(rows) and tally.port_rows == 0 and not tally.why


def test_stock_template_assistant_only_trains_assistant_tokens(tiny_tokenizer, tmp_path):
    """The training template TRL swaps in: labels on the assistant turns, where a rendering of the stock template
    finds none (and calls every row no_loss)."""
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in CHAT))
    rendered = render_dataset(read_dataset(path), _with_template(tiny_tokenizer, STOCK),
                              TrainingSetup(assistant_only_loss=True))
    assert all(r.supervised > 0 and not r.dropped for r in rendered)
    assert all(r.labels[0] == IGNORE for r in rendered)  # the user's turn carries no loss


def test_rows_trl_refuses_are_ported_and_said(tiny_tokenizer, tmp_path):
    """A template TRL has no training version of, with assistant-only loss: TRL's code refuses; Gradian's port renders
    the rows (no assistant tokens: the audit's no_loss) and the tally says why."""
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in CHAT))
    plain = "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
    tally = Preparation()
    rendered = render_dataset(read_dataset(path), _with_template(tiny_tokenizer, plain),
                              TrainingSetup(assistant_only_loss=True), tally)
    assert tally.port_rows == len(CHAT) and tally.trainer_rows == 0
    assert tally.why and "refused" in tally.why[0]
    assert all(r.supervised == 0 for r in rendered)


def test_a_row_datasets_cannot_hold_is_ported(tiny_tokenizer, tmp_path):
    """Messages whose content is a string in one turn and a number in another: no Arrow type holds them, so TRL's
    code cannot take the row (nor could the run's own load of the file); Gradian's port renders it and says why."""
    row = {"messages": [{"role": "user", "content": "my order"}, {"role": "assistant", "content": 7}]}
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(row) + "\n")
    tally = Preparation()
    rendered = render_dataset(read_dataset(path), tiny_tokenizer, TrainingSetup(), tally)
    assert len(rendered) == 1 and tally.port_rows == 1 and "datasets cannot hold the row" in tally.why[0]
