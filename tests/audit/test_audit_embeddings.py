"""`untrained_added_tokens` decides from the embedding rows (read by slice from safetensors), not the token list."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from conftest import make_tiny_model
from gradian.audit import AuditContext, run_checks
from gradian.audit.embedding_rows import TOLERANCE, judge
from gradian.data.base_model import BaseModelRef
from gradian.data.embeddings import REFERENCE_ROWS, Matrix, adapter_matrices, base_matrices
from gradian.data.examples import Example
from gradian.data.render import render_dataset
from gradian.data.run_folder import RunInfo
from gradian.data.setup import TrainingSetup

NEW = ["<|sep|>", "<|tool|>"]
ROWS = [{"prompt": f"my order {i} is late <|sep|> please", "completion": " refund <|tool|> help"} for i in range(6)]
ROWS += [{"prompt": "hello my account", "completion": " shipping"}]  # no added token: never named


@pytest.fixture
def tokenizer(tiny_tokenizer):
    tok = copy.deepcopy(tiny_tokenizer)
    tok.add_special_tokens({"additional_special_tokens": NEW})
    return tok


def new_ids(tokenizer) -> list[int]:
    return tokenizer.convert_tokens_to_ids(NEW)


def save_base(folder, tokenizer, model):
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def audit(tokenizer, folder, run=None) -> list:
    from transformers import AutoConfig

    train = [Example(str(i + 1), i + 1, row) for i, row in enumerate(ROWS)]
    setup = TrainingSetup()
    ctx = AuditContext(train, render_dataset(train, tokenizer, setup), tokenizer, setup, run, None,
                       BaseModelRef(str(folder), str(folder)), AutoConfig.from_pretrained(folder))
    return [f for f in run_checks(ctx, only=["untrained_added_tokens"])]


def resized(tiny_tokenizer, tokenizer, init: str):
    """The base model with the new tokens' rows as `init` leaves them (both embedding and head)."""
    model = make_tiny_model(tiny_tokenizer)
    model.resize_token_embeddings(len(tokenizer), mean_resizing=init == "mean")
    ids = new_ids(tokenizer)
    with torch.no_grad():
        for matrix in (model.get_input_embeddings().weight, model.get_output_embeddings().weight):
            if init == "zeros":
                matrix[ids] = 0.0
            elif init == "shared":
                matrix[ids] = torch.randn(matrix.shape[1])
            elif init == "trained":
                matrix[ids] = torch.randn(len(ids), matrix.shape[1]) * matrix[: ids[0]].std()
    return model


def test_pretrained_special_tokens_get_no_finding(tiny_tokenizer, tokenizer, tmp_path):
    """Tokens the base model was pretrained with (here: rows drawn like every other row) are not flagged, though
    they are added special tokens of a base model, which the token-list rule used to warn about on every row."""
    folder = save_base(tmp_path / "base", tokenizer, make_tiny_model(tokenizer))
    assert audit(tokenizer, folder) == []


def test_trained_added_rows_get_no_finding(tiny_tokenizer, tokenizer, tmp_path):
    folder = save_base(tmp_path / "base", tokenizer, resized(tiny_tokenizer, tokenizer, "trained"))
    assert audit(tokenizer, folder) == []


@pytest.mark.parametrize(("init", "reason"), [("mean", "the mean of the other rows"), ("zeros", "zeros"),
                                              ("shared", "the same vector as token")])
def test_rows_left_at_their_init_are_named(tiny_tokenizer, tokenizer, tmp_path, init, reason):
    folder = save_base(tmp_path / "base", tokenizer, resized(tiny_tokenizer, tokenizer, init))
    (finding,) = audit(tokenizer, folder)
    assert finding.values["tokens"] == NEW and finding.values["never_allocated"] == []
    assert finding.example_ids == [str(i) for i in range(1, 7)]  # the rows using them, not row 7
    seen = {(r["token"], r["row"]) for r in finding.values["untrained_rows"]}
    assert seen == {("<|sep|>", "input"), ("<|tool|>", "input"), ("<|tool|>", "output")}  # output: supervised only
    assert all(r["at"].startswith(reason) and r["read_from"] == "base model" for r in finding.values["untrained_rows"])
    assert finding.severity == "critical"  # <|tool|> is supervised with an untrained output row
    assert "trainable_token_indices=[" + ", ".join(map(str, new_ids(tokenizer))) + "]" in finding.fix


