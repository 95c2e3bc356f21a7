"""Hook gradients equal a naive per-example autograd loop (float64), for every padding and LoRA shape."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model

from conftest import make_tiny_model
from gradian.data.render import IGNORE
from gradian.gradients.batches import collate, plan_batches
from gradian.gradients.extract import GradientSettings, per_example_gradients, summed_nll
from gradian.gradients.hooks import lora_matrices

torch.set_num_threads(2)


def lora_model(tokenizer, targets, dtype=torch.float64, **config):
    model = make_tiny_model(tokenizer, seed=1, dtype=dtype)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False, lora_dropout=0.3, **config)
    return get_peft_model(model, config)


def rows(vocab: int, lengths=(7, 3, 11, 5), seed=0):
    generator = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        ids = torch.randint(4, vocab, (n,), generator=generator).tolist()
        cut = n // 3
        out.append((ids, [IGNORE] * cut + ids[cut:]))
    return out


def naive_gradients(model, data) -> torch.Tensor:
    """One unpadded forward/backward per example: the reference."""
    model.eval()
    params = [p for p in model.parameters() if p.requires_grad]
    grads = []
    for ids, labels in data:
        logits = model(input_ids=torch.tensor([ids])).logits
        loss = summed_nll(logits, torch.tensor([labels]))
        grads.append(torch.cat([g.flatten() for g in torch.autograd.grad(loss, params)]))
    return torch.stack(grads)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize(
    "targets,extra",
    [
        (["q_proj", "v_proj"], {}),
        ("all-linear", {}),
        (["q_proj", "v_proj", "down_proj"], {"rank_pattern": {"v_proj": 2, "down_proj": 6}}),
    ],
)
def test_hook_gradients_equal_naive_loop(tiny_tokenizer, side, targets, extra):
    model = lora_model(tiny_tokenizer, targets, **extra)
    data = rows(len(tiny_tokenizer))
    expected = naive_gradients(model, data)
    got = per_example_gradients(model, collate(data, tiny_tokenizer.pad_token_id, side))
    assert got.shape == expected.shape
    assert torch.allclose(got, expected, rtol=1e-9, atol=1e-11)
    assert expected.abs().sum(1).min() > 0  # every row has a gradient (lora_A included: non-zero lora_B)


@pytest.mark.parametrize("way", ["kept logits", "every logit", "model without logits_to_keep"])
def test_only_the_trained_positions_logits_are_projected_and_the_gradients_stay_exact(tiny_tokenizer, monkeypatch,
                                                                                     way):
    """The output layer projects only the positions whose next token is trained (`logits_to_keep`), all of them on
    request, and a model that does not take `logits_to_keep` has its logits sliced after: each equals the naive loop."""
    from gradian.gradients import extract

    model = lora_model(tiny_tokenizer, ["q_proj", "v_proj"])
    data = rows(len(tiny_tokenizer), lengths=(9, 6, 12), seed=5)  # prompts of 3, 2 and 4 untrained tokens
    projected = []
    head = model.get_output_embeddings()
    handle = head.register_forward_pre_hook(lambda module, inputs: projected.append(inputs[0].shape[1]))
    if way == "model without logits_to_keep":
        monkeypatch.setattr(extract, "takes_logits_to_keep", lambda model: False)
    with extract.example_gradients(model, every_logit=way == "every logit") as compute:
        got = compute(collate(data, tiny_tokenizer.pad_token_id))
    handle.remove()
    assert torch.allclose(got, naive_gradients(model, data), rtol=1e-9, atol=1e-11)
    # positions 1 to 10 predict a trained token in some row: not 0 (every prompt is longer), not 11 (nothing follows)
    assert projected == [10 if way == "kept logits" else 12]


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_padding_adds_nothing_under_each_attention(tiny_tokenizer, side, attention):
    """Padded rows give their unpadded gradients under both attention kernels, no mask in the hooks.

    The 2-token row is labelled from its first token on, so under left padding a pad would predict that token
    unless collate drops the label. Float32: transformers' eager attention turns float64 left padding into NaN.
    """
    model = lora_model(tiny_tokenizer, "all-linear", dtype=torch.float32)
    model.set_attn_implementation(attention)
    data = rows(len(tiny_tokenizer), lengths=(2, 13, 4, 9), seed=3)  # mostly padding in the short rows
    assert data[0][1][0] != IGNORE
    got = per_example_gradients(model, collate(data, tiny_tokenizer.pad_token_id, side))
    expected = naive_gradients(model, data)
    assert ((got - expected).norm(dim=1) / expected.norm(dim=1)).max() < 1e-5


def test_lora_weights_keep_requires_grad_and_model_mode(tiny_tokenizer):
    model = lora_model(tiny_tokenizer, ["q_proj"])
    model.train()
    per_example_gradients(model, collate(rows(len(tiny_tokenizer)), 0))
    assert model.training
    assert all(p.requires_grad for n, p in model.named_parameters() if "lora_" in n)
    assert all(p.grad is None for p in model.parameters())


def test_input_gradient_hook_on_the_embeddings_changes_nothing(tiny_tokenizer):
    """`enable_input_require_grads` (set for gradient checkpointing) leaves no LoRA input without a gradient."""
    model = lora_model(tiny_tokenizer, "all-linear")
    data = rows(len(tiny_tokenizer))
    expected = per_example_gradients(model, collate(data, 0))
    model.enable_input_require_grads()
    assert torch.allclose(per_example_gradients(model, collate(data, 0)), expected, rtol=1e-9, atol=1e-11)
    assert all(p.grad is None for p in model.parameters())


def test_batch_gradients_sum_to_the_batch_loss_gradient(tiny_tokenizer):
    model = lora_model(tiny_tokenizer, "all-linear")
    data = rows(len(tiny_tokenizer), lengths=(4, 9, 6))
    batch = collate(data, 0)
    params = [p for p in model.parameters() if p.requires_grad]
    model.eval()
    logits = model(**{k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")}).logits
    total = torch.cat([g.flatten() for g in torch.autograd.grad(summed_nll(logits, batch["labels"]), params)])
    assert torch.allclose(per_example_gradients(model, batch).sum(0), total, rtol=1e-9, atol=1e-11)


def test_frozen_adapter_gives_the_same_gradients(tiny_tokenizer):
    """An adapter loaded with is_trainable=False (as regression loading does) is found and left frozen."""
    model = lora_model(tiny_tokenizer, ["q_proj", "v_proj"])
    batch = collate(rows(len(tiny_tokenizer)), 0)
    trainable = per_example_gradients(model, batch)
    for param in model.parameters():
        param.requires_grad_(False)
    assert torch.equal(per_example_gradients(model, batch), trainable)
    assert not any(p.requires_grad for p in model.parameters())


def test_non_lora_trainable_parameters_are_refused(tiny_tokenizer):
    from gradian.errors import InputError

    model = lora_model(tiny_tokenizer, ["q_proj"])
    model.get_input_embeddings().weight.requires_grad_(True)
    with pytest.raises(InputError, match="not a plain LoRA matrix"):
        per_example_gradients(model, collate(rows(len(tiny_tokenizer)), 0))


def test_batches_respect_row_and_token_budgets():
    generator = torch.Generator().manual_seed(11)
    lengths = {row: int(n) for row, n in enumerate(torch.randint(1, 300, (200,), generator=generator))}
    settings = GradientSettings(batch_size=7, max_tokens=900)
    batches = plan_batches(lengths, settings)
    assert sorted(row for batch in batches for row in batch) == sorted(lengths)
    for batch in batches:
        longest = max(lengths[row] for row in batch)
        assert len(batch) <= 7 and (len(batch) == 1 or longest * len(batch) <= 900)
        assert longest == lengths[batch[0]]  # longest first: padding is planned from the first row
    assert batches == plan_batches(dict(reversed(lengths.items())), settings)  # deterministic


def test_gradient_energy_equals_per_matrix_norms_of_the_naive_loop(tiny_tokenizer):
    """Mean ‖∇Wₘ‖² per LoRA matrix over the sampled rows; dropped rows are never sampled."""
    from itertools import combinations

    from gradian.data.render import Rendered
    from gradian.gradients.energy import gradient_energy

    model = lora_model(tiny_tokenizer, "all-linear")
    data = rows(len(tiny_tokenizer), lengths=(7, 3, 11, 5, 9))
    rendered = [Rendered(str(i), ids, labels, len(ids), 0, dropped=i == 4) for i, (ids, labels) in enumerate(data)]
    sizes = [m.size for m in lora_matrices(model)]
    per_matrix = torch.stack([part.square().sum(1) for part in naive_gradients(model, data[:4]).split(sizes, dim=1)],
                             dim=1)  # (4 rows, matrices)
    energy, kept = gradient_energy(model, rendered, GradientSettings(batch_size=3), keep_bytes=1 << 30)
    assert torch.allclose(torch.tensor(energy, dtype=torch.float64), per_matrix.mean(0), rtol=1e-9, atol=0)
    assert sorted(kept.rows) == [0, 1, 2, 3]  # the exact gradients come back, row by row
    assert torch.allclose(torch.cat(kept.batches), naive_gradients(model, data[:4])[kept.rows], rtol=1e-9, atol=1e-11)
    row_bytes = sum(sizes) * 8
    _, kept = gradient_energy(model, rendered, GradientSettings(batch_size=3), keep_bytes=3 * row_bytes)
    assert len(kept.rows) == 3  # the first batch (3 rows) fits, the second would not
    assert len(gradient_energy(model, rendered, GradientSettings(batch_size=3), keep_bytes=2 * row_bytes)[1].rows) == 1
    assert gradient_energy(model, rendered, GradientSettings(batch_size=3), keep_bytes=row_bytes - 1)[1] is None
    sampled = torch.tensor(gradient_energy(model, rendered, GradientSettings(), max_rows=2)[0], dtype=torch.float64)
    assert any(torch.allclose(sampled, per_matrix[list(pair)].mean(0), rtol=1e-9, atol=0)
               for pair in combinations(range(4), 2))


def test_budget_shares_are_kept_for_a_rerun_and_redone_for_another_adapter(tiny_tokenizer, tmp_path, monkeypatch):
    """A rerun must reuse the shares it stored: recomputed ones may differ in the last bit and void the features."""
    from gradian.data.render import Rendered
    from gradian.gradients import energy

    model = lora_model(tiny_tokenizer, "all-linear")
    rendered = [Rendered(str(i), ids, labels, len(ids), 0) for i, (ids, labels) in enumerate(
        rows(len(tiny_tokenizer)))]
    settings, cache = GradientSettings(proj_dim=64), tmp_path / "projection-shares.json"
    first, sampled = energy.share_budget(model, rendered, settings, "energy", cache=cache)
    assert first.budget_weights is not None and cache.exists() and sampled is not None
    assert energy.share_budget(model, rendered, settings, "size", cache=cache) == (
        dataclasses.replace(settings, budget_weights=None), None)
    computed = []
    ones = (1.0,) * len(first.budget_weights)
    monkeypatch.setattr(energy, "gradient_energy", lambda *a, **k: computed.append(1) or (ones, None))
    assert energy.share_budget(model, rendered, settings, "energy", cache=cache) == (first, None) and not computed
    with torch.no_grad():
        next(p for n, p in model.named_parameters() if "lora_B" in n).add_(0.5)  # another adapter
    assert energy.share_budget(model, rendered, settings, "energy", cache=cache)[0].budget_weights == ones
    assert computed == [1]
    cache.write_text("{not json")  # a damaged file is recomputed, not an error
    assert energy.share_budget(model, rendered, settings, "energy", cache=cache)[0].budget_weights is not None
    assert computed == [1, 1]


def test_extraction_projects_the_energy_pass_gradients_instead_of_computing_them_again(tiny_tokenizer, tmp_path,
                                                                                        monkeypatch):
    """Features of the sampled rows equal extraction's own (float64), and those rows are not backpropagated twice."""
    from gradian.data.render import Rendered
    from gradian.gradients import energy, extract

    model = lora_model(tiny_tokenizer, "all-linear")
    rendered = [Rendered(str(i), ids, labels, len(ids), 0) for i, (ids, labels) in enumerate(
        rows(len(tiny_tokenizer), lengths=(7, 3, 11, 5, 9, 4, 6)))]
    settings = GradientSettings(proj_dim=64, batch_size=2, store_dtype="float32")
    settings, sampled = energy.share_budget(model, rendered, settings, "energy")
    expected = np.asarray(extract.extract_train_features(model, rendered, tmp_path / "cold", settings=settings))
    backpropagated, real = [], extract.lora_backward

    def counted(model, batch, roots, **kwargs):
        backpropagated.append(len(batch["input_ids"]))
        return real(model, batch, roots, **kwargs)

    monkeypatch.setattr(extract, "lora_backward", counted)
    sampled.rows, sampled.batches = sampled.rows[:4], [torch.cat(sampled.batches)[:4]]  # as when 4 rows fit
    sampled.key = extract.SampledGradients.key_of(model, rendered, sampled.rows, None)
    warm = np.asarray(extract.extract_train_features(model, rendered, tmp_path / "warm", settings=settings,
                                                     sampled=sampled))
    assert np.allclose(warm, expected, rtol=1e-6, atol=1e-9) and sum(backpropagated) == len(rendered) - 4
    with pytest.raises(ValueError, match="another adapter"):
        extract.extract_train_features(model, rendered, tmp_path / "scaled", settings=settings, sampled=sampled,
                                       scale=extract.ParameterScale("adam:x", [torch.ones(m.shape) for m in
                                                                               lora_matrices(model)]))
