"""GradianCallback's preflight on real TRL SFTTrainer runs: it stops a faulty run before step one, lets a clean one
through, and reads the trainer's own tokens (pad == eos masking, EOS after a cut, rows with no supervised token)."""

from __future__ import annotations

import pytest
import torch

from callback_runs import pretokenized, sft_trainer, tickets
from gradian import GradianCallback
from gradian.callback import PreflightError


def lora_b_is_zero(trainer) -> bool:
    """PEFT starts every lora_B at zero: still zero means no optimizer step ran."""
    weights = [p for name, p in trainer.model.named_parameters() if "lora_B" in name]
    return bool(weights) and all(torch.count_nonzero(w) == 0 for w in weights)


def test_pad_eos_run_stops_before_step_one(tmp_path):
    lines: list[str] = []
    trainer = sft_trainer(tmp_path, tickets(), pad_eos=True, callbacks=[GradianCallback(echo=lines.append)])
    with pytest.raises(PreflightError) as stopped:
        trainer.train()
    message = str(stopped.value)
    assert message.startswith("Gradian preflight stopped training before step one: pad == eos ('</s>') and the "
                              "collator masks pad ids: EOS is masked in 12 of 12 rows")
    assert "Fix: give the tokenizer a distinct pad token" in message
    assert trainer.state.global_step == 0 and lora_b_is_zero(trainer)
    assert any(line.startswith("  [critical] pad_eos_masking:") for line in lines)


def test_clean_run_trains(tmp_path):
    callback = GradianCallback(echo=lambda _: None)
    trainer = sft_trainer(tmp_path, tickets(), callbacks=[callback])
    trainer.train()
    assert trainer.state.global_step == 3 and not lora_b_is_zero(trainer)
    assert callback.result is not None and not callback.result.critical
    assert callback.result.setup.framework == "trl" and callback.result.setup.max_length == 64
    rows = callback.result.rows
    assert rows.text_rows == 12 and [e.id for e in rows.examples][:2] == ["t0", "t1"]  # TRL kept text and ids
    assert all(r.labels[-1] == 3 for r in rows.rendered)  # the collator's labels: every EOS (id 3) supervised


def test_warn_only_warns(tmp_path):
    lines: list[str] = []
    trainer = sft_trainer(tmp_path, tickets(), pad_eos=True,
                          callbacks=[GradianCallback(on_critical="warn", echo=lines.append)])
    trainer.train()
    assert trainer.state.global_step == 3
    assert any("[critical] pad_eos_masking" in line for line in lines)


def test_eos_after_cut_with_text_names_the_longest_row(tmp_path, tiny_tokenizer):
    rows = pretokenized(tickets(), tiny_tokenizer, cut=40, keep_text=True)
    callback = GradianCallback(echo=lambda _: None)
    trainer = sft_trainer(tmp_path, rows, callbacks=[callback])
    with pytest.raises(PreflightError) as stopped:
        trainer.train()
    longest = max(len(tiny_tokenizer(r["text"] + "</s>")["input_ids"]) for r in rows)
    assert longest > 40
    (cut,) = [f for f in callback.result.findings if f.check == "eos_after_cut"]
    assert cut.severity == "critical" and cut.example_ids == ["0", "3", "6", "9"]  # the long rows, none other
    assert f"raise max_length to ≥ {longest} (the longest row whole" in str(stopped.value)
    assert not [f for f in callback.result.findings if f.check == "cut_in_data"]  # explained, not counted twice


def test_eos_after_cut_without_text_says_it_cannot_tell(tmp_path, tiny_tokenizer):
    rows = pretokenized(tickets(), tiny_tokenizer, cut=40, keep_text=False)
    callback = GradianCallback(on_critical="warn", echo=lambda _: None)
    sft_trainer(tmp_path, rows, callbacks=[callback], max_steps=1).train()
    (cut,) = [f for f in callback.result.findings if f.check == "eos_after_cut"]
    assert cut.values["longest"] is None and "Gradian cannot tell how long that is" in cut.fix


def test_no_supervised_token_is_critical(tmp_path, tiny_tokenizer):
    rows = pretokenized(tickets(), tiny_tokenizer, cut=200, keep_text=False)
    for row in rows:
        row["completion_mask"] = [0] * len(row["input_ids"])  # nothing marked as answer
    callback = GradianCallback(echo=lambda _: None)
    trainer = sft_trainer(tmp_path, rows, callbacks=[callback], max_length=None, completion_only_loss=True)
    with pytest.raises(PreflightError, match="12 of 12 rows .* carry no loss at all"):
        trainer.train()