def test_untrained_input_rows_only_is_a_warning(tiny_tokenizer, tokenizer, tmp_path):
    model = resized(tiny_tokenizer, tokenizer, "trained")
    with torch.no_grad():
        model.get_input_embeddings().weight[new_ids(tokenizer)[0]] = 0.0  # <|sep|> is read, never supervised
    (finding,) = audit(tokenizer, save_base(tmp_path / "base", tokenizer, model))
    assert finding.values["tokens"] == ["<|sep|>"] and finding.severity == "warning"


def adapter_run(folder, tensors, **config) -> RunInfo:
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "adapter_model.safetensors"))
    return RunInfo(path=folder, adapter_dir=folder, adapter_config={"r": 8, "lora_alpha": 16, **config})


def test_adapter_saved_embeddings_are_judged_not_the_base(tiny_tokenizer, tokenizer, tmp_path):
    """The base has the old vocabulary; the adapter holds the resized matrices (PEFT saves them after a resize)."""
    folder = save_base(tmp_path / "base", tokenizer, make_tiny_model(tiny_tokenizer))
    untrained = resized(tiny_tokenizer, tokenizer, "mean")
    tensors = {"base_model.model.model.embed_tokens.weight": untrained.get_input_embeddings().weight.detach(),
               "base_model.model.lm_head.weight": untrained.get_output_embeddings().weight.detach()}
    (finding,) = audit(tokenizer, folder, adapter_run(tmp_path / "saved", tensors))
    assert finding.values["never_allocated"] == [] and {r["read_from"] for r in finding.values["untrained_rows"]} == \
        {"adapter"}
    trained = resized(tiny_tokenizer, tokenizer, "trained")
    tensors = {"base_model.model.model.embed_tokens.weight": trained.get_input_embeddings().weight.detach(),
               "base_model.model.lm_head.weight": trained.get_output_embeddings().weight.detach()}
    run = adapter_run(tmp_path / "trained", tensors, modules_to_save=["embed_tokens", "lm_head"])
    assert audit(tokenizer, folder, run) == []


def test_without_adapter_rows_new_ids_are_never_allocated(tiny_tokenizer, tokenizer, tmp_path):
    folder = save_base(tmp_path / "base", tokenizer, make_tiny_model(tiny_tokenizer))
    (finding,) = audit(tokenizer, folder)
    assert finding.severity == "critical" and finding.values["never_allocated"] == new_ids(tokenizer)


def test_trainable_token_rows_in_the_adapter(tiny_tokenizer, tokenizer, tmp_path):
    model = resized(tiny_tokenizer, tokenizer, "mean")
    folder = save_base(tmp_path / "base", tokenizer, model)
    ids = new_ids(tokenizer)
    key = "base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta"
    still_mean = model.get_input_embeddings().weight.detach()[ids]
    run = adapter_run(tmp_path / "untouched", {key: still_mean}, trainable_token_indices=ids)
    (finding,) = audit(tokenizer, folder, run)
    assert {(r["token"], r["read_from"]) for r in finding.values["untrained_rows"] if r["row"] == "input"} == \
        {(t, "adapter") for t in NEW}
    moved = torch.randn(len(ids), still_mean.shape[1])
    run = adapter_run(tmp_path / "moved", {key: moved}, trainable_token_indices=ids)
    (finding,) = audit(tokenizer, folder, run)  # a list trains the input rows only: the untied head is still at init
    assert [(r["token"], r["row"], r["read_from"]) for r in finding.values["untrained_rows"]] == \
        [("<|tool|>", "output", "base model")]
    run = adapter_run(tmp_path / "both", {key: moved}, trainable_token_indices={"embed_tokens": ids, "lm_head": ids})
    assert audit(tokenizer, folder, run) == []  # the head rows: trained by the config, nothing saved to judge


