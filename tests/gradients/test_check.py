"""The gradient check: float32 batched agrees with float32 alone on either padding side; bf16 and a padding fault are
measured, and a disagreement stops attribution with one sentence naming what differs and what to pass."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from peft import LoraConfig, get_peft_model

from conftest import make_tiny_model
from gradian.data.render import IGNORE, Rendered
from gradian.errors import InputError
from gradian.gradients.batches import row_batches
from gradian.gradients.check import (
    MAX_NORM_ERROR,
    MIN_COSINE,
    check_gradients,
    check_rows,
    cosine_and_error,
    disagreement,
    float32_reference,
)
from gradian.gradients.settings import GradientSettings
from gradian.stages.extraction import check_extraction

torch.set_num_threads(2)

LENGTHS = (2, 13, 4, 9, 30, 6, 17, 3, 25, 11)  # the 2-token row is mostly padding next to the 30-token one
EXACT = GradientSettings(proj_dim=None)


def lora_model(tokenizer, dtype=torch.float32):
    model = make_tiny_model(tokenizer, seed=1)
    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    return get_peft_model(model, config).to(dtype)


def rendered(vocab: int, lengths=LENGTHS, seed=0) -> list[Rendered]:
    generator = torch.Generator().manual_seed(seed)
    out = []
    for k, n in enumerate(lengths):
        ids = torch.randint(4, vocab, (n,), generator=generator).tolist()
        cut = n // 3
        out.append(Rendered(f"row-{k}", ids, [IGNORE] * cut + ids[cut:], n, cut))
    return out


def unmasked(*args):
    """Batches as extraction makes them, with the mask and position ids never applied (a padding fault)."""
    for rows, batch in row_batches(*args):
        batch["attention_mask"] = torch.ones_like(batch["attention_mask"])
        batch["position_ids"] = torch.arange(batch["input_ids"].shape[1]).expand_as(batch["input_ids"])
        yield rows, batch


def extraction_settings(check: bool = True) -> SimpleNamespace:
    return SimpleNamespace(gradient_check=check)


def test_checked_rows_hold_the_longest_and_the_shortest_and_are_seeded(tiny_tokenizer):
    rows = rendered(len(tiny_tokenizer))
    rows[0] = Rendered("dropped", [5], [5], 1, 0, dropped=True)  # never trained: never checked
    picked = check_rows(rows, seed=0)
    assert len(picked) == 6 and 0 not in picked
    assert {4, 7} <= set(picked)  # 30 tokens and 3 tokens
    assert picked == check_rows(rows, seed=0) != check_rows(rows, seed=1)
    assert check_rows(rows[:3], seed=0) == [1, 2]


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("proj_dim", [None, 64])
def test_float32_batched_agrees_with_float32_alone(tiny_tokenizer, side, proj_dim):
    model = lora_model(tiny_tokenizer)
    check = check_gradients(model, rendered(len(tiny_tokenizer)), GradientSettings(proj_dim=proj_dim,
                                                                                    padding_side=side))
    assert check is not None and len(check.rows) == 6
    assert check.min_cosine >= 0.999 and check.max_norm_error < 1e-5, check  # measured: 1 − 1e-12, 4e-7
    assert check.agrees and (check.dtype, check.attention, check.padding_side) == ("float32", "sdpa", side)


def test_float64_batched_agrees_with_float64_alone(tiny_tokenizer):
    """A float64 model stays float64 for the reference (never rounded to float32): batched and alone then agree to
    float64 rounding, as the hooks agree with the naive per-row loop (test_gradients)."""
    model = lora_model(tiny_tokenizer, torch.float64)
    check = check_gradients(model, rendered(len(tiny_tokenizer)), GradientSettings(proj_dim=None, padding_side="left"))
    assert check is not None and check.min_cosine > 1 - 1e-12 and check.max_norm_error < 1e-10
    with float32_reference(model):
        assert all(p.dtype == torch.float64 for p in model.parameters())


def test_bfloat16_is_measured_and_refused_below_the_floor(tiny_tokenizer):
    """bf16 on this 32-wide Llama: measured min cosine 0.9824 and max norm error 4.3% (right padding, 6 rows),
    under the 0.99 floor: rounding alone, no fault, and the check refuses it naming the dtype and --dtype float32.
    The decision follows the numbers wherever another CPU's bf16 kernels round differently."""
    model = lora_model(tiny_tokenizer, torch.bfloat16)
    rows = rendered(len(tiny_tokenizer))
    check = check_gradients(model, rows, EXACT)
    assert check is not None and check.dtype == "bfloat16"
    assert 0.9 < check.min_cosine < 0.9999 and check.max_norm_error < 0.5, check  # rounding: off, not turned
    assert check.agrees == (check.min_cosine >= MIN_COSINE and check.max_norm_error <= MAX_NORM_ERROR)
    audit = SimpleNamespace(rendered=rows)
    if check.agrees:
        assert check_extraction(extraction_settings(), audit, model, EXACT, None) == check
        return
    with pytest.raises(InputError) as refused:
        check_extraction(extraction_settings(), audit, model, EXACT, None)
    message = str(refused.value)
    assert message.startswith("the per-example gradients as this run takes them disagree with the same 6 rows'")
    assert "its dtype (bfloat16)" in message and "--dtype float32" in message and "--no-gradient-check" in message
    assert message.endswith("to rank by them anyway.") and ". " not in message  # one sentence
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())  # the model is back as it ran


