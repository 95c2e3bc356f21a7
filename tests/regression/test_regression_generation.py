"""Loading base + adapter, and batched greedy generation equal to batch-1 generation (float64 tiny Llama)."""

from __future__ import annotations

import copy
import json
import warnings
from collections import Counter
from contextlib import nullcontext

import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file

from conftest import make_tiny_model
from gradian.data.base_model import resolve_base_model
from gradian.errors import InputError
from gradian.regression import generation as generation_module
from gradian.regression.generation import GeneratedAnswer, cut_at_stop, generate
from gradian.regression.loading import AdapterBaseWarning, load_models, pick_device_dtype

torch.set_num_threads(2)
PROMPTS = ["refund my order", "hello", "please help me with the invoice amount for my account", "late", "my order"]


def save_base_and_adapter(tokenizer, root, *, seed=0, adapter_seed=1, stop_early=False, **overrides):
    """A tiny base model folder and a LoRA adapter trained on it (random, non-zero B so it changes outputs).

    `stop_early`: EOS scores twice the token the fine-tuned model generates most, so some answers end early.
    """
    model = make_tiny_model(tokenizer, seed=seed, dtype=torch.float64, **overrides)
    torch.manual_seed(adapter_seed)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    tuned = get_peft_model(copy.deepcopy(model), lora)
    if stop_early:
        prompts = [tokenizer(text)["input_ids"] for text in PROMPTS]
        generated = [i for g in generate(tuned, tokenizer, prompts, max_new_tokens=6) for i in g.ids]
        favourite = Counter(generated).most_common(1)[0][0]
        with torch.no_grad():
            for head in (model.lm_head, tuned.get_base_model().lm_head):
                head.weight[tokenizer.eos_token_id] = 2 * head.weight[favourite]
    base_dir, adapter_dir = root / "base", root / "adapter"
    model.save_pretrained(base_dir)
    tokenizer.save_pretrained(base_dir)
    tuned.save_pretrained(adapter_dir)
    return base_dir, adapter_dir


@pytest.fixture
def saved(tiny_tokenizer, tmp_path):
    return save_base_and_adapter(tiny_tokenizer, tmp_path, stop_early=True)


@pytest.fixture
def loaded(saved):
    base_dir, adapter_dir = saved
    return load_models(resolve_base_model(base_dir), adapter_dir, device="cpu", dtype="float64")


def test_load_models_round_trips_the_adapter_and_disables_it_for_the_base(saved, loaded, tiny_tokenizer):
    base_dir, _ = saved
    model, tokenizer = loaded
    ids = torch.tensor([tiny_tokenizer("refund my order")["input_ids"]])
    plain = make_tiny_model(tiny_tokenizer, dtype=torch.float64)
    plain.load_state_dict(load_file(str(base_dir / "model.safetensors")))
    with torch.no_grad():
        tuned = model(ids).logits
        with model.disable_adapter():
            base = model(ids).logits
        expected_base = plain(ids).logits
    assert next(model.parameters()).dtype == torch.float64 and not model.training
    torch.testing.assert_close(base, expected_base, rtol=0, atol=1e-12)
    assert (tuned - base).abs().max() > 1e-3  # the adapter really changes the model
    assert tokenizer.eos_token_id == tiny_tokenizer.eos_token_id and model.gradian_warnings == []


def test_batched_generation_equals_batch_one_generation(loaded):
    model, tokenizer = loaded
    prompts = [tokenizer(text)["input_ids"] for text in PROMPTS]
    for adapter_on in (True, False):
        with model.disable_adapter() if not adapter_on else nullcontext():
            batched = generate(model, tokenizer, prompts, max_new_tokens=10, batch_size=4)
            single = [generate(model, tokenizer, [prompt], max_new_tokens=10, batch_size=1)[0] for prompt in prompts]
        assert batched == single


def test_a_batch_out_of_memory_is_halved_and_the_rest_keep_the_smaller_size(loaded, monkeypatch):
    model, tokenizer = loaded
    prompts = [tokenizer(text)["input_ids"] for text in PROMPTS]
    expected = generate(model, tokenizer, prompts, max_new_tokens=10, batch_size=1)
    real, sizes = model.generate, []

    def small_memory(*args, **kwargs):  # a device that holds two prompts a batch
        sizes.append(len(kwargs["input_ids"]))
        if sizes[-1] > 2:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(*args, **kwargs)

    monkeypatch.setattr(model, "generate", small_memory)
    calls: list[int] = []
    assert generate(model, tokenizer, prompts, max_new_tokens=10, batch_size=8, progress=calls.append) == expected
    assert sizes == [len(PROMPTS), 4, 2, 2, 1] and calls == [2, 2, 1]  # 5 prompts: 8 → 4 → 2, then 2 and the last


def test_the_cache_size_per_token_is_what_the_model_caches(loaded):
    model, tokenizer = loaded
    ids = torch.tensor([tokenizer("please help me with the invoice")["input_ids"]])
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True).past_key_values
    cached = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    assert generation_module.cache_bytes_per_token(model) * ids.shape[1] == cached


