"""Every check fires on a fixture built with its fault and stays silent on a clean one."""

from __future__ import annotations

import copy
import json
import math

import pytest

from audit_rows import base_config, clean_rows, examples
from gradian import check, unregister_check
from gradian.audit import AuditContext, Finding, run_checks
from gradian.audit.registry import load_built_in
from gradian.data.base_model import BaseModelRef
from gradian.data.render import render_dataset
from gradian.data.run_folder import RunInfo
from gradian.data.setup import TrainingSetup


def context(tokenizer, rows=None, setup=None, run=None, eval_rows=None, config=None) -> AuditContext:
    rows = clean_rows() if rows is None else rows
    setup = setup or TrainingSetup()
    train = examples(rows)
    return AuditContext(train, render_dataset(train, tokenizer, setup), tokenizer, setup, run,
                        examples(eval_rows) if eval_rows else None, BaseModelRef("tiny/base", "tiny/base"),
                        config or base_config(tokenizer))


def run_info(log_history=None, adapter_config=None, epochs=1.0) -> RunInfo:
    state = {"num_train_epochs": epochs, "log_history": log_history or []}
    adapter = {"base_model_name_or_path": "tiny/base", "r": 8, "lora_alpha": 16}
    adapter.update(adapter_config or {})
    return RunInfo(path=None, adapter_config=adapter, trainer_state=state, log_history=state["log_history"])


def healthy_log(steps: int = 20) -> list[dict]:
    log = [{"loss": 2.0 - 0.05 * s, "grad_norm": 1.0, "learning_rate": 2e-4, "step": s} for s in range(1, steps + 1)]
    log += [{"eval_loss": 1.5 - 0.1 * k, "step": 5 * k} for k in range(1, 4)]
    return log


def fired(findings: list[Finding], name: str) -> Finding:
    matching = [f for f in findings if f.check == name]
    assert len(matching) == 1, [f.check for f in findings]
    return matching[0]


def test_clean_fixture_is_silent(tiny_tokenizer):
    eval_rows = [{"prompt": "my order 9 is late please help hello", "completion": " x"}]
    ctx = context(tiny_tokenizer, run=run_info(healthy_log()), eval_rows=eval_rows)
    assert run_checks(ctx) == []


def test_every_built_in_check_is_registered():
    names = set(load_built_in())
    assert {"truncation", "cut_in_data", "missing_eos", "pad_eos_masking", "prompt_loss", "no_loss", "duplicate",
            "near_duplicate", "train_eval_overlap", "many_epochs", "eval_loss_rising", "loss_spike", "nan_in_logs",
            "chat_template_on_base", "double_bos", "untrained_added_tokens", "learning_rate", "lora_alpha_rank",
            "adapter_base_mismatch", "packing_split", "weight_ignored"} <= names


def test_truncated_completion_names_rows_and_p99(tiny_tokenizer):
    rows = clean_rows()
    rows[4]["completion"] += " please help" * 20  # row 5 is far longer than the rest
    ctx = context(tiny_tokenizer, rows, TrainingSetup(max_length=40))
    finding = fired(run_checks(ctx), "truncated_completion")
    lengths = sorted(r.full_length for r in ctx.rendered)
    assert finding.example_ids == [r.example_id for r in ctx.rendered if r.full_length > 40]
    assert "5" in finding.example_ids and finding.values["longest"] == lengths[-1]
    # the fix is the smallest value that cuts no row as trained (the p99 would still cut row 5), and verify uses it
    assert finding.fix.startswith(f"raise max_length to ≥ {lengths[-1]} (the longest row as trained")
    assert finding.values["fix_settings"] == {"max_length": lengths[-1]} and finding.values["p99_length"] > 40
    assert finding.values["setting_fix"] in finding.fix


def test_cut_in_data_flags_exactly_the_cut_json_rows(tiny_tokenizer):
    rows = clean_rows()
    cut = {3, 6, 9}  # invoice rows: their completion stops mid-object, then EOS
    for i in cut:
        rows[i - 1]["completion"] = rows[i - 1]["completion"].split(", ")[0] + ", " + "</s>"
    ctx = context(tiny_tokenizer, rows)
    finding = fired(run_checks(ctx, only=["cut_in_data"]), "cut_in_data")
    assert finding.example_ids == [str(i) for i in sorted(cut)]
    assert finding.severity == "critical"


