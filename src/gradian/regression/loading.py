"""Load the base model and the LoRA adapter as one `PeftModel`.

The base model's answers come from the same object with `with model.disable_adapter():`, so both
models share weights, tokenizer, device and dtype. Before PEFT touches the weights, every adapter
tensor's shape is checked against the base module it attaches to: an adapter trained on another
base fails with one sentence instead of a `size mismatch` traceback.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from gradian.data.adapter_base import ADAPTER_WEIGHTS, adapter_shapes, names_same_model
from gradian.data.base_model import BaseModelRef, load_tokenizer
from gradian.data.run_folder import check_lora_numbers
from gradian.errors import InputError, reason
from gradian.files import read_json_object

ADAPTER_CONFIG = "adapter_config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
_LORA_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.(?P<kind>lora_A|lora_B|lora_embedding_A|lora_embedding_B)"
                       r"(?:\.[^.]+)?(?:\.weight)?$")


class AdapterBaseWarning(UserWarning):
    """The adapter names another base model than the one given, but its shapes fit."""


def pick_device_dtype(device: str | torch.device | None, dtype: str | torch.dtype | None) -> tuple[torch.device, Any]:
    """CUDA with bfloat16 when present, else CPU float32; either can be overridden."""
    if device is None or device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        chosen = torch.device(device)
    except RuntimeError:
        raise InputError("is not a device; use cpu, cuda or cuda:N.", str(device)) from None
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise InputError("CUDA was asked for but this machine has no usable CUDA GPU; use --device cpu.", str(device))
    if chosen.type == "mps" and not torch.backends.mps.is_available():
        raise InputError("MPS (Apple GPU) was asked for but this machine or this PyTorch build has none; use --device "
                         "cpu, or cuda where there is a CUDA GPU.", str(device))
    if chosen.type not in ("cpu", "cuda", "mps"):
        raise InputError("is not a device Gradian runs on; use cpu, cuda, cuda:N or mps.", str(device))
    if dtype == "auto":
        dtype = None
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise InputError("is not a torch dtype; use float32, bfloat16, float16 or float64.", str(dtype))
    if dtype is None:
        dtype = torch.bfloat16 if chosen.type == "cuda" else torch.float32
    return chosen, dtype


def load_models(
    base: BaseModelRef,
    adapter_dir: str | Path,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
) -> tuple[Any, Any]:
    """(PeftModel in eval mode, tokenizer). The tokenizer is the adapter folder's when the run saved one.

    A different `base_model_name_or_path` whose shapes still fit is a warning (`AdapterBaseWarning`, also
    listed in `model.gradian_warnings`); shapes that do not fit raise `InputError`. `model.gradian_base` keeps the
    base's `BaseModelRef.identity` (`loaded_identity`).
    """
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    adapter_dir = Path(adapter_dir)
    config = read_adapter_config(adapter_dir)
    check_adapter_weights(adapter_dir, config)
    chosen_device, chosen_dtype = pick_device_dtype(device, dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(base.path, dtype=chosen_dtype, **base.kwargs())
    except Exception as error:
        raise InputError(f"could not load the base model ({reason(error)}).", base.spec) from None
    check_adapter_shapes(model, adapter_dir, base)
    notes = [note] if (note := named_base_differs(config, base)) else []
    for note in notes:
        warnings.warn(note, AdapterBaseWarning, stacklevel=2)
    try:
        peft_model = PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=False)
    except Exception as error:
        raise InputError(f"PEFT could not load the adapter ({_peft_reason(error)}).", adapter_dir) from None
    peft_model.to(chosen_device).eval()
    peft_model.gradian_warnings = notes
    peft_model.gradian_base = base.identity()  # what caches of its answers and gradients are keyed by
    tokenizer = _tokenizer(adapter_dir, base)
    check_vocabulary(tokenizer, peft_model, base)
    return peft_model, tokenizer


def _peft_reason(error: BaseException) -> str:
    """PEFT's cause: the first `size mismatch for ...` line of a state-dict error (its first line names no cause)."""
    lines = [line.strip() for line in str(error).splitlines()]
    mismatch = next((line for line in lines if line.startswith("size mismatch")), None)
    return mismatch.rstrip(".")[:300] if mismatch else reason(error)


def check_adapter_weights(adapter_dir: Path, config: dict[str, Any]) -> None:
    """Before anything loads, so before any generation: every LoRA factor has the rank adapter_config.json gives it
    (`r`, or its `rank_pattern`) and every adapter tensor is finite (read from the file: no model is loaded)."""
    where = _weights_file(adapter_dir)
    for key, shape in adapter_shapes(adapter_dir).items():
        match = _LORA_KEY.match(key)
        if match is None or len(shape) < 2:
            continue
        kind = match.group("kind")
        rank = _config_rank(config, match.group("module"))
        axis = 0 if kind.endswith("A") else 1  # A: (r, in), B: (out, r)
        if rank is not None and shape[axis] != rank:
            implied = tuple(rank if i == axis else size for i, size in enumerate(shape))
            raise InputError(f"the tensor {key} has shape {tuple(shape)} but adapter_config.json (r={rank}) implies "
                             f"{implied}; the config was saved by another run than these weights: put back the "
                             "adapter_config.json written with them.", where)
    for key, tensor in _adapter_tensors(where):
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise InputError(f"the tensor {key} holds {bad} NaN or infinite values of {tensor.numel()}, so every "
                             "answer of this adapter would be garbage; the training diverged: retrain (a lower "
                             "learning rate, bf16 instead of fp16) or use an earlier checkpoint.", where)


def _weights_file(adapter_dir: Path) -> Path:
    for name in ADAPTER_WEIGHTS:
        if (adapter_dir / name).is_file():
            return adapter_dir / name
    raise InputError("has no adapter_model.safetensors (or adapter_model.bin).", adapter_dir)


