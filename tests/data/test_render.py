"""Rendering equals TRL's own dataset processing, row for row: input ids and labels."""

from __future__ import annotations

import dataclasses

import pytest
import trl
from datasets import Dataset
from trl import SFTConfig, SFTTrainer

from gradian.data.examples import Example
from gradian.data.render import IGNORE, render_answer, render_dataset, render_example, render_prompt
from gradian.data.setup import TrainingSetup
from gradian.data.trl_prepare import Preparation, trl_masks_prompt_alone, trl_rows

PLAIN = [
    {"prompt": "my order is late", "completion": " please help"},
    {"prompt": "hello", "completion": " refund my invoice amount for the order</s>"},
    {"prompt": "need help with my account please", "completion": " the account was late"},
]
TEXT = [{"text": "hello my order is late"}, {"text": "refund the invoice amount</s>"}]
CHAT_PC = [
    {"prompt": [{"role": "user", "content": "my order is late"}],
     "completion": [{"role": "assistant", "content": "please help"}]},
    {"prompt": [{"role": "system", "content": "help"}, {"role": "user", "content": "refund my invoice"}],
     "completion": [{"role": "assistant", "content": "the invoice amount"}]},
]
MESSAGES = [
    {"messages": [{"role": "user", "content": "my order is late"}, {"role": "assistant", "content": "please help"},
                  {"role": "user", "content": "hello"}, {"role": "assistant", "content": "the order was late"}]},
    {"messages": [{"role": "user", "content": "refund"}, {"role": "assistant", "content": "my invoice amount"}]},
]


def _examples(rows: list[dict]) -> list[Example]:
    return [Example(id=str(i + 1), line=i + 1, fields=row) for i, row in enumerate(rows)]


def _trl_rows(rows, tokenizer, model, tmp_path, **config):
    """Each row's input ids and labels as the installed TRL's trainer feeds them to the model: its prepared dataset
    through its own collator (TRL before 1.0 makes the labels there), one row a batch."""
    unknown = set(config) - {f.name for f in dataclasses.fields(SFTConfig)}
    if unknown:
        pytest.skip(f"TRL {trl.__version__} has no {', '.join(sorted(unknown))}")
    args = SFTConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, dataset_num_proc=None, **config)
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer)
    rows = [(list(r["input_ids"]), trainer.data_collator([r])["labels"][0].tolist()) for r in trainer.train_dataset]
    return [(ids, labels) for ids, labels in rows if set(labels) != {IGNORE}]  # TRL < 1.0 keeps rows training nothing


CASES = [
    ("prompt_completion", PLAIN, {}),
    ("prompt_completion_full_loss", PLAIN, {"completion_only_loss": False}),
    ("text", TEXT, {}),
    ("conversational_prompt_completion", CHAT_PC, {}),
    ("messages", MESSAGES, {}),
    ("messages_assistant_only", MESSAGES, {"assistant_only_loss": True}),
    ("keep_start", PLAIN, {"max_length": 6}),
    ("keep_end", PLAIN, {"max_length": 6, "truncation_mode": "keep_end"}),
    ("chat_keep_start", MESSAGES, {"max_length": 9, "assistant_only_loss": True}),
]


@pytest.mark.parametrize(("name", "rows", "config"), CASES, ids=[c[0] for c in CASES])
def test_render_matches_trl(name, rows, config, tiny_tokenizer, tiny_model, tmp_path):
    expected = _trl_rows(rows, tiny_tokenizer, tiny_model, tmp_path, **config)
    setup = TrainingSetup(**config)
    rendered = [r for r in render_dataset(_examples(rows), tiny_tokenizer, setup) if not r.dropped]
    assert [(r.input_ids, r.labels) for r in rendered] == expected


def test_keep_start_marks_the_cut_tail(tiny_tokenizer):
    row = render_example(_examples(PLAIN)[1], tiny_tokenizer, TrainingSetup(max_length=6))
    assert row.tail_cut and row.truncated_tokens == row.full_length - 6 > 0
    assert len(row.input_ids) == 6


def test_eos_after_truncation_ends_the_cut_row_in_a_supervised_eos(tiny_tokenizer):
    """`add_eos_token=True` with `truncation=True, max_length=6`: cut to 5 tokens, then EOS, which carries loss."""
    example = _examples(PLAIN)[1]
    whole = render_example(example, tiny_tokenizer, TrainingSetup(max_length=None))
    row = render_example(example, tiny_tokenizer, TrainingSetup(max_length=6, eos_after_truncation=True))
    assert row.tail_cut and row.input_ids == whole.input_ids[:5] + [tiny_tokenizer.eos_token_id]
    assert row.labels[:5] == whole.labels[:5] and row.labels[-1] == tiny_tokenizer.eos_token_id


