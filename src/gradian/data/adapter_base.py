"""Was the adapter trained on this base model? The one place Gradian decides it, for the audit and for loading.

Two questions, each with one rule: does the adapter's `base_model_name_or_path` name the given base (same folder,
or a shared name: folder name, hub repo name, `org/name`, a cache snapshot's repo, a GGUF stem), and what are the
adapter tensors' shapes (read from the file header, no tensor loaded).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from gradian.data.base_model import BaseModelRef
from gradian.errors import InputError, reason

ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")


def names_same_model(named: str | None, base: BaseModelRef) -> bool:
    """True when `named` (the adapter's base_model_name_or_path) may be `base`; True when nothing is named."""
    if not named:
        return True
    path = Path(named)
    if path.exists() and Path(base.path).exists() and path.resolve() == Path(base.path).resolve():
        return True
    return bool(_model_names(str(named)) & (_model_names(base.spec) | _model_names(str(base.path)) | _gguf_names(base)))


def _model_names(spec: str) -> set[str]:
    spec = spec.replace("\\", "/").rstrip("/")
    parts = [part for part in spec.split("/") if part]
    names = {spec.lower(), *(p.lower() for p in parts[-1:]), "/".join(parts[-2:]).lower()}
    cache = re.search(r"models--([^/]+)--([^/]+)", spec)  # HF cache: models--org--name/snapshots/<hash>
    if cache:
        names |= {cache.group(2).lower(), f"{cache.group(1)}/{cache.group(2)}".lower()}
    return names - {"", "snapshots"}


def _gguf_names(base: BaseModelRef) -> set[str]:
    if not base.gguf_file:
        return set()
    stem = Path(base.gguf_file).stem.lower()
    return {stem, re.sub(r"[-.](q\d.*|f16|f32|bf16)$", "", stem)}


def adapter_shapes(adapter_dir: Path) -> dict[str, tuple[int, ...]]:
    """Tensor shapes of the saved adapter, read without loading the tensors; `InputError` when unreadable."""
    safetensors_file, bin_file = (adapter_dir / name for name in ADAPTER_WEIGHTS)
    if safetensors_file.is_file():
        from safetensors import safe_open

        try:
            with safe_open(str(safetensors_file), framework="pt") as handle:
                return {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}  # noqa: SIM118
        except Exception as error:
            raise InputError(f"could not read the adapter weights ({reason(error)}).", safetensors_file) from None
    if bin_file.is_file():
        try:
            state: dict[str, Any] = torch.load(bin_file, map_location="meta", weights_only=True)
        except Exception as error:
            raise InputError(f"could not read the adapter weights ({reason(error)}).", bin_file) from None
        return {key: tuple(value.shape) for key, value in state.items()}
    raise InputError("has no adapter_model.safetensors (or adapter_model.bin).", adapter_dir)
