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


def test_generation_prompt_keeps_the_files_roles(tiny_tokenizer, tmp_path):
    """A ShareGPT row's prompt is rendered with the roles TRL trained (`human`, kept verbatim), not renamed."""
    from gradian.data.render import render_prompt

    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in SHAREGPT))
    for example, row in zip(read_dataset(path), SHAREGPT, strict=True):
        turns = [{"role": turn["from"], "content": turn["value"]} for turn in row["conversations"][:-1]]
        trained = tiny_tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=True,
                                                     return_dict=True)["input_ids"]
        assert render_prompt(example, tiny_tokenizer, TrainingSetup()) == list(trained)


def test_generation_prompt_with_tools_is_the_trained_rows_prefix(tiny_tokenizer, tiny_model, tmp_path):
    """A row with a `tools` column: the prompt Gradian generates from holds the tools preamble, a prefix of TRL's
    row, and the last answer rendered after it is the trained row's end."""
    from gradian.data.render import render_prompt, render_with_answer

    expected = _trl(WITH_TOOLS, tiny_tokenizer, tiny_model, tmp_path, STOCK, {})
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in WITH_TOOLS))
    tokenizer = _with_template(tiny_tokenizer, STOCK)
    for example, (ids, _) in zip(read_dataset(path), expected, strict=True):
        prompt = render_prompt(example, tokenizer, TrainingSetup())
        assert ids[: len(prompt)] == prompt
        without_tools = tokenizer.apply_chat_template(example.prompt, add_generation_prompt=True, tokenize=True,
                                                      return_dict=True)["input_ids"]
        assert len(prompt) > len(without_tools)  # the preamble is there
        _, answer_ids = render_with_answer(example, example.completion_text, tokenizer, TrainingSetup())
        assert ids[-len(answer_ids):] == answer_ids


def test_trls_rows_are_kept_by_content_and_read_back(tiny_tokenizer, tmp_path, monkeypatch):
    """A second preparation of the same rows reads TRL's output back from the cache; other settings, a damaged file
    or GRADIAN_ROWS_CACHE=0 prepare again."""
    from gradian.data import rows_cache
    from gradian.data.examples import Example

    monkeypatch.setenv("GRADIAN_CACHE", str(tmp_path / "cache"))
    examples = [Example(str(i), i + 1, CHAT[i % 2]) for i in range(rows_cache.MIN_ROWS)]
    first, again, other = Preparation(), Preparation(), Preparation()
    rows = render_dataset(examples, tiny_tokenizer, TrainingSetup(), first)
    assert first.cached_rows == 0 and len(list((tmp_path / "cache" / "rows").iterdir())) == 1
    assert render_dataset(examples, tiny_tokenizer, TrainingSetup(), again) == rows
    assert again.cached_rows == again.trainer_rows == len(examples)
    render_dataset(examples, tiny_tokenizer, TrainingSetup(assistant_only_loss=True), other)
    assert other.cached_rows == 0  # another setting is another key
    for path in (tmp_path / "cache" / "rows").iterdir():
        path.write_bytes(b"damaged")
    damaged = Preparation()
    assert render_dataset(examples, tiny_tokenizer, TrainingSetup(), damaged) == rows and damaged.cached_rows == 0
    monkeypatch.setenv("GRADIAN_ROWS_CACHE", "0")
    off = Preparation()
    render_dataset(examples, tiny_tokenizer, TrainingSetup(), off)
    assert off.cached_rows == 0


def test_bfd_packing_cuts_over_long_rows_as_trl_packs_them(tiny_tokenizer, tiny_model, tmp_path):
    """packing=True, TRL's default bfd: a row past max_length is cut to its first max_length tokens. The lengths in
    TRL's packed blocks (`seq_lengths`) are the lengths of Gradian's rows."""
    rows = [{"prompt": "my order is late " * (1 + i % 4), "completion": " please help " * (1 + i % 3)}
            for i in range(12)]
    config = {"packing": True, "max_length": 24}
    args = SFTConfig(output_dir=str(tmp_path / "trl"), report_to=[], use_cpu=True, dataset_num_proc=None, **config)
    trainer = SFTTrainer(model=tiny_model, args=args, train_dataset=Dataset.from_list(rows),
                         processing_class=tiny_tokenizer)
    packed = sorted(n for block in trainer.train_dataset["seq_lengths"] for n in block)
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    rendered = render_dataset(read_dataset(path), tiny_tokenizer, TrainingSetup(**config))
    assert sorted(len(r.input_ids) for r in rendered) == packed
    assert any(r.over_limit == "truncated" and r.tail_cut for r in rendered)
