"""The adapter is checked before anything loads: weights that are not finite, or a rank its adapter_config.json does
not give, are one sentence naming the file and the tensor, before the first generation. Then the adapter folder's
readers are fuzzed (adapter_config.json, the safetensors header and body): a result or one `InputError`.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from fuzzing import FUZZ, answer, bounded
from gradian.data.base_model import resolve_base_model
from gradian.errors import InputError
from gradian.regression.loading import check_adapter_weights, check_attributable, load_models, read_adapter_config

WEIGHTS = "adapter_model.safetensors"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from bad_inputs.workspace import build_workspace

    return build_workspace(tmp_path_factory.mktemp("adapter-world"))


def _copy(world, tmp_path: Path) -> Path:
    return Path(shutil.copytree(world.adapter, tmp_path / "adapter"))


def _rewrite(adapter: Path, change) -> str:
    """Apply `change(name, tensor) -> tensor` to the first lora_A tensor; its name."""
    tensors = load_file(adapter / WEIGHTS)
    name = sorted(key for key in tensors if "lora_A" in key)[0]
    tensors[name] = change(tensors[name])
    save_file(tensors, adapter / WEIGHTS, metadata={"format": "pt"})
    return name


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_weights_are_refused_before_loading(world, tmp_path, value):
    adapter = _copy(world, tmp_path)
    name = _rewrite(adapter, lambda t: torch.full_like(t, value))
    with pytest.raises(InputError) as raised:
        load_models(resolve_base_model(str(world.model)), adapter, device="cpu")
    message = str(raised.value)
    assert message.startswith(f"{adapter / WEIGHTS}: the tensor {name} holds") and "NaN or infinite" in message
    assert "\n" not in message


def test_a_rank_other_than_the_configs_names_the_tensor_and_both_shapes(world, tmp_path):
    """adapter_config.json says r=4, the tensors are rank 2: PEFT's own error was cut off before its cause."""
    adapter = _copy(world, tmp_path)
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "r": 4}))
    with pytest.raises(InputError) as raised:
        load_models(resolve_base_model(str(world.model)), adapter, device="cpu")
    message = str(raised.value)
    assert message.startswith(f"{adapter / WEIGHTS}: the tensor ") and "lora_A" in message, message
    assert "has shape (2, " in message and "(r=4) implies (4, " in message, message


def test_a_rank_pattern_gives_its_modules_their_rank(world, tmp_path):
    adapter = _copy(world, tmp_path)
    config = json.loads((adapter / "adapter_config.json").read_text())
    fitting = {**config, "r": 8, "rank_pattern": {"q_proj": 2, "v_proj": 2}}
    check_adapter_weights(adapter, fitting)
    with pytest.raises(InputError, match="v_proj.lora_A"):
        check_adapter_weights(adapter, {**fitting, "rank_pattern": {"q_proj": 2}})


def test_the_valid_adapter_passes(world):
    check_adapter_weights(world.adapter, read_adapter_config(world.adapter))


def test_peft_size_mismatch_is_quoted():
    from gradian.regression.loading import _peft_reason

    error = RuntimeError("Error(s) in loading state_dict for PeftModelForCausalLM:\n\tsize mismatch for "
                         "base_model.model.q_proj.lora_A.default.weight: copying a param with shape torch.Size([8, 64]) "
                         "from checkpoint, the shape in current model is torch.Size([4, 64]).")
    assert _peft_reason(error).startswith("size mismatch for base_model.model.q_proj.lora_A.default.weight: copying")


config_keys = ("r", "lora_alpha", "rank_pattern", "alpha_pattern", "target_modules", "use_dora", "modules_to_save",
               "base_model_name_or_path", "peft_type", "use_rslora", "lora_dropout")
json_values = st.recursive(st.none() | st.booleans() | st.integers(-3, 2**40) | st.floats() | st.text(max_size=10),
                           lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.sampled_from(("q_proj", "v_proj", ".*", "(", "model.layers.0")),
                                             inner, max_size=3), max_leaves=6)


def _read_adapter(adapter: Path):
    config = read_adapter_config(adapter)
    check_attributable(adapter)
    check_adapter_weights(adapter, config)
    return config


@FUZZ
@given(fields=st.dictionaries(st.sampled_from(config_keys), json_values, max_size=4))
@example(fields={"rank_pattern": {"(": 2}})
@example(fields={"r": 4})
@bounded
def test_fuzz_adapter_config(world, fields, tmp_path_factory):
    adapter = _copy(world, tmp_path_factory.mktemp("config"))
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, **fields}))
    answer(lambda: _read_adapter(adapter), adapter, names=str(adapter))


@FUZZ
@given(flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=6),
       header_flips=st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=3),
       cut=st.integers(0, 10**6) | st.none(), header_size=st.integers(0, 2**64 - 1) | st.none())
@bounded
def test_fuzz_adapter_weights(world, flips, header_flips, cut, header_size, tmp_path_factory):
    """adapter_model.safetensors with bytes changed (in its JSON header most of all), cut, or a wrong header size."""
    adapter = _copy(world, tmp_path_factory.mktemp("weights"))
    data = bytearray((adapter / WEIGHTS).read_bytes())
    for position, value in flips:
        data[position % len(data)] = value
    for position, value in header_flips:
        data[8 + position % max(1, min(400, len(data) - 8))] = value
    if header_size is not None:
        data[:8] = struct.pack("<Q", header_size)
    if cut is not None:
        data = data[: cut % len(data)]
    (adapter / WEIGHTS).write_bytes(bytes(data))
    answer(lambda: _read_adapter(adapter), adapter, names=str(adapter))
