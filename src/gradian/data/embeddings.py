"""Rows of the token-embedding matrices (input embeddings, output head), read from safetensors files by slice.

Only the rows asked for are read (`safe_open(...).get_slice`), plus a bounded sample of ordinary rows to know
what a trained row looks like: never the whole model, and for large vocabularies never the whole matrix.
Matrices come from the base model's folder (`model.safetensors` or the shards its index names) and from an
adapter folder, where PEFT saves full matrices (`modules_to_save`, or the embedding layers of a resized
vocabulary) and `trainable_token_indices` rows (`token_adapter.trainable_tokens_delta`, the rows themselves).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

INPUT_NAMES = frozenset({"embed_tokens", "wte", "embed_in", "word_embeddings"})
OUTPUT_NAMES = frozenset({"lm_head", "embed_out"})
REFERENCE_ROWS = 4096  # ordinary rows sampled, in BLOCKS contiguous slices (all rows of a smaller matrix)
BLOCKS = 8
TRAINABLE_TOKENS = "trainable_tokens_delta"


@dataclass(frozen=True)
class Matrix:
    """One embedding matrix in one safetensors file. Row k holds token `ids[k]`, or token k when `ids` is None."""

    role: str  # "input" | "output"
    where: str  # "base model" | "adapter"
    file: Path
    key: str
    rows: int
    ids: tuple[int, ...] | None = None

    def holds(self, token_id: int) -> bool:
        return token_id in self.ids if self.ids is not None else 0 <= token_id < self.rows

    def read(self, token_ids: Iterable[int]) -> np.ndarray:
        """The rows of `token_ids` (each held), float64, (n, d)."""
        positions = [self.ids.index(t) if self.ids is not None else t for t in token_ids]
        return self._slices([(p, p + 1) for p in positions])

    def sample(self, exclude: set[int]) -> np.ndarray:
        """Up to REFERENCE_ROWS rows of tokens not in `exclude`, float64, (m, d)."""
        if self.rows <= REFERENCE_ROWS:
            spans = [(0, self.rows)]
        else:
            width = REFERENCE_ROWS // BLOCKS
            starts = np.linspace(0, self.rows - width, BLOCKS).astype(int)
            spans = [(int(s), int(s) + width) for s in starts]
        rows = self._slices(spans)
        positions = [p for a, b in spans for p in range(a, b)]
        tokens = [self.ids[p] for p in positions] if self.ids is not None else positions
        keep = np.array([t not in exclude for t in tokens], dtype=bool)
        return rows[keep]

    def _slices(self, spans: list[tuple[int, int]]) -> np.ndarray:
        import torch
        from safetensors import safe_open

        with safe_open(str(self.file), framework="pt") as handle:
            tensor = handle.get_slice(self.key)
            parts = [tensor[a:b].to(torch.float64).numpy() for a, b in spans]  # bf16 needs torch, not numpy
        return np.concatenate(parts, axis=0) if parts else np.zeros((0, 0))


def base_matrices(folder: str | Path) -> list[Matrix]:
    """The embedding matrices of a model folder's safetensors weights (none for .bin or GGUF weights)."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        except (OSError, ValueError, RecursionError):
            return []
        keys: dict[Path, list[str]] = {}
        for key, name in weight_map.items():
            if _role(key) is not None:
                keys.setdefault(folder / str(name), []).append(key)
        return [m for file, wanted in keys.items() for m in _matrices(file, "base model", wanted)]
    single = folder / "model.safetensors"
    return _matrices(single, "base model") if single.is_file() else []


def adapter_matrices(adapter_dir: str | Path | None, token_indices: object = None) -> list[Matrix]:
    """Embedding rows an adapter saved: full matrices, and trainable-token rows (ids from `token_indices`,
    the adapter config's `trainable_token_indices`: a list, or a dict of module name to list)."""
    if adapter_dir is None:
        return []
    file = Path(adapter_dir) / "adapter_model.safetensors"
    return _matrices(file, "adapter", token_indices=token_indices) if file.is_file() else []


def _role(key: str) -> str | None:
    parts = key.split(".")
    if parts[-1] not in ("weight", TRAINABLE_TOKENS) or "original_module" in parts:
        return None
    if any(part.startswith("lora_") for part in parts):
        return None
    names = set(parts)
    if names & INPUT_NAMES:
        return "input"
    return "output" if names & OUTPUT_NAMES else None


def _matrices(file: Path, where: str, wanted: list[str] | None = None, token_indices: object = None) -> list[Matrix]:
    from safetensors import safe_open

    found: list[Matrix] = []
    try:
        with safe_open(str(file), framework="pt") as handle:
            for key in wanted if wanted is not None else list(handle.keys()):
                role = _role(key)
                if role is None or key not in handle.keys():
                    continue
                shape = handle.get_slice(key).get_shape()
                if len(shape) != 2:
                    continue
                ids = _trainable_ids(key, token_indices) if key.endswith(TRAINABLE_TOKENS) else None
                if key.endswith(TRAINABLE_TOKENS) and (ids is None or len(ids) != shape[0]):
                    continue
                found.append(Matrix(role, where, file, key, int(shape[0]), ids))
    except Exception:
        return []  # unreadable weights: the check cannot judge from rows, and says nothing it cannot show
    return sorted(found, key=lambda m: m.ids is None)  # trainable-token rows replace a full matrix's rows


def _trainable_ids(key: str, token_indices: object) -> tuple[int, ...] | None:
    if isinstance(token_indices, list):
        return tuple(int(i) for i in token_indices) if "embed_tokens" in key or _role(key) == "input" else None
    if isinstance(token_indices, dict):
        for module, ids in token_indices.items():
            if f".{module}." in f".{key}" and isinstance(ids, list):
                return tuple(int(i) for i in ids)
    return None
