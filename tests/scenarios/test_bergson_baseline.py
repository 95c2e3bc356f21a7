"""The bergson baseline row runs bergson's own code as the peer measured it: each row's summed-loss LoRA gradient
dotted with the mean gradient of the failing answers, checked against a float64 autograd reference. Needs bergson's
own venv (`benchmarks/harness/bergson_baseline.py` says how to make it); skipped where there is none."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model

from benchmarks.harness.bergson_baseline import bergson_scores, interpreter
from conftest import make_tiny_model
from gradian.data.render import IGNORE

pytestmark = pytest.mark.skipif(interpreter() is None, reason="bergson's venv (.venv-bergson) is not installed")


def reference(adapter, base, rows, queries) -> list[float]:
    model = PeftModel.from_pretrained(make_tiny_model(base.tokenizer), adapter, is_trainable=True).double()
    params = [p for name, p in model.named_parameters() if "lora_" in name]

    def grad(ids, labels):
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
        loss = torch.nn.functional.cross_entropy(logits, torch.tensor(labels[1:]), ignore_index=IGNORE,
                                                 reduction="sum")
        return torch.cat([g.flatten() for g in torch.autograd.grad(loss, params)])

    query = torch.stack([grad(*q) for q in queries]).mean(0)
    return [float(grad(*row) @ query) for row in rows]


def test_bergson_scores_equal_the_float64_reference(tiny_tokenizer, tmp_path):
    base = make_tiny_model(tiny_tokenizer)
    base.tokenizer = tiny_tokenizer
    base.save_pretrained(tmp_path / "base")
    tiny_tokenizer.save_pretrained(tmp_path / "base")
    torch.manual_seed(1)
    peft = get_peft_model(make_tiny_model(tiny_tokenizer), LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                                      init_lora_weights=False))
    peft.peft_config["default"].base_model_name_or_path = str(tmp_path / "base")
    peft.save_pretrained(tmp_path / "adapter")
    texts = ["my order is late please help", "refund the invoice amount", "hello", "the account was late"]
    ids = [tiny_tokenizer(text)["input_ids"] for text in texts]
    rows = [(i, [IGNORE] + i[1:]) for i in ids]
    queries = [(ids[0], [IGNORE] * 3 + ids[0][3:]), (ids[3], [IGNORE] * 2 + ids[3][2:])]
    found = bergson_scores(tmp_path / "adapter", tmp_path / "base", 256, rows, queries, tmp_path / "work")
    assert found is not None
    scores, seconds = found
    assert seconds > 0
    assert scores.tolist() == pytest.approx(reference(tmp_path / "adapter", base, rows, queries), rel=1e-4, abs=1e-6)