def _config_rank(config: dict[str, Any], module: str) -> int | None:
    """The rank adapter_config.json gives `module` (PEFT's rule: a `rank_pattern` key matching the name's end, else
    `r`, default 8); None when the pattern cannot be read (then PEFT's own check speaks)."""
    patterns = config.get("rank_pattern") or {}
    if not isinstance(patterns, dict):
        return None
    for pattern, rank in patterns.items():
        try:
            if re.match(rf"(.*\.)?({pattern})$", module):
                return rank if isinstance(rank, int) and not isinstance(rank, bool) else None
        except (re.error, TypeError, OverflowError, RecursionError):
            return None
    rank = config.get("r", 8)
    return rank if isinstance(rank, int) and not isinstance(rank, bool) else None


def _adapter_tensors(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of the adapter file, one at a time on the CPU; `InputError` when a tensor cannot be read."""
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as handle:
                for key in handle.keys():  # noqa: SIM118
                    yield key, handle.get_tensor(key)
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
            yield from (state.items() if isinstance(state, dict) else [])
    except InputError:
        raise
    except Exception as error:
        raise InputError(f"could not read the adapter weights ({reason(error)}).", path) from None


def check_vocabulary(tokenizer: Any, model: Any, base: BaseModelRef) -> None:
    """Token ids past the embedding table would crash generation (and break CUDA for the whole process)."""
    rows = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > rows:
        raise InputError(f"its tokenizer has {len(tokenizer)} tokens but the model's embedding has {rows} rows; "
                         "use the tokenizer the model was trained with (or resize the embeddings).", base.spec)


def read_adapter_config(adapter_dir: Path) -> dict[str, Any]:
    path = adapter_dir / ADAPTER_CONFIG
    if not path.is_file():
        raise InputError(f"has no {ADAPTER_CONFIG}; point --adapter at the folder the trainer saved the adapter in.",
                         adapter_dir)
    return check_lora_numbers(read_json_object(path, "the adapter folder looks damaged"), path)


def check_attributable(adapter_dir: str | Path) -> None:
    """Refuse, before any generation, an adapter whose training the LoRA gradients would not cover: DoRA (its
    magnitude vectors) and `modules_to_save` (full-weight copies of whole modules). `gradients.hooks.lora_matrices`
    refuses the rest (lora_bias, LoRA on embeddings) when it meets them."""
    path = Path(adapter_dir)
    config = read_adapter_config(path)
    where = path / ADAPTER_CONFIG
    if config.get("use_dora"):
        raise InputError("the adapter is DoRA (use_dora: true), and Gradian attributes plain LoRA only (its gradients "
                         "miss DoRA's magnitude vectors); retrain with use_dora=False to attribute the regression, or "
                         "run `gradian diagnose` to audit the rows.", where)
    saved = config.get("modules_to_save")
    if saved:
        names = ", ".join(map(str, saved)) if isinstance(saved, list) else str(saved)
        raise InputError(f"the adapter also trains whole modules (modules_to_save: {names}), whose full-weight "
                         "updates Gradian does not attribute, so rows that changed them would go unseen; retrain "
                         "with those modules frozen (no modules_to_save) to attribute the regression, or run "
                         "`gradian diagnose` to audit the rows.", where)


def named_base_differs(config: dict[str, Any], base: BaseModelRef) -> str | None:
    """A sentence when the adapter's `base_model_name_or_path` names another model than `base`, else None
    (the rule is `data.adapter_base.names_same_model`)."""
    named = config.get("base_model_name_or_path")
    if names_same_model(str(named) if named else None, base):
        return None
    return (f"the adapter was trained on {named!r} but the base model given is {base.spec!r}; "
            "the shapes fit, so Gradian goes on, but check this is the same model.")


def check_adapter_shapes(model: torch.nn.Module, adapter_dir: Path, base: BaseModelRef) -> None:
    """Raise `InputError` when an adapter tensor does not fit the base module it attaches to."""
    modules = dict(model.named_modules())
    for key, shape in adapter_shapes(adapter_dir).items():
        match = _LORA_KEY.match(key)
        if match is None:
            continue
        name, kind = match.group("module"), match.group("kind")
        module = modules.get(name)
        if module is None:
            raise InputError(f"the adapter has weights for module {name!r}, which the base model {base.spec!r} "
                             "does not have; is the adapter for another base model?", adapter_dir)
        expected = _expected_dim(module, kind)
        actual = shape[1] if kind in ("lora_A", "lora_embedding_A") else shape[0]
        if expected is not None and actual != expected:
            raise InputError(f"the adapter's {name} expects size {actual} but the base model {base.spec!r} has "
                             f"{expected}; the adapter was trained on another base model.", adapter_dir)


def _expected_dim(module: torch.nn.Module, kind: str) -> int | None:
    """The base dimension a LoRA factor must match: input size for A, output size for B."""
    if isinstance(module, torch.nn.Embedding):
        return module.num_embeddings if kind.endswith("A") else module.embedding_dim
    weight = getattr(module, "weight", None)
    if weight is None or weight.ndim < 2:
        return None
    out_features, in_features = weight.shape[0], weight.shape[1]
    if type(module).__name__ == "Conv1D":  # GPT-2 style: weight is (in, out)
        out_features, in_features = in_features, out_features
    return in_features if kind.endswith("A") else out_features


def _tokenizer(adapter_dir: Path, base: BaseModelRef) -> Any:
    if any((adapter_dir / name).is_file() for name in TOKENIZER_FILES):
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(str(adapter_dir), local_files_only=True)
        except Exception:
            pass  # an incomplete tokenizer in the run folder: the base model's is the next best
    return load_tokenizer(base)