def test_cut_in_data_reads_every_trained_answer_not_only_the_last(tiny_tokenizer):
    """Cuts in an earlier assistant turn, in a text row's answer, and in the last turn are all found (the check read
    only the last assistant turn and no text row); a cut prompt is not an answer and is not flagged."""
    whole, cut = '{"name": "refund", "id": 1}', '{"name": "refund", "id'

    def chat(first: str, last: str) -> dict:
        return {"messages": [{"role": "user", "content": "please json for my order"},
                             {"role": "assistant", "content": first},
                             {"role": "user", "content": "and my invoice"},
                             {"role": "assistant", "content": last}]}

    rows = [chat(whole, whole), chat(cut, whole), chat(whole, cut), chat(whole, whole)]
    text_rows = [{"text": f"please json for my order {i}: " + (cut if i == 1 else whole)} for i in range(3)]
    finding = fired(run_checks(context(tiny_tokenizer, rows), only=["cut_in_data"]), "cut_in_data")
    assert finding.example_ids == ["2", "3"]
    assert finding.values["reasons"]["2"].startswith("assistant turn 1 of 2: ")
    # the length limit also cuts row 3 inside its (already cut) last turn: the turn it trained is still read
    limit = context(tiny_tokenizer, rows).rendered[2].full_length - 3
    cut_short = context(tiny_tokenizer, rows, TrainingSetup(max_length=limit))
    assert cut_short.rendered[2].truncated_tokens == 3
    assert fired(run_checks(cut_short, only=["cut_in_data"]), "cut_in_data").example_ids == ["2", "3"]
    finding = fired(run_checks(context(tiny_tokenizer, text_rows), only=["cut_in_data"]), "cut_in_data")
    assert finding.example_ids == ["2"]


def test_cut_in_data_flags_rows_far_shorter_than_their_cluster(tiny_tokenizer):
    rows = [{"prompt": f"hello my account {i} please", "completion": " the account was late for the order and the "
             "refund is please help."} for i in range(8)]
    rows += [{"prompt": f"hello my order {i} please", "completion": " shipping."} for i in range(8)]
    rows[2]["completion"] = " the account was"
    finding = fired(run_checks(context(tiny_tokenizer, rows), only=["cut_in_data"]), "cut_in_data")
    assert finding.example_ids == ["3"]


def test_missing_eos_when_the_template_never_emits_it(tiny_tokenizer):
    template = tiny_tokenizer.chat_template.replace("{{ eos_token }}", "")
    rows = [{"messages": [{"role": "user", "content": "my order is late"},
                          {"role": "assistant", "content": "please help"}]} for _ in range(3)]
    ctx = context(tiny_tokenizer, rows, TrainingSetup(chat_template=template, assistant_only_loss=True))
    finding = fired(run_checks(ctx, only=["missing_eos"]), "missing_eos")
    assert finding.example_ids == ["1", "2", "3"] and finding.severity == "critical"
    for setup in (TrainingSetup(assistant_only_loss=True), TrainingSetup()):  # "\n" follows EOS in the template
        assert run_checks(context(tiny_tokenizer, rows, setup), only=["missing_eos"]) == []


def test_missing_eos_when_the_config_replaces_eos(tiny_tokenizer):
    tok = copy.deepcopy(tiny_tokenizer)
    tok.eos_token = "\n"  # what SFTTrainer does with SFTConfig(eos_token="\n")
    ctx = context(tok, setup=TrainingSetup(eos_token="\n"), config=base_config(tiny_tokenizer))
    finding = fired(run_checks(ctx), "missing_eos")
    assert finding.severity == "critical" and len(finding.example_ids) == 30
    assert "SFTConfig(eos_token='</s>')" in finding.fix
    assert all(r.last_supervised() == tok.convert_tokens_to_ids("\n") for r in ctx.rendered)


@pytest.mark.parametrize(("masks", "severity"), [(True, "critical"), (None, "warning")])
def test_pad_eos_masking(tiny_tokenizer, masks, severity):
    setup = TrainingSetup(pad_token=tiny_tokenizer.eos_token, collator_masks_pad=masks)
    findings = run_checks(context(tiny_tokenizer, setup=setup))
    finding = fired(findings, "pad_eos_masking")
    assert finding.severity == severity
    assert len(finding.example_ids) == (30 if masks else 0)
    assert not [f for f in findings if f.check == "missing_eos"]  # the masked EOS is this finding, not that one


def test_pad_eos_silent_when_collator_pads_by_position(tiny_tokenizer):
    setup = TrainingSetup(pad_token=tiny_tokenizer.eos_token, collator_masks_pad=False)
    assert run_checks(context(tiny_tokenizer, setup=setup)) == []


