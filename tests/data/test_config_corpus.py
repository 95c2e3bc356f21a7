"""Every config of tests/fixtures/configs, its rows rendered token by token as its framework renders them.

TRL configs are checked against TRL's own `SFTTrainer` tokenization (TRL is installed). axolotl is too heavy to
install here, so its rows are checked against the template strings axolotl's source writes, quoted below with the
file each comes from (repository axolotl-ai-cloud/axolotl).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from datasets import Dataset
from trl import SFTConfig, SFTTrainer

from fixtures.llama3_like import build_llama3_like
from gradian.data.examples import read_dataset
from gradian.data.render import IGNORE, render_dataset, render_prompt
from gradian.data.run_folder import read_run
from gradian.data.tokens import apply_training_tokens

CONFIGS = Path(__file__).parents[1] / "fixtures" / "configs"

# src/axolotl/prompters.py, AlpacaPrompter
SYSTEM_PROMPT = ("Below is an instruction that describes a task, paired with an input that provides further context. "
                 "Write a response that appropriately completes the request.")
SYSTEM_NO_INPUT_PROMPT = ("Below is an instruction that describes a task. Write a response that appropriately "
                          "completes the request.")
INSTRUCT = {"turn_format": "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n",
            "turn_no_input_format": "### Instruction:\n{instruction}\n\n### Response:\n", "system_format": "{system}\n\n"}
CHAT = {"turn_format": "USER: {instruction}\n{input}\nASSISTANT:", "turn_no_input_format": "USER: {instruction}\nASSISTANT:",
        "system_format": "SYSTEM: {system}\n"}
# src/axolotl/utils/chat_templates/templates/llama3.jinja and chatml.jinja, each turn as the template writes it
LLAMA3_TURN = "<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>"
CHATML_TURN = "<|im_start|>{role}\n{content}<|im_end|>\n"


def _setup_and_rows(config: str, rows: str, instruct: bool = False):
    setup = read_run(None, CONFIGS / config).setup
    tokenizer = build_llama3_like(instruct)
    added = apply_training_tokens(tokenizer, setup, config)
    return setup, tokenizer, read_dataset(CONFIGS / rows), added


def _alpaca_expected(tokenizer, row, style, system=None):
    """InstructionPromptTokenizingStrategy.tokenize_prompt (src/axolotl/prompt_tokenizers.py): the prompt with its
    BOS, then the response with BOS stripped and EOS appended; labels -100 over the prompt."""
    given = row.get("input") or ""
    if system is None:
        head = style["system_format"].format(system=SYSTEM_PROMPT if given else SYSTEM_NO_INPUT_PROMPT)
    else:
        head = style["system_format"].format(system=system) if system else ""
    prompt = head + (style["turn_format"].format(instruction=row["instruction"], input=given) if given
                     else style["turn_no_input_format"].format(instruction=row["instruction"]))
    prompt_ids = tokenizer(prompt)["input_ids"]
    response = tokenizer(row["output"])["input_ids"][1:] + [tokenizer.eos_token_id]
    return prompt_ids + response, [IGNORE] * len(prompt_ids) + response


@pytest.mark.parametrize("config", ["axolotl-lora-1b.yml", "axolotl-qlora-1b.yml",
                                    "axolotl-lora-1b-sample-packing-sequentially.yml"])
def test_axolotl_alpaca_configs(config):
    setup, tokenizer, examples, added = _setup_and_rows(config, "alpaca.jsonl")
    assert setup.framework == "axolotl" and setup.packing is True and added == []  # <|end_of_text|> exists
    assert tokenizer.pad_token == "<|end_of_text|>"
    for example, row in zip(examples, render_dataset(examples, tokenizer, setup), strict=True):
        assert (row.input_ids, row.labels) == _alpaca_expected(tokenizer, example.raw, INSTRUCT)
        assert not row.dropped and row.over_limit == ""
    prompt = tokenizer.decode(render_prompt(examples[1], tokenizer, setup), skip_special_tokens=True)
    assert prompt.startswith(SYSTEM_PROMPT) and prompt.endswith("### Response:\n")


def test_axolotl_alpaca_chat_adds_a_new_pad_token():
    setup, tokenizer, examples, added = _setup_and_rows("axolotl-alpaca-chat.yml", "alpaca.jsonl")
    assert added == ["<|pad|>"] and tokenizer.pad_token == "<|pad|>"  # added, as axolotl adds it, not refused
    for example, row in zip(examples, render_dataset(examples, tokenizer, setup), strict=True):
        assert (row.input_ids, row.labels) == _alpaca_expected(tokenizer, example.raw, CHAT)


def test_axolotl_alpaca_w_system_instruct():
    setup, tokenizer, examples, _ = _setup_and_rows("axolotl-alpaca-w-system.yml", "alpaca_system.jsonl")
    for example, row in zip(examples, render_dataset(examples, tokenizer, setup), strict=True):
        assert (row.input_ids, row.labels) == _alpaca_expected(tokenizer, example.raw, INSTRUCT, example.raw["system"])


def _chat_expected(tokenizer, turns, turn_format, bos, trained_roles, eos_text):
    """Token ids of the template's text, and labels on the trained turns' content plus their end token."""
    ids, labels = list(tokenizer(bos, add_special_tokens=False)["input_ids"]) if bos else [], []
    labels = [IGNORE] * len(ids)
    for turn in turns:
        head, tail = turn_format.split("{content}")
        head_ids = tokenizer(head.format(role=turn["role"]), add_special_tokens=False)["input_ids"]
        content = tokenizer(turn["content"], add_special_tokens=False)["input_ids"]
        tail_ids = tokenizer(tail, add_special_tokens=False)["input_ids"]
        trained = turn["role"] in trained_roles
        eos = tokenizer.convert_tokens_to_ids(eos_text)
        ids += head_ids + content + tail_ids
        labels += [IGNORE] * len(head_ids) + (content if trained else [IGNORE] * len(content))
        labels += [t if trained and t == eos else IGNORE for t in tail_ids]
    return ids, labels


def test_axolotl_instruct_llama3_chat_template():
    """roles_to_train [assistant], train_on_eos turn: each answer and its <|eot_id|> (the instruct tokenizer's EOS)."""
    setup, tokenizer, examples, _ = _setup_and_rows("axolotl-instruct-lora-8b.yml", "messages.jsonl", instruct=True)
    for example, row in zip(examples, render_dataset(examples, tokenizer, setup), strict=True):
        expected = _chat_expected(tokenizer, example.raw["messages"], LLAMA3_TURN, "<|begin_of_text|>",
                                  {"assistant"}, "<|eot_id|>")
        assert (row.input_ids, row.labels) == expected


def test_axolotl_sharegpt_rows_through_chatml():
    """from/value mapped, gpt trained, train_on_eos all: every <|im_end|> (eos by special_tokens) carries loss."""
    setup, tokenizer, examples, added = _setup_and_rows("axolotl-sharegpt.yml", "sharegpt.jsonl")
    assert set(added) == {"<|im_end|>", "<|im_start|>"} and tokenizer.eos_token == "<|im_end|>"
    roles = {"human": "user", "gpt": "assistant", "system": "system"}
    for example, row in zip(examples, render_dataset(examples, tokenizer, setup), strict=True):
        turns = [{"role": roles[t["from"]], "content": t["value"]} for t in example.raw["conversations"]]
        ids, labels = _chat_expected(tokenizer, turns, CHATML_TURN, "", {"assistant"}, "<|im_end|>")
        end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        labels = [end if token == end else label for token, label in zip(ids, labels, strict=True)]  # "all"
        assert (row.input_ids, row.labels) == (ids, labels)


def test_axolotl_completion_rows_are_split_not_cut():
    """completion.py: the text and EOS, all trained, split into sequence_len pieces: nothing is dropped or cut."""
    setup, tokenizer, examples, _ = _setup_and_rows("axolotl-completion.yml", "completion.jsonl")
    rows = render_dataset(examples, tokenizer, setup)
    for example, row in zip(examples, rows, strict=True):
        ids = tokenizer(example.raw["text"])["input_ids"] + [tokenizer.eos_token_id]
        assert row.input_ids == row.labels == ids and not row.dropped
    assert rows[1].full_length > setup.max_length == 16 and rows[1].over_limit == "split"


def test_axolotl_input_output_segments():
    """input_output.py: each segment tokenized without special tokens, loss where label is true."""
    setup, tokenizer, examples, _ = _setup_and_rows("axolotl-input-output.yml", "input_output.jsonl")
    for example, row in zip(examples, render_dataset(examples, tokenizer, setup), strict=True):
        ids, labels = [], []
        for segment in example.raw["segments"]:
            piece = tokenizer(segment["text"], add_special_tokens=False)["input_ids"]
            ids, labels = ids + piece, labels + (piece if segment["label"] else [IGNORE] * len(piece))
        assert (row.input_ids, row.labels) == (ids, labels)


TRL_CASES = [("trl-example-config.yaml", "text.jsonl"), ("trl-sft-prompt-completion.yaml", "prompt_completion.jsonl"),
             ("trl-sft-assistant-only.yaml", "capybara.jsonl")]
SFT_FIELDS = ("max_length", "completion_only_loss", "assistant_only_loss", "learning_rate", "num_train_epochs",
              "per_device_train_batch_size", "lr_scheduler_type")


@pytest.mark.parametrize(("config", "rows"), TRL_CASES, ids=[c for c, _ in TRL_CASES])
def test_trl_configs_match_sft_trainer(config, rows, tiny_tokenizer, tiny_model, tmp_path):
    values = yaml.safe_load((CONFIGS / config).read_text())
    setup = read_run(None, CONFIGS / config).setup
    assert setup.framework == "trl"
    args = SFTConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, dataset_num_proc=None,
                     **{k: v for k, v in values.items() if k in SFT_FIELDS})
    data = [json.loads(line) for line in (CONFIGS / rows).read_text().splitlines()]
    trainer = SFTTrainer(model=tiny_model, args=args, train_dataset=Dataset.from_list(data),
                         processing_class=tiny_tokenizer)
    expected = [(list(r["input_ids"]), list(r["labels"])) for r in trainer.train_dataset]
    rendered = render_dataset(read_dataset(CONFIGS / rows), tiny_tokenizer, setup)
    assert [(r.input_ids, r.labels) for r in rendered if not r.dropped] == expected


