"""Query gradients equal ∇ of the margin toward the correct answer, computed naively in float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model

from conftest import make_tiny_model
from gradian.gradients.extract import GradientSettings, make_projector
from gradian.scores.queries import QueryPair, first_divergence, query_features
from gradian.scores.query import query_gradients

torch.set_num_threads(2)

EXACT = GradientSettings(proj_dim=None)


@pytest.fixture
def model(tiny_tokenizer):
    base = make_tiny_model(tiny_tokenizer, seed=6, dtype=torch.float64)
    return get_peft_model(base, LoraConfig(r=2, target_modules="all-linear", init_lora_weights=False))


PAIRS = [
    QueryPair("a", [5, 6, 7], [8, 9, 10, 11, 2], [8, 9, 12, 2]),
    QueryPair("b", [6, 5], [9, 8, 2], [9, 8, 10, 10, 2]),
    QueryPair("c", [7], [4, 5, 2], [11, 2]),
]


def log_prob(model, prompt, answer, only=None):
    """log p(answer | prompt), or of answer token `only` alone."""
    ids = torch.tensor([prompt + answer])
    logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1], dim=-1)
    picked = logp[torch.arange(len(prompt) - 1, ids.shape[1] - 1), torch.tensor(answer)]
    return picked.sum() if only is None else picked[only]


def reference(model, pair, kind):
    q = margin_gradient(model, pair, kind)
    return q / np.linalg.norm(q)


def margin_gradient(model, pair, kind):
    """q = ∇θ f, the LoRA weights' gradients flat in the model's parameter order."""
    model.eval()
    params = [p for p in model.parameters() if p.requires_grad]
    if kind == "naive":
        f = log_prob(model, pair.prompt_ids, pair.positive_ids)
    elif kind == "contrastive":
        f = log_prob(model, pair.prompt_ids, pair.positive_ids) - log_prob(model, pair.prompt_ids, pair.negative_ids)
    else:
        j = first_divergence(pair.positive_ids, pair.negative_ids)
        f = log_prob(model, pair.prompt_ids, pair.positive_ids, j) - log_prob(
            model, pair.prompt_ids, pair.negative_ids, j
        )
    return torch.cat([g.flatten() for g in torch.autograd.grad(f, params)]).numpy()


@pytest.mark.parametrize("batch_size", [1, 3, 16])  # 3 splits a pair's two rows over two batches
@pytest.mark.parametrize("kind", ["naive", "contrastive", "contrastive-first"])
def test_query_equals_gradient_of_margin(model, kind, batch_size):
    got = query_features(model, PAIRS, kind=kind, settings=GradientSettings(proj_dim=None, batch_size=batch_size))
    expected = np.stack([reference(model, pair, kind) for pair in PAIRS])
    assert np.allclose(got, expected, rtol=1e-8, atol=1e-10)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0)


@pytest.mark.parametrize("batch_size", [1, 3, 16])  # 1 and 3: a pair's two rows share a batch all the same
@pytest.mark.parametrize("kind", ["naive", "contrastive", "contrastive-first"])
def test_one_backward_gives_the_direction_and_the_pairs_exact_gradients(model, kind, batch_size):
    """query_gradients: v = Σ q/‖q‖ and each pair's exact q against the float64 margin's gradient; the kept q,
    projected, are the queries query_features computes again; nothing kept past keep_bytes, v the same."""
    direction, exact = query_gradients(model, PAIRS, kind, batch_size=batch_size)
    expected = np.stack([margin_gradient(model, pair, kind) for pair in PAIRS])  # (Q, k)
    assert exact is not None and np.allclose(exact.numpy(), expected, rtol=1e-8, atol=1e-10)
    v = (expected / np.linalg.norm(expected, axis=1, keepdims=True)).sum(0)
    assert np.allclose(torch.cat([d.flatten() for d in direction]).numpy(), v, rtol=1e-8, atol=1e-10)
    for settings in (EXACT, GradientSettings(proj_dim=200, seed=3, batch_size=2)):
        assert np.allclose(query_features(model, PAIRS, kind=kind, settings=settings, exact=exact),
                           query_features(model, PAIRS, kind=kind, settings=settings), rtol=1e-8, atol=1e-10)
    alone, none = query_gradients(model, PAIRS, kind, batch_size=batch_size, keep_bytes=exact.nbytes - 1)
    assert none is None and all(torch.allclose(a, d) for a, d in zip(alone, direction, strict=True))


def test_first_divergence_counts_an_ended_answer():
    assert first_divergence([1, 2, 3], [1, 2, 4]) == 2
    assert first_divergence([1, 2, 3], [1, 2]) == 2
    assert first_divergence([1, 2], [1, 2]) is None


def test_identical_answers_give_zero_query_and_missing_negative_is_naive(model):
    pairs = [QueryPair("same", [5], [6, 2], [6, 2]), QueryPair("none", [5], [6, 2], None)]
    got = query_features(model, pairs, kind="contrastive-first", settings=EXACT)
    assert not got[0].any()
    assert np.allclose(got[1], query_features(model, pairs[1:], kind="naive", settings=EXACT)[0])


def test_projected_queries_use_the_training_projector(model):
    settings = GradientSettings(proj_dim=200, seed=3)
    exact = query_features(model, PAIRS, kind="contrastive", settings=EXACT, unit_norm=False)
    projected = query_features(model, PAIRS, kind="contrastive", settings=settings, unit_norm=False)
    projector = make_projector(model, settings)
    sizes = np.cumsum([0] + [p.rows * p.cols for p in projector.plans])
    by_hand = torch.cat(
        [
            projector.project(i, torch.from_numpy(exact[:, a:b]).reshape(len(PAIRS), p.rows, p.cols))
            for i, (p, a, b) in enumerate(zip(projector.plans, sizes[:-1], sizes[1:], strict=True))
        ],
        dim=1,
    ).numpy()
    assert projected.shape == (3, projector.dim) and projector.dim <= 200
    assert np.allclose(projected, by_hand, rtol=1e-8, atol=1e-10)


def test_each_query_kind_reads_as_its_two_axes():
    """`--query` names where y⁺ comes from and how it is contrasted; one parser reads both, for every kind."""
    from gradian.scores.pairs import answer_source, base_kind
    from gradian.settings import QUERY_KINDS

    expected = {"naive": ("reference", "naive"), "contrastive": ("reference", "contrastive"),
                "contrastive-first": ("reference", "contrastive-first"), "repaired": ("repaired", "contrastive"),
                "repaired-first": ("repaired", "contrastive-first"), "departure": ("departure", "contrastive"),
                "departure-first": ("departure", "contrastive-first")}
    assert {kind: (answer_source(kind), base_kind(kind)) for kind in QUERY_KINDS} == expected