def test_matrices_are_found_in_shards_and_read_by_slice(tiny_tokenizer, tmp_path):
    model = make_tiny_model(tiny_tokenizer)
    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    matrices = {m.role: m for m in base_matrices(tmp_path / "sharded")}
    weight = model.get_input_embeddings().weight.detach().double().numpy()
    np.testing.assert_array_equal(matrices["input"].read([3, 0, 7]), weight[[3, 0, 7]])
    np.testing.assert_array_equal(matrices["input"].sample({1, 2}), np.delete(weight, [1, 2], axis=0))
    assert adapter_matrices(None) == [] and base_matrices(tmp_path) == []


def test_large_matrix_sample_is_bounded(tmp_path):
    weight = torch.randn(3 * REFERENCE_ROWS, 4, dtype=torch.bfloat16)
    save_file({"model.embed_tokens.weight": weight}, str(tmp_path / "model.safetensors"))
    (matrix,) = base_matrices(tmp_path)
    sample = matrix.sample(set())
    assert sample.shape == (REFERENCE_ROWS, 4) and sample.dtype == np.float64
    assert isinstance(matrix, Matrix) and matrix.rows == 3 * REFERENCE_ROWS


def test_judge_against_a_naive_loop():
    rng = np.random.default_rng(0)
    reference = rng.normal(size=(200, 16))
    mean = reference.mean(axis=0)
    spread = np.median([np.linalg.norm(r - mean) for r in reference])
    shared = rng.normal(size=16)
    rows = np.stack([np.zeros(16), mean + 1e-3, shared, shared, rng.normal(size=16), mean + 0.5 * spread / 4])
    verdicts = judge(rows, reference, [10, 11, 12, 13, 14, 15])
    assert [v[0] for v in verdicts] == ["zeros", "the mean of the other rows", "the same vector as token 13",
                                        "the same vector as token 12", None, None]
    for row, (reason, distance) in zip(rows, verdicts, strict=True):
        if reason == "zeros":
            assert distance == pytest.approx(np.sqrt(sum(x * x for x in row)) / spread) and distance <= TOLERANCE


def chat_audit(tokenizer, folder) -> list:
    from transformers import AutoConfig

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = tok.chat_template.replace("assistant: ", "<|sep|>assistant: ")
    rows = [{"messages": [{"role": "user", "content": f"my order {i} is late"},
                          {"role": "assistant", "content": "please help"}]} for i in range(4)]
    train = [Example(str(i + 1), i + 1, row) for i, row in enumerate(rows)]
    setup = TrainingSetup(assistant_only_loss=True)
    ctx = AuditContext(train, render_dataset(train, tok, setup), tok, setup, None, None,
                       BaseModelRef(str(folder), str(folder)), AutoConfig.from_pretrained(folder))
    return run_checks(ctx, only=["chat_template_on_base", "untrained_added_tokens"])


def test_chat_template_on_base_defers_to_the_rows(tiny_tokenizer, tokenizer, tmp_path):
    """Turn tokens the base was pretrained with are not 'never learned'; rows at their init are reported once."""
    assert chat_audit(tokenizer, save_base(tmp_path / "trained", tokenizer, make_tiny_model(tokenizer))) == []
    folder = save_base(tmp_path / "mean", tokenizer, resized(tiny_tokenizer, tokenizer, "mean"))
    (finding,) = chat_audit(tokenizer, folder)
    assert finding.check == "untrained_added_tokens" and finding.values["tokens"] == ["<|sep|>"]


def test_damaged_weights_are_no_evidence_and_no_traceback(tiny_tokenizer, tokenizer, tmp_path):
    folder = save_base(tmp_path / "base", tokenizer, resized(tiny_tokenizer, tokenizer, "mean"))
    (folder / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")
    assert base_matrices(folder) == []
    assert audit(tokenizer, folder) == []  # in the vocabulary, rows unreadable: nothing shown, nothing claimed