def test_entries_of_different_types_need_a_path_naming_the_file(tmp_path):
    from gradian.errors import InputError

    config = tmp_path / "axolotl.yml"
    config.write_text(yaml.safe_dump({"sequence_len": 512, "datasets": [{"path": "org/a", "type": "alpaca"},
                                                                         {"path": "org/b", "type": "completion"}]}))
    setup = read_run(None, config).setup
    tokenizer = build_llama3_like()
    with pytest.raises(InputError, match="different types"):
        render_dataset(read_dataset(CONFIGS / "alpaca.jsonl"), tokenizer, setup)
    config.write_text(yaml.safe_dump({"sequence_len": 512, "datasets": [{"path": "org/a", "type": "completion"},
                                                                         {"path": "alpaca.jsonl", "type": "alpaca"}]}))
    examples = read_dataset(CONFIGS / "alpaca.jsonl")
    row = render_dataset(examples, tokenizer, read_run(None, config).setup)[0]
    assert row.input_ids == _alpaca_expected(tokenizer, examples[0].raw, INSTRUCT)[0]  # the entry that names it


@pytest.mark.parametrize(("config", "rows", "instruct"), [("axolotl-lora-1b.yml", "alpaca.jsonl", False),
                                                          ("axolotl-instruct-lora-8b.yml", "messages.jsonl", True)])