def test_prompt_loss(tiny_tokenizer):
    finding = fired(run_checks(context(tiny_tokenizer, setup=TrainingSetup(completion_only_loss=False))), "prompt_loss")
    assert len(finding.example_ids) == 30 and finding.severity == "critical"
    assert "completion_only_loss=True" in finding.fix


def test_no_loss_when_prompt_fills_max_length(tiny_tokenizer):
    rows = clean_rows()
    rows[0]["prompt"] = "hello " * 40
    finding = fired(run_checks(context(tiny_tokenizer, rows, TrainingSetup(max_length=60))), "no_loss")
    assert finding.example_ids == ["1"] and finding.values["by_truncation"] == 1


def test_exact_and_near_duplicates(tiny_tokenizer):
    rows = clean_rows()
    long = {"prompt": "hello my account is late please help i need a refund for the order", "completion":
            " the refund amount for the order is in the invoice and the currency is the account currency"}
    near = dict(long, completion=long["completion"] + " please")
    rows += [dict(rows[0]), long, near]
    findings = run_checks(context(tiny_tokenizer, rows))
    assert fired(findings, "duplicate").example_ids == ["31"]
    assert fired(findings, "near_duplicate").example_ids == ["33"]


def test_train_eval_overlap(tiny_tokenizer):
    rows = clean_rows()
    eval_rows = [{"prompt": rows[7]["prompt"].upper()}, {"prompt": "nothing like train"}]
    eval_rows.append(dict(rows[11]))  # a row copied whole
    finding = fired(run_checks(context(tiny_tokenizer, rows, eval_rows=eval_rows)), "train_eval_overlap")
    assert finding.example_ids == ["8", "12"] and finding.values["eval_ids"] == ["1", "3"]
    assert finding.values["same_answer_ids"] == ["12"]


def test_many_epochs(tiny_tokenizer):
    finding = fired(run_checks(context(tiny_tokenizer, run=run_info(healthy_log(), epochs=12))), "many_epochs")
    assert finding.severity == "warning" and finding.values["epochs"] == 12  # eval loss fell: a risk, not a fault


def test_eval_loss_rising(tiny_tokenizer):
    log = healthy_log() + [{"eval_loss": 1.6, "step": 20}]
    finding = fired(run_checks(context(tiny_tokenizer, run=run_info(log))), "eval_loss_rising")
    assert finding.values["best_step"] == 15 and "checkpoint-15" in finding.fix


def test_loss_spike_and_nan(tiny_tokenizer):
    log = healthy_log()
    log[12]["loss"] = 30.0
    log[15]["grad_norm"] = math.nan
    log = json.loads(json.dumps(log))  # NaN survives a trainer_state.json round trip
    findings = run_checks(context(tiny_tokenizer, run=run_info(log)))
    assert fired(findings, "loss_spike").values["spikes"][0]["step"] == 13
    assert fired(findings, "nan_in_logs").severity == "critical"


def test_chat_template_on_base_and_untrained_added_tokens(tiny_tokenizer):
    tok = copy.deepcopy(tiny_tokenizer)  # keep the session tokenizer untouched
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = tok.chat_template.replace("assistant: ", "<|im_start|>assistant: ")
    chat = [{"messages": [{"role": "user", "content": "my order is late"},
                          {"role": "assistant", "content": "please help"}]}]
    finding = fired(run_checks(context(tok, chat, config=base_config(tiny_tokenizer))), "chat_template_on_base")
    assert finding.example_ids == ["1"] and "<|im_start|>" in finding.values["tokens"]
    plain = [{"prompt": "my order <|im_end|>", "completion": " please"}]
    finding = fired(run_checks(context(tok, plain, config=base_config(tiny_tokenizer))), "untrained_added_tokens")
    assert finding.severity == "critical" and finding.example_ids == ["1"]
    trained = run_info(adapter_config={"modules_to_save": ["embed_tokens", "lm_head"]})
    assert not run_checks(context(tok, plain, run=trained, config=base_config(tiny_tokenizer)),
                         only=["untrained_added_tokens"])


def test_double_bos(tiny_tokenizer):
    rows = clean_rows()
    rows[1]["prompt"] = "<s>" + rows[1]["prompt"]
    assert fired(run_checks(context(tiny_tokenizer, rows)), "double_bos").example_ids == ["2"]


@pytest.mark.parametrize(("lr", "severity"), [(2e-2, "critical"), (2e-3, "warning"), (1e-7, "warning")])
def test_learning_rate(tiny_tokenizer, lr, severity):
    wide = base_config(tiny_tokenizer, hidden_size=2048)
    ctx = context(tiny_tokenizer, setup=TrainingSetup(learning_rate=lr), config=wide)
    assert fired(run_checks(ctx), "learning_rate").severity == severity


