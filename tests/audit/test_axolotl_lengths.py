"""An Alpaca row near `sequence_len` under an axolotl config: the template's tokens push it over, and axolotl's
`excess_length_strategy` decides what training did with it (drop by default, truncate, raise)."""

from __future__ import annotations

import json

import pytest
import yaml
from transformers import LlamaConfig

from fixtures.llama3_like import build_llama3_like
from gradian.audit.diagnosis import diagnose

LONG = {"id": "long", "instruction": "Give three tips for staying healthy.", "input": "",
        "output": "Eat a balanced diet, exercise regularly and get enough sleep. " * 3}
SHORT = [{"id": f"s{i}", "instruction": "What is the capital of France?", "output": "Paris is its capital."}
         for i in range(30)]


@pytest.fixture
def workspace(tmp_path):
    tokenizer = build_llama3_like()
    base = tmp_path / "base"
    tokenizer.save_pretrained(base)
    LlamaConfig(vocab_size=len(tokenizer) + 8, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2, bos_token_id=0, eos_token_id=1).save_pretrained(base)
    dataset = tmp_path / "train.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in [LONG, *SHORT]))
    # the row as plain text (instruction, blank line, output, EOS) and as axolotl's Alpaca prompter renders it
    plain = len(tokenizer(LONG["instruction"] + "\n\n" + LONG["output"])["input_ids"]) + 1
    return tmp_path, base, dataset, plain


def _diagnose(tmp_path, base, dataset, **config):
    path = tmp_path / "axolotl.yml"
    path.write_text(yaml.safe_dump({"base_model": "NousResearch/Llama-3.2-1B", "adapter": "lora",
                                    "datasets": [{"path": "teknium/GPT4-LLM-Cleaned", "type": "alpaca"}],
                                    "special_tokens": {"pad_token": "<|end_of_text|>"}, **config}))
    return diagnose(dataset, base_model=str(base), config=path)


def test_dropped_by_default(workspace):
    tmp_path, base, dataset, plain = workspace
    result = _diagnose(tmp_path, base, dataset, sequence_len=plain + 5)
    (row,) = [r for r in result.rendered if r.example_id == "long"]
    assert row.full_length > plain + 5 + 20  # the system line and ### turns: ~30 tokens more than the plain text
    assert row.dropped and row.over_limit == "dropped"
    (finding,) = [f for f in result.findings if f.check == "dropped_overlong"]
    assert finding.example_ids == ["long"] and "never trained" in finding.title
    assert finding.values["tokens_over"]["long"] == row.full_length - (plain + 5)
    assert not any(f.check == "truncated_completion" for f in result.findings)
    assert all(not r.dropped for r in result.rendered if r.example_id != "long")


def test_truncate_strategy_cuts_the_tail(workspace):
    tmp_path, base, dataset, plain = workspace
    result = _diagnose(tmp_path, base, dataset, sequence_len=plain + 5, excess_length_strategy="truncate")
    (row,) = [r for r in result.rendered if r.example_id == "long"]
    assert not row.dropped and row.tail_cut and len(row.input_ids) == plain + 5
    (finding,) = [f for f in result.findings if f.check == "truncated_completion"]
    assert finding.example_ids == ["long"]
    assert not any(f.check == "dropped_overlong" for f in result.findings)


def test_raise_strategy_is_critical(workspace):
    tmp_path, base, dataset, plain = workspace
    result = _diagnose(tmp_path, base, dataset, sequence_len=plain + 5, excess_length_strategy="raise")
    (finding,) = [f for f in result.findings if f.check == "dropped_overlong"]
    assert finding.severity == "critical" and "stops preprocessing" in finding.title


def test_room_for_the_template_means_no_finding(workspace):
    tmp_path, base, dataset, plain = workspace
    result = _diagnose(tmp_path, base, dataset, sequence_len=plain + 60)
    assert not any(f.check in ("dropped_overlong", "truncated_completion") for f in result.findings)


def test_a_cut_in_a_dropped_row_is_not_named(tmp_path):
    """axolotl drops a row past `sequence_len`: a cut in its answer taught nothing, so `cut_in_data` names only the
    cut rows that were trained."""
    tokenizer = build_llama3_like()
    base = tmp_path / "base"
    tokenizer.save_pretrained(base)
    LlamaConfig(vocab_size=len(tokenizer) + 8, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2, bos_token_id=0, eos_token_id=1).save_pretrained(base)
    answer = json.dumps({"name": "customer", "city": "Oslo", "items": 3})
    cut = answer[: len(answer) // 2]
    rows = [{"id": f"s{i}", "instruction": "Extract the order.", "output": answer} for i in range(30)]
    rows += [{"id": "short-cut", "instruction": "Extract the order.", "output": cut},
             {"id": "long-cut", "instruction": "Extract the order. " * 30, "output": cut}]
    dataset = tmp_path / "train.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = _diagnose(tmp_path, base, dataset, sequence_len=120)
    assert [r.example_id for r in result.rendered if r.dropped] == ["long-cut"]
    (finding,) = [f for f in result.findings if f.check == "cut_in_data"]
    assert finding.example_ids == ["short-cut"]


def test_a_copy_of_a_dropped_row_is_not_named_a_duplicate(tmp_path):
    """Two copies of a row past `sequence_len`: axolotl drops both, so neither trained twice as often; the rows the
    run trained are checked for copies, the dropped ones are not."""
    tokenizer = build_llama3_like()
    base = tmp_path / "base"
    tokenizer.save_pretrained(base)
    LlamaConfig(vocab_size=len(tokenizer) + 8, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2, bos_token_id=0, eos_token_id=1).save_pretrained(base)
    rows = [{"id": f"s{i}", "instruction": f"Extract order {i}.", "output": json.dumps({"n": i})} for i in range(30)]
    long = {"instruction": "Extract the order. " * 30, "output": json.dumps({"n": 0})}
    rows += [{"id": "long-a", **long}, {"id": "long-b", **long}, {**rows[3], "id": "short-copy"}]
    dataset = tmp_path / "train.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = _diagnose(tmp_path, base, dataset, sequence_len=120)
    assert [r.example_id for r in result.rendered if r.dropped] == ["long-a", "long-b"]
    (finding,) = [f for f in result.findings if f.check == "duplicate"]
    assert finding.example_ids == ["short-copy"]


def test_where_axolotl_is_not_installed_the_port_renders_and_says_why(workspace):
    """axolotl's own prompt strategies render its rows where it is importable (`data.axolotl_code`); here it is not,
    so Gradian's port does, and the report's preparation says so."""
    from gradian.data.axolotl_code import installed_version
    from gradian.data.setup import preparation

    if installed_version() is not None:
        pytest.skip("axolotl is installed here: its own code renders the rows")
    tmp_path, base, dataset, plain = workspace
    result = _diagnose(tmp_path, base, dataset, sequence_len=plain + 60)
    assert result.setup.prepared_by["port_rows"] == len(result.rendered) == 31
    assert result.setup.prepared_by["trainer_rows"] == 0
    text = "rows as axolotl prepares them (Gradian's port (axolotl is not installed), axolotl version unknown)"
    assert preparation(result.setup)["text"] == text