def test_eval_answers_render_as_training_rendered_them(tmp_path, config, rows, instruct):
    """An eval row (no answer, from another file) with the trained answer put back renders as the trained row did:
    the queries of `attribute` are taken on the same tokens as training."""
    from gradian.data.render import render_with_answer

    setup, tokenizer, examples, _ = _setup_and_rows(config, rows, instruct)
    evals = tmp_path / "eval.jsonl"
    lines = []
    for example in examples:
        row = dict(example.raw)
        row.pop("output", None)  # Alpaca eval rows may omit the answer; chat ones end with their reference answer
        lines.append(json.dumps(row))
    evals.write_text("\n".join(lines) + "\n")
    for trained, example, row in zip(render_dataset(examples, tokenizer, setup), read_dataset(evals, eval_set=True),
                                     examples, strict=True):
        answer = row.completion_text if "output" in row.raw else example.completion_text
        prompt, answer_ids = render_with_answer(example, answer, tokenizer, setup)
        assert prompt + answer_ids == trained.input_ids[: len(prompt) + len(answer_ids)]
        assert answer_ids and [t for t in trained.labels if t != IGNORE][-len(answer_ids):] == answer_ids
        assert render_prompt(example, tokenizer, setup) == prompt


@pytest.mark.parametrize(("entry", "extra", "message"), [
    ({"type": "sharegpt"}, {}, "removed `type: sharegpt`"),
    ({"type": "oasst"}, {}, "is not one Gradian renders"),
    ({"type": "chat_template", "chat_template": "gemma3"}, {}, "named axolotl chat template 'gemma3'"),
    ({"type": "alpaca"}, {"excess_length_strategy": "shorten"}, "not drop, truncate or raise"),
    ({"type": "alpaca:pirate"}, {}, "prompt style 'pirate'"),
])
def test_bad_axolotl_configs_are_one_sentence(tmp_path, entry, extra, message):
    from gradian.errors import InputError

    config = tmp_path / "axolotl.yml"
    config.write_text(yaml.safe_dump({"sequence_len": 512, "datasets": [{"path": "x", **entry}], **extra}))
    rows = "messages.jsonl" if "chat_template" in entry.get("type", "") else "alpaca.jsonl"
    with pytest.raises(InputError, match=message) as error:
        setup = read_run(None, config).setup
        render_dataset(read_dataset(CONFIGS / rows), build_llama3_like(), setup)
    assert "\n" not in str(error.value)