def test_learning_rate_range_scales_with_width(tiny_tokenizer):
    narrow = base_config(tiny_tokenizer, hidden_size=64)  # 16x narrower than 1024: 16x the rate is fine
    assert not run_checks(context(tiny_tokenizer, setup=TrainingSetup(learning_rate=3e-3), config=narrow),
                         only=["learning_rate"])


def test_lora_alpha_rank(tiny_tokenizer):
    run = run_info(healthy_log(), adapter_config={"r": 8, "lora_alpha": 256})
    finding = fired(run_checks(context(tiny_tokenizer, run=run)), "lora_alpha_rank")
    assert finding.values["scale"] == 32 and "lora_alpha=16" in finding.fix


def test_adapter_base_mismatch(tiny_tokenizer):
    run = run_info(healthy_log(), adapter_config={"base_model_name_or_path": "org/other-model"})
    finding = fired(run_checks(context(tiny_tokenizer, run=run)), "adapter_base_mismatch")
    assert "org/other-model" in finding.fix


def test_a_registered_plugin_check_runs(tiny_tokenizer):
    @check("test_plugin", category="per-row")
    def plugin(ctx):
        return [Finding("test_plugin", "info", "seen", "nothing", [ctx.examples[0].id])]

    try:
        finding = fired(run_checks(context(tiny_tokenizer)), "test_plugin")
        assert finding.example_ids == ["1"] and finding.category == "per-row"
    finally:
        unregister_check("test_plugin")
    assert "test_plugin" not in load_built_in()
    assert not any(f.check == "test_plugin" for f in run_checks(context(tiny_tokenizer)))
    with pytest.raises(ValueError, match="no check is registered as 'test_plugin'"):
        unregister_check("test_plugin")


def test_vectorised_shingles_equal_a_naive_loop():
    from gradian.audit.duplicates import row_shingles, shingle_hashes

    rows = [[], [5], [1, 2, 3], [1, 2, 3, 4], list(range(10)), [7, 7, 7, 7, 7]]
    grams = shingle_hashes(rows, width=4)
    for index, tokens in enumerate(rows):
        padded = (tokens or [2**62]) + [2**62] * 3
        naive = set()
        for start in range(max(len(tokens), 1)):
            value = 0
            for token in padded[start:start + 4]:
                value = (value * 1_000_003 + token) % 2**64
            naive.add(value)
        assert row_shingles(grams, index) == naive


def test_keep_end_cut_rows_do_not_train_their_prompt(tiny_tokenizer):
    """keep_end cuts a row's start: the kept row's prompt span is shorter by the cut, and its labels there stay
    masked (TRL's completion mask), so no prompt_loss; the cut rows are still reported as truncated."""
    rows = clean_rows()
    for row in rows[:5]:
        row["prompt"] = "hello " * 30 + row["prompt"]
    longest_clean = max(r.full_length for r in render_dataset(examples(clean_rows()), tiny_tokenizer, TrainingSetup()))
    setup = TrainingSetup(max_length=longest_clean, truncation_mode="keep_end")
    findings = run_checks(context(tiny_tokenizer, rows, setup))
    assert not [f for f in findings if f.check == "prompt_loss"], [f.title for f in findings]
    assert fired(findings, "truncated_completion").example_ids == ["1", "2", "3", "4", "5"]


def test_wrapped_packing_names_the_rows_a_block_cuts(tiny_tokenizer):
    """packing_strategy='wrapped': the rows laid end to end, cut every max_length tokens; exactly the rows a cut falls
    inside are named (a naive reference over the rows' lengths), with bfd as the fix."""
    setup = TrainingSetup(packing=True, packing_strategy="wrapped", max_length=50)
    ctx = context(tiny_tokenizer, setup=setup)
    lengths = [len(r.input_ids) for r in ctx.rendered]
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    expected = [r.example_id for r, a, n in zip(ctx.rendered, starts, lengths, strict=True) if a // 50 != (a + n - 1) // 50]
    finding = fired(run_checks(ctx), "packing_split")
    assert expected and finding.example_ids == expected
    assert finding.values["fix_settings"] == {"packing_strategy": "bfd"} and "packing_strategy='bfd'" in finding.fix
    bfd = run_checks(context(tiny_tokenizer, setup=TrainingSetup(packing=True, max_length=50)))
    assert not [f for f in bfd if f.check == "packing_split"]
