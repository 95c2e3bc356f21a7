"""Settings of gradient extraction: one dataclass, validated, saved as JSON beside the feature store."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

STORE_DTYPES = ("float16", "float32")


@dataclass
class GradientSettings:
    proj_dim: int | None = field(
        default=8192,
        metadata={"help": "floats per example after projection (8192 fp16 = 16 KB); None = exact LoRA gradients"},
    )
    seed: int = field(default=0, metadata={"help": "seed of the random projection (recorded; queries reuse it)"})
    batch_size: int = field(default=16, metadata={"help": "most rows in one forward/backward"})
    max_tokens: int = field(default=16384, metadata={"help": "most padded tokens (rows × longest row) in one batch"})
    store_dtype: str = field(default="float16", metadata={"help": "dtype of features on disk: float16 | float32"})
    padding_side: str = field(default="right", metadata={"help": "right | left; results agree up to rounding"})
    shard_rows: int = field(default=16384, metadata={
        "help": "rows per store file; a file has one writer, so processes split the rows file by file"})
    budget_weights: tuple[float, ...] | None = field(default=None, metadata={
        "help": "share of proj_dim per LoRA matrix, PEFT's order (gradient energy, see gradients.energy); None: equal"})

    def __post_init__(self) -> None:
        if self.proj_dim is not None and self.proj_dim < 1:
            raise ValueError(f"proj_dim must be a positive number of floats or None, got {self.proj_dim}")
        if self.batch_size < 1 or self.max_tokens < 1 or self.shard_rows < 1:
            raise ValueError("batch_size, max_tokens and shard_rows must be at least 1")
        if self.store_dtype not in STORE_DTYPES:
            raise ValueError(f"store_dtype must be one of {STORE_DTYPES}, got {self.store_dtype!r}")
        if self.padding_side not in ("left", "right"):
            raise ValueError(f"padding_side must be 'left' or 'right', got {self.padding_side!r}")

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        if self.budget_weights is not None:  # as JSON reads it back, so a store's settings compare equal
            values["budget_weights"] = list(self.budget_weights)
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> GradientSettings:
        """The settings `to_dict` wrote (a store's settings.json holds them)."""
        weights = values.get("budget_weights")
        return cls(**{**values, "budget_weights": tuple(weights) if weights is not None else None})