def test_a_batch_is_no_larger_than_its_cache_fits_in_free_memory(loaded, monkeypatch):
    model, tokenizer = loaded
    prompts = [tokenizer(text)["input_ids"] for text in PROMPTS]
    expected = generate(model, tokenizer, prompts, max_new_tokens=10, batch_size=1)
    tokens = max(map(len, prompts)) + 10
    two_rows = int(2 * generation_module.cache_bytes_per_token(model) * tokens / generation_module.CACHE_SHARE)
    monkeypatch.setattr(generation_module, "free_memory", lambda device: two_rows)
    real, sizes = model.generate, []
    monkeypatch.setattr(model, "generate", lambda *a, **k: sizes.append(len(k["input_ids"])) or real(*a, **k))
    assert generate(model, tokenizer, prompts, max_new_tokens=10, batch_size=64) == expected
    assert sizes == [2, 2, 1]
    monkeypatch.setattr(generation_module, "free_memory", lambda device: None)  # a device that does not say
    sizes.clear()
    generate(model, tokenizer, prompts, max_new_tokens=10, batch_size=64)
    assert sizes == [len(PROMPTS)]


def test_an_error_other_than_memory_or_at_one_prompt_a_batch_stands(loaded, monkeypatch):
    model, tokenizer = loaded
    prompts = [tokenizer(text)["input_ids"] for text in PROMPTS]
    for message, size in (("shape mismatch", 8), ("CUDA out of memory. Tried to allocate 2.00 GiB", 1)):
        monkeypatch.setattr(model, "generate", lambda *a, m=message, **k: (_ for _ in ()).throw(RuntimeError(m)))
        with pytest.raises(RuntimeError, match=message.split(".")[0]):
            generate(model, tokenizer, prompts, max_new_tokens=10, batch_size=size)


def test_generations_keep_eos_and_say_whether_they_stopped(loaded):
    model, tokenizer = loaded
    eos = tokenizer.eos_token_id
    calls = []
    generations = generate(model, tokenizer, [tokenizer(t)["input_ids"] for t in PROMPTS], max_new_tokens=10,
                           batch_size=2, progress=calls.append)
    assert sum(calls) == len(PROMPTS) and len(calls) == 3
    assert any(g.stopped for g in generations)
    for generation in generations:
        assert eos not in generation.ids[:-1]
        assert generation.stopped == (generation.ids[-1] == eos)
        assert generation.stopped or len(generation.ids) == 10
        assert generation.text == tokenizer.decode(generation.ids, skip_special_tokens=True)


def test_finish_cuts_after_the_first_stop_token(tiny_tokenizer):
    eos, pad = tiny_tokenizer.eos_token_id, tiny_tokenizer.pad_token_id
    word = tiny_tokenizer.convert_tokens_to_ids("refund")
    assert cut_at_stop([word, eos, pad, pad], tiny_tokenizer, {eos}) == GeneratedAnswer([word, eos], "refund", True)
    assert cut_at_stop([word, word], tiny_tokenizer, {eos}) == GeneratedAnswer([word, word], "refundrefund", False)


def test_adapter_for_another_base_is_an_input_error(tiny_tokenizer, tmp_path):
    base_dir, _ = save_base_and_adapter(tiny_tokenizer, tmp_path / "a")
    _, wider = save_base_and_adapter(tiny_tokenizer, tmp_path / "b", hidden_size=48)
    _, deeper = save_base_and_adapter(tiny_tokenizer, tmp_path / "c", num_hidden_layers=3)
    with pytest.raises(InputError, match="trained on another base model"):
        load_models(resolve_base_model(base_dir), wider, device="cpu")
    with pytest.raises(InputError, match="which the base model .* does not have"):
        load_models(resolve_base_model(base_dir), deeper, device="cpu")
    with pytest.raises(InputError, match="has no adapter_config.json"):
        load_models(resolve_base_model(base_dir), base_dir, device="cpu")


def test_another_base_name_with_fitting_shapes_is_a_warning(saved):
    base_dir, adapter_dir = saved
    config_path = adapter_dir / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = "some-org/another-model"
    config_path.write_text(json.dumps(config))
    with pytest.warns(AdapterBaseWarning, match="another-model"):
        model, _ = load_models(resolve_base_model(base_dir), adapter_dir, device="cpu")
    assert len(model.gradian_warnings) == 1
    config["base_model_name_or_path"] = f"some-org/{base_dir.name}"  # same model by name: hub id vs folder
    config_path.write_text(json.dumps(config))
    with warnings.catch_warnings():
        warnings.simplefilter("error", AdapterBaseWarning)
        load_models(resolve_base_model(base_dir), adapter_dir, device="cpu")


def test_device_and_dtype_are_automatic_and_overridable():
    device, dtype = pick_device_dtype(None, None)
    assert (device.type, dtype) == (("cuda", torch.bfloat16) if torch.cuda.is_available() else ("cpu", torch.float32))
    assert pick_device_dtype("cpu", "float64") == (torch.device("cpu"), torch.float64)
    assert pick_device_dtype("cpu", "auto") == (torch.device("cpu"), torch.float32)  # --dtype auto
    with pytest.raises(InputError, match="not a torch dtype"):
        pick_device_dtype("cpu", "floaty")
    with pytest.raises(InputError, match="not a device"):
        pick_device_dtype("gpu", None)
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="no usable CUDA GPU"):
            pick_device_dtype("cuda", None)