def test_a_bfloat16_base_with_float32_lora_weights_is_named_bfloat16(tiny_tokenizer):
    """As PEFT loads an adapter onto a bf16 model (its LoRA weights autocast to float32), the dtype named is bf16;
    measured: min cosine 0.995, norm error 2.4% (within the bounds)."""
    model = lora_model(tiny_tokenizer, torch.bfloat16)
    for name, param in model.named_parameters():
        if "lora_" in name:
            param.data = param.data.float()
    check = check_gradients(model, rendered(len(tiny_tokenizer)), EXACT)
    assert check is not None and check.dtype == "bfloat16" and check.min_cosine < 0.9999, check
    assert all(p.dtype == (torch.float32 if "lora_" in n else torch.bfloat16) for n, p in model.named_parameters())


def test_a_padding_fault_is_refused_naming_the_padding(tiny_tokenizer):
    """Left padding whose mask and position ids never reach the model: measured cosine 0.24, norm off by 198%."""
    model = lora_model(tiny_tokenizer)
    settings = GradientSettings(proj_dim=None, padding_side="left")
    check = check_gradients(model, rendered(len(tiny_tokenizer)), settings, batches=unmasked)
    assert check is not None and not check.agrees
    assert check.min_cosine < 0.5 and check.max_norm_error > 1.0, check
    longest = check.rows.index(4)  # the unpadded row agrees: the fault is the padding's
    assert check.cosines[longest] > 1 - 1e-6
    message = disagreement(check)
    assert "its padding (left side, batches of up to 16)" in message and "--batch-size 1 (no padding)" in message
    assert "dtype" not in message.split("differs in")[1]  # float32: the dtype is not what differs


def test_right_padding_needs_no_mask(tiny_tokenizer):
    """The same fault under right padding changes nothing (causal attention never looks ahead at the pads)."""
    model = lora_model(tiny_tokenizer)
    check = check_gradients(model, rendered(len(tiny_tokenizer)), EXACT, batches=unmasked)
    assert check is not None and check.agrees and check.min_cosine >= 0.999


def test_the_reference_restores_every_bit_and_the_attention(tiny_tokenizer):
    model = lora_model(tiny_tokenizer, torch.bfloat16)
    model.set_attn_implementation("eager")
    before = {name: p.detach().clone() for name, p in model.state_dict().items()}
    with float32_reference(model):
        assert all(p.dtype == torch.float32 for p in model.parameters())
        assert model.config._attn_implementation == "sdpa"
    assert model.config._attn_implementation == "eager"
    after = model.state_dict()
    assert all(after[name].dtype == value.dtype and torch.equal(after[name], value) for name, value in before.items())


def test_no_gradient_check_skips_it(tiny_tokenizer):
    model = lora_model(tiny_tokenizer)
    audit = SimpleNamespace(rendered=rendered(len(tiny_tokenizer)))
    assert check_extraction(extraction_settings(check=False), audit, model, EXACT, None) is None
    check = check_extraction(extraction_settings(), audit, model, EXACT, None)
    assert check is not None and check.to_dict()["agrees"]


def test_agreement_of_vectors():
    a = torch.tensor([3.0, 4.0], dtype=torch.float64)
    assert cosine_and_error(a, a) == (1.0, 0.0)
    assert cosine_and_error(-a, a) == (-1.0, 0.0)
    cosine, error = cosine_and_error(2 * a, a)
    assert cosine == pytest.approx(1.0) and error == pytest.approx(1.0)
    assert cosine_and_error(torch.zeros(2), torch.zeros(2)) == (1.0, 0.0)
    assert cosine_and_error(a, torch.zeros(2, dtype=torch.float64)) == (0.0, float("inf"))


def test_the_report_fields_name_what_was_compared(tiny_tokenizer):
    check = check_gradients(lora_model(tiny_tokenizer), rendered(len(tiny_tokenizer)), EXACT)
    assert check is not None
    fields = check.to_dict()
    assert fields["rows_checked"] == 6 and fields["min_cosine_allowed"] == MIN_COSINE
    assert fields["max_norm_error_allowed"] == MAX_NORM_ERROR and fields["agrees"] is True
    assert fields["compared"]["run"] == "float32, sdpa attention, batches of up to 16 padded on the right"
    assert fields["compared"]["reference"] == "float32, sdpa attention, each row alone and unpadded"