def test_collator_that_masks_pad_hides_eos_when_pad_is_eos(tiny_tokenizer):
    setup = TrainingSetup(pad_token=tiny_tokenizer.eos_token, collator_masks_pad=True)
    row = render_example(_examples(PLAIN)[0], tiny_tokenizer, setup)
    assert row.input_ids[-1] == tiny_tokenizer.eos_token_id
    assert row.labels[-1] == IGNORE and row.last_supervised() != tiny_tokenizer.eos_token_id


def test_fully_masked_rows_are_dropped_like_trl(tiny_tokenizer):
    long_prompt = {"prompt": "hello " * 10, "completion": " please"}
    (row,) = render_dataset(_examples([long_prompt]), tiny_tokenizer, TrainingSetup(max_length=5))
    assert row.dropped and row.supervised == 0


def test_render_prompt_and_answer(tiny_tokenizer):
    example = _examples(CHAT_PC)[0]
    prompt = render_prompt(example, tiny_tokenizer, TrainingSetup())
    assert tiny_tokenizer.decode(prompt).endswith("assistant: ")
    ids, labels = render_answer(prompt, [5, 6])
    assert ids[-2:] == [5, 6] and labels[: len(prompt)] == [IGNORE] * len(prompt)


def test_offsets_fast_path_equals_trl_way_over_many_batches(tiny_tokenizer):
    from gradian.data import render

    rows = [{"prompt": "my order " * (i % 7) + "is", "completion": " late" * (1 + i % 3)} for i in range(9000)]
    rows[5000]["prompt"] = "hello"  # ends mid-word once joined: "hellolate" is one (unknown) word
    rows[5000]["completion"] = "late"
    tally = Preparation()
    fast = render.render_dataset(_examples(rows), tiny_tokenizer, TrainingSetup(), tally)
    assert tally.checked_rows == len(rows) and tally.trainer_rows == 0  # the fast path took every row
    trl = trl_rows(_examples(rows), tiny_tokenizer, TrainingSetup())  # TRL's own code on every row
    assert [(r.input_ids, r.labels, r.prompt_length) for r in fast] == trl


@pytest.mark.skipif(trl_masks_prompt_alone(), reason="TRL before 1.0 counts the prompt alone: no offsets are read")
def test_offsets_that_disagree_fall_back_to_trl_way(tiny_tokenizer, monkeypatch):
    from gradian.data import render

    monkeypatch.setattr(render, "_prompt_end", lambda spans, chars: 0)  # a tokenizer whose offsets mislead
    rows = _examples(PLAIN * 500)
    tally = Preparation()
    rendered = render.render_dataset(rows, tiny_tokenizer, TrainingSetup(), tally)
    assert all(r.prompt_length > 0 for r in rendered)
    assert tally.trainer_rows == len(rows) and tally.checked_rows == 0  # TRL's own code took every row


@pytest.mark.skipif(trl_masks_prompt_alone(), reason="TRL before 1.0 counts the prompt alone: no offsets are read")
def test_the_check_skips_huge_rows_and_a_fallback_keeps_row_order(tiny_tokenizer, monkeypatch):
    """The fast path is checked on rows of at most VERIFY_CHARS characters (a huge row would cost the check what TRL's
    way costs); where the check fails, TRL's rows of the sample and of the rest come back in dataset order."""
    from gradian.data import render

    monkeypatch.setattr(render, "VERIFY_CHARS", 200)
    rows = [{"prompt": "my order is", "completion": " late" * 60}] + PLAIN * 3  # row 0: over 200 characters
    checked: list[int] = []
    real = render.trl_rows
    monkeypatch.setattr(render, "trl_rows", lambda ex, *a: checked.append(len(ex)) or real(ex, *a))
    tally = Preparation()
    assert len(render.render_dataset(_examples(rows), tiny_tokenizer, TrainingSetup(), tally)) == len(rows)
    assert checked == [len(rows) - 1] and tally.checked_rows == len(rows)  # the huge row: not in the sample

    monkeypatch.setattr(render, "_prompt_end", lambda spans, chars: 0)  # offsets that mislead: the check fails
    fallback = render.render_dataset(_examples(rows), tiny_tokenizer, TrainingSetup(), Preparation())
    assert [(r.input_ids, r.labels, r.prompt_length) for r in fallback] == real(_examples(rows), tiny_tokenizer,
                                                                               TrainingSetup())
