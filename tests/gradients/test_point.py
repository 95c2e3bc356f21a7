"""The point along the adapter the gradients are read at: B × s inside the block, the weights back exactly after,
against a naive float64 model whose B matrices were multiplied by hand."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from peft import LoraConfig, get_peft_model

from conftest import make_tiny_model
from gradian.gradients.point import adapter_point, gradient_point


@pytest.fixture
def model(tiny_tokenizer):
    base = make_tiny_model(tiny_tokenizer, seed=1, dtype=torch.float64)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    return get_peft_model(base, config).eval()


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits


def test_b_scaled_inside_the_block_and_restored_bit_for_bit(model):
    ids = [5, 9, 14, 3, 22, 7]
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    by_hand = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in by_hand.named_parameters():
            if ".lora_B." in name:
                p.mul_(0.75)
    fine_tuned = logits(model, ids)
    with adapter_point(model, 0.75):
        assert torch.allclose(logits(model, ids), logits(by_hand, ids), rtol=0, atol=1e-12)
        assert not torch.allclose(logits(model, ids), fine_tuned)
        assert all(torch.equal(p, before[name]) for name, p in model.named_parameters() if ".lora_B." not in name)
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())
    with pytest.raises(RuntimeError), adapter_point(model, 0.0):
        raise RuntimeError("a stage failed inside")
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())


def test_the_point_applies_to_the_final_adapter_alone():
    settings = SimpleNamespace(adapter_scale=0.75, checkpoints="off", rank="gradient")
    assert gradient_point(settings, []) == 0.75
    assert gradient_point(settings, ["checkpoint-2"]) == 1.0  # TracIn-CP: the checkpoints are the points
    assert gradient_point(SimpleNamespace(**{**vars(settings), "checkpoints": "captured"}), []) == 1.0
    assert gradient_point(SimpleNamespace(**{**vars(settings), "rank": "activation"}), []) == 1.0
