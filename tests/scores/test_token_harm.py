"""Per-token harm: the central difference equals one backward pass per token in float64, and adds up to the row's
effect; per-position harm equals the derivative of the row's loss along v injected at that position alone; the harm
token of a cut row is where the planted cause sits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model

from conftest import make_tiny_model
from gradian.data.render import IGNORE, Rendered
from gradian.gradients.batches import collate
from gradian.gradients.extract import summed_nll
from gradian.gradients.hooks import lora_matrices
from gradian.scores.queries import QueryPair
from gradian.scores.query import query_direction
from gradian.scores.token_harm import harm_token, position_harms, row_harms, token_harms
from report_numbers import NUMBER, json_leaves, renderings

PAIRS = [QueryPair("a", [5, 6, 7], [8, 9, 10, 2], [8, 9, 12, 2]), QueryPair("b", [6, 5], [9, 8, 2], [11, 2])]
ROWS = [Rendered("t0", [5, 6, 7, 8, 9, 10, 2], [IGNORE] * 3 + [8, 9, 10, 2], 7, 3),
        Rendered("t1", [6, 5, 9, 11, 2], [IGNORE, IGNORE, 9, 11, 2], 5, 2),
        Rendered("t2", [7, 7, 7, 8, 2, 3], [IGNORE, IGNORE, 7, 8, 2, IGNORE], 6, 2)]


@pytest.fixture
def model(tiny_tokenizer):
    base = make_tiny_model(tiny_tokenizer, seed=3, dtype=torch.float64)
    return get_peft_model(base, LoraConfig(r=2, target_modules="all-linear", init_lora_weights=False)).eval()


def naive_harms(model, row: Rendered, direction: list[torch.Tensor]) -> np.ndarray:
    """One backward pass per supervised token: vᵀ ∇ℓ_t."""
    weights = [m.module.weight for m in lora_matrices(model)]
    batch = collate([(row.input_ids, row.labels)], 0)
    harms = []
    for t in range(1, len(row.labels)):
        if batch["labels"][0, t] == IGNORE:
            continue
        only = torch.full_like(batch["labels"], IGNORE)
        only[0, t] = batch["labels"][0, t]
        for w in weights:
            w.requires_grad_(True)
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits
        grads = torch.autograd.grad(summed_nll(logits, only), weights)
        harms.append(float(sum((g * d).sum() for g, d in zip(grads, direction, strict=True))))
    return np.array(harms)


def recording(seen: list):
    """A progress bar that keeps what it was given."""
    def bar(items, label):
        for item in items:
            seen.append(item)
            yield item
    return bar


@pytest.mark.parametrize("kind", ["naive", "contrastive"])
def test_central_difference_equals_a_backward_pass_per_token(model, kind):
    direction = query_direction(model, PAIRS, kind)
    before = [m.module.weight.detach().clone() for m in lora_matrices(model)]
    got = token_harms(model, ROWS, direction, batch_size=2)
    for w, b in zip([m.module.weight for m in lora_matrices(model)], before, strict=True):
        assert torch.equal(w, b)  # the adapter is left as it was
    for row, harms in zip(ROWS, got, strict=True):
        expected = naive_harms(model, row, direction)
        assert harms.shape == expected.shape == (sum(label != IGNORE for label in row.labels[1:]),)
        np.testing.assert_allclose(harms, expected, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("batch_size", [1, 2, 16])
def test_a_rows_harm_is_its_harmful_tokens_alone(model, batch_size):
    """row_harms = Σ_t max(0, vᵀ∇ℓ_t), against one backward pass per token; the progress bar sees every batch."""
    direction = query_direction(model, PAIRS, "naive")
    seen: list = []
    bar = recording(seen)

    got = row_harms(model, ROWS, direction, batch_size=batch_size, bar=bar)
    expected = np.array([np.clip(naive_harms(model, row, direction), 0.0, None).sum() for row in ROWS])
    assert got.shape == (len(ROWS),) and (got >= 0).all()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-8)
    assert len(seen) == -(-len(ROWS) // batch_size)


def naive_position_harms(model, row: Rendered, direction: list[torch.Tensor]) -> np.ndarray:
    """Per position s, d/dε of the row's summed loss with ε·V x_s added to every LoRA matrix's output at s alone."""
    matrices = lora_matrices(model)
    batch = collate([(row.input_ids, row.labels)], 0)
    harms = []
    for s in range(len(row.input_ids)):
        eps = torch.zeros((), dtype=torch.float64, requires_grad=True)

        def nudge(index, s=s, eps=eps):
            def hook(module, inputs, output):
                mask = torch.zeros_like(output)
                mask[:, s] = 1.0
                return output + eps * mask * (inputs[0] @ direction[index].T)
            return hook

        handles = [m.module.register_forward_hook(nudge(i)) for i, m in enumerate(matrices)]
        try:
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                           position_ids=batch["position_ids"]).logits
            harms.append(float(torch.autograd.grad(summed_nll(logits, batch["labels"]), eps)[0]))
        finally:
            for handle in handles:
                handle.remove()
    return np.array(harms)


@pytest.mark.parametrize("batch_size", [1, 2, 16])
def test_a_rows_harm_is_its_harmful_positions_alone(model, batch_size):
    """position_harms = Σ_s max(0, h_s), each h_s against its own derivative in float64; the h_s add up to vᵀ∇L."""
    direction = query_direction(model, PAIRS, "contrastive")
    weights = [m.module.weight for m in lora_matrices(model)]
    before = [(w.detach().clone(), w.requires_grad) for w in weights]
    seen: list = []
    bar = recording(seen)

    got = position_harms(model, ROWS, direction, batch_size=batch_size, bar=bar)
    for w, (value, flag) in zip(weights, before, strict=True):
        assert torch.equal(w, value) and w.requires_grad == flag and w.grad is None  # the adapter is left as it was
    parts = [naive_position_harms(model, row, direction) for row in ROWS]
    np.testing.assert_allclose(got, [np.clip(h, 0.0, None).sum() for h in parts], rtol=1e-7, atol=1e-10)
    assert any((h < 0).any() and (h > 0).any() for h in parts)  # parts differ in sign within a row: the clip matters
    np.testing.assert_allclose([h.sum() for h in parts], [naive_harms(model, row, direction).sum() for row in ROWS],
                               rtol=1e-5, atol=1e-8)  # positions and tokens split the same vᵀ∇L
    assert len(seen) == -(-len(ROWS) // batch_size)


def test_the_direction_is_the_sum_of_unit_query_gradients(model):
    one = query_direction(model, PAIRS[:1], "naive")
    assert torch.sqrt(sum((d ** 2).sum() for d in one)) == pytest.approx(1.0)
    both = query_direction(model, PAIRS, "naive")
    other = query_direction(model, PAIRS[1:], "naive")
    for b, o, t in zip(both, one, other, strict=True):
        torch.testing.assert_close(b, o + t)


def test_harm_token_names_the_largest_token_and_its_share(tiny_tokenizer):
    row = ROWS[0]
    found = harm_token(tiny_tokenizer, row, np.array([0.1, -0.5, 0.3, 0.6]))
    assert found == {"position": 4, "of": 4, "token": tiny_tokenizer.decode([2]), "share": pytest.approx(0.6)}
    assert harm_token(tiny_tokenizer, row, np.array([-0.1, -0.2, 0.0, -1.0])) is None  # it only helps


@pytest.mark.slow
@pytest.mark.parametrize("name,where", [("truncated-cluster", "last"), ("kitchen-fence-spaced", "first")])
def test_the_report_names_the_token_where_a_planted_row_does_its_harm(scenario, attributed, name, where):
    """A cut row harms at its early EOS (its last supervised token); a fenced row at the opening fence, its first
    tokens as the scenario's tokenizer splits "```json": the backticks, or the `json` tag after them (on one processor
    3 of 50 top rows peaked at the tag)."""
    import json

    from gradian.data.base_model import load_tokenizer, resolve_base_model

    truth = json.loads((scenario(name, 0) / "truth.json").read_text())
    out = attributed(name)
    report = json.loads((out / "report.json").read_text())
    planted = [row for row in report["top_rows"] if row["id"] in set(truth["culprit_ids"])]
    assert len(planted) >= 20, len(report["top_rows"])
    tokenizer = load_tokenizer(resolve_base_model(scenario(name, 0) / "base"))
    fence = [tokenizer.decode([i]).strip() for i in tokenizer("```json", add_special_tokens=False)["input_ids"]]

    def at_the_cause(token: dict) -> bool:  # the last supervised token; or one of the opening fence's, in its place
        if where == "last":
            return token["position"] == token["of"]
        return token["position"] <= len(fence) and token["token"].strip() == fence[token["position"] - 1]

    at = [at_the_cause(row["harm_token"]) for row in planted if row["harm_token"]]
    assert len(at) == len(planted) and sum(at) >= 0.9 * len(at), [row["harm_token"] for row in planted]
    if where == "first":
        assert all(row["harm_token"]["token"].strip() == fence[0] for row in planted if row["harm_token"]["position"] == 1)
    markdown = (out / "report.md").read_text()
    assert markdown.count("harm at token") == 1
    allowed = set().union(*(renderings(v) for v in json_leaves(report)))
    assert [token for token in NUMBER.findall(markdown) if token not in allowed] == []  # every number is in json
