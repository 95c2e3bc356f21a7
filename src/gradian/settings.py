"""The settings of one `gradian attribute` run: one object from the CLI through the library to every artifact."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

QUERY_KINDS = (
    "departure-first", "departure", "repaired-first", "repaired", "contrastive-first", "contrastive", "naive"
)
PRECONDITIONERS = ("identity", "adam", "gauss-newton", "kfac", "ekfac")
CHECKPOINT_MODES = ("auto", "on", "off")
PROJ_BUDGETS = ("energy", "size")
RANKS = ("gradient", "combined")
ROW_HARMS = ("auto", "positions", "tokens", "sum")
AUTO_ROW_HARM = "positions"  # what auto reads where it can: the suite's dev rule chose it (BENCHMARKS.md)


def row_harm_of(row_harm: str, preconditioner: str, unit_norm_train: bool, *, tracin: bool) -> str:
    """How a row's harm is taken (`scores.token_harm`): positions, tokens or sum; auto reads `AUTO_ROW_HARM` where the
    effects are the final adapter's raw gradients with the identity preconditioner (what both read), else sum."""
    if row_harm != "auto":
        return row_harm
    return AUTO_ROW_HARM if not tracin and preconditioner == "identity" and not unit_norm_train else "sum"


@dataclass
class AttributeSettings:
    base_model: str = field(metadata={"help": "local folder, .gguf file or hub id in the local cache"})
    adapter: str = field(metadata={"help": "PEFT adapter folder (adapter_config.json + weights)"})
    dataset: str = field(metadata={"help": "the training JSONL the adapter was trained on"})
    eval_dataset: str = field(metadata={"help": "JSONL of eval prompts, with optional reference answers"})
    capability: str = field(metadata={"help": "json_formatting, exact_match, contains, regex:P, module:function …"})
    out: str = field(metadata={"help": "output folder; every stage is resumable in it"})
    run: str | None = field(default=None, metadata={"help": "training run folder (trainer_state.json, checkpoints)"})
    config: str | None = field(default=None, metadata={"help": "training config file (TRL SFTConfig or axolotl)"})
    query: str = field(default="naive", metadata={
        "help": f"query kind: {', '.join(QUERY_KINDS)}. naive (default): the gradient of the correct answer's "
                "log-likelihood; on the suite's dev half it ranked the culprits best of the seven kinds (combined, "
                "harmful positions: 0.882 mean culprit AUPRC vs 0.631 for repaired-first, BENCHMARKS.md)"})
    preconditioner: str = field(default="identity", metadata={"help": f"one of {', '.join(PRECONDITIONERS)}"})
    damping: float | None = field(default=None, metadata={
        "help": "damping of gauss-newton, kfac and ekfac, relative to the mean eigenvalue; None: the benchmark's"})
    unit_norm_train: bool = field(default=False, metadata={
        "help": "unit-normalise training gradients; off (default): only raw gradients can be ranked by their "
                "harmful tokens (--row-harm), and on summed effects raw ranked as well on the suite's dev half "
                "(combined, naive: 0.856 vs 0.851)"})
    checkpoints: str = field(default="off", metadata={
        "help": "TracIn-CP: sum effects over the run's checkpoint-*/ folders, weighted by learning rate; "
                "auto: when the run has them and the preconditioner is identity; on; off (default): the final "
                "adapter only. On the suite's dev half TracIn-CP cost 5x the backward passes and ranked no better "
                "(combined, naive, raw: 0.812 vs 0.825 on the four dev families that kept checkpoints), so the dev "
                "rule keeps the final adapter (BENCHMARKS.md)"})
    proj_dim: int | None = field(default=None, metadata={"help": "projected feature size; None: automatic"})
    proj_budget: str = field(default="energy", metadata={
        "help": "how proj_dim is shared over the LoRA matrices when they are projected: energy (shares ∝ each "
                "matrix's gradient energy on 64 sampled training rows, whose gradients extraction then reuses) or "
                "size (equal shares)"})
    rank: str = field(default="combined", metadata={
        "help": "how training rows are ranked: combined (default: on the suite's dev half 0.882 mean culprit AUPRC "
                "vs 0.813 for the gradient alone, BENCHMARKS.md; the harm's robust z plus 2x the "
                "TF-IDF and RepSim relevance to the failing prompts, each counted only as far as it picks out the "
                "gradient's most harmful rows: the gradient alone cannot tell cut rows from other "
                "categories' rows whose large gradients align with the queries, similarity alone cannot tell them "
                "from their clean neighbours) or gradient (the effect alone)"})
    row_harm: str = field(default="auto", metadata={
        "help": "a row's harm in the ranking: positions (its harmful positions alone, Σ_s max(0, h_s), h_s position "
                "s's part of vᵀ∇L, from the extraction's own backward pass; a culprit's right tokens, the rest of a "
                "valid answer, no longer cancel its wrong one; on the suite's dev half, combined: 0.882 mean culprit "
                "AUPRC vs 0.825 summed, gradient alone: 0.813 vs 0.714; the default costs 0.46 of the run's training "
                "epoch there, BENCHMARKS.md), tokens (its harmful tokens alone, Σ_t max(0, vᵀ∇ℓ_t), one more "
                "forward-mode pass: 0.870 and 0.814, at 1.04 epochs), sum (its effect, every token summed) or auto "
                "(default: positions where the effects are the final adapter's raw gradients with the identity "
                "preconditioner, else sum)"})
    n_clusters: int | None = field(default=None, metadata={"help": "number of clusters; None: automatic"})
    min_effect: float = field(default=0.0, metadata={"help": "smallest drop worth attributing (rate, 0-1)"})
    force: bool = field(default=False, metadata={"help": "attribute even inside the noise band"})
    max_new_tokens: int | None = field(default=None, metadata={"help": "None: from the references' lengths"})
    batch_size: int = field(default=16, metadata={"help": "generation and gradient batch size"})
    device: str | None = field(default=None, metadata={"help": "None: cuda when present, else cpu"})
    seed: int = field(default=0, metadata={"help": "seeds projections, bootstraps and clustering"})
    shard_rows: int = field(default=16384, metadata={
        "help": "rows per feature-store file; under torchrun each process writes whole files"})

    def __post_init__(self) -> None:
        if self.query not in QUERY_KINDS:
            raise ValueError(f"query must be one of {QUERY_KINDS}, not {self.query!r}")
        if self.preconditioner not in PRECONDITIONERS:
            raise ValueError(f"preconditioner must be one of {PRECONDITIONERS}, not {self.preconditioner!r}")
        if self.proj_budget not in PROJ_BUDGETS:
            raise ValueError(f"proj_budget must be one of {PROJ_BUDGETS}, not {self.proj_budget!r}")
        if self.rank not in RANKS:
            raise ValueError(f"rank must be one of {RANKS}, not {self.rank!r}")
        if self.row_harm not in ROW_HARMS:
            raise ValueError(f"row_harm must be one of {ROW_HARMS}, not {self.row_harm!r}")
        if self.row_harm in ("positions", "tokens") and (self.checkpoints != "off" or self.preconditioner != "identity"
                                                         or self.unit_norm_train):
            raise ValueError(f"row_harm {self.row_harm} reads the final adapter's raw gradients with the identity "
                             "preconditioner; with checkpoints, another preconditioner or unit-normalised gradients "
                             "use row_harm sum or auto")
        if self.checkpoints not in CHECKPOINT_MODES:
            raise ValueError(f"checkpoints must be one of {CHECKPOINT_MODES}, not {self.checkpoints!r}")
        if self.checkpoints == "on" and self.preconditioner != "identity":
            raise ValueError(f"checkpoints (TracIn-CP) uses the identity preconditioner, not {self.preconditioner!r}")
        if self.damping is not None and not self.damping > 0:
            raise ValueError(f"damping must be above 0, not {self.damping}")
        if not 0 <= self.min_effect <= 1:
            raise ValueError("min_effect is a rate between 0 and 1")
        for name in ("batch_size", "max_new_tokens", "proj_dim", "n_clusters", "shard_rows"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1, not {value}")
        if self.seed < 0:
            raise ValueError(f"seed must be 0 or more, not {self.seed}")

    @property
    def out_dir(self) -> Path:
        return Path(self.out)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


EXTRACT_FIELDS = ("base_model", "adapter", "dataset", "out", "run", "config", "preconditioner", "checkpoints",
                  "proj_dim", "proj_budget", "batch_size", "device", "seed", "shard_rows")


@dataclass
class ExtractSettings:
    """`gradian extract`: the training rows' features into `out`, as `attribute` computes them (it reuses them)."""

    base_model: str = field(metadata={"help": "local folder, .gguf file or hub id in the local cache"})
    adapter: str = field(metadata={"help": "PEFT adapter folder (adapter_config.json + weights)"})
    dataset: str = field(metadata={"help": "the training JSONL the adapter was trained on"})
    out: str = field(metadata={"help": "output folder; `gradian attribute --out` the same folder reuses the features"})
    run: str | None = field(default=None, metadata={"help": "training run folder (trainer_state.json, checkpoints)"})
    config: str | None = field(default=None, metadata={"help": "training config file (TRL SFTConfig or axolotl)"})
    preconditioner: str = field(default="identity", metadata={"help": f"one of {', '.join(PRECONDITIONERS)}"})
    checkpoints: str = field(default="auto", metadata={"help": "TracIn-CP checkpoints: auto, on or off"})
    proj_dim: int | None = field(default=None, metadata={"help": "projected feature size; None: automatic"})
    proj_budget: str = field(default="energy", metadata={"help": "energy or size, as for attribute"})
    batch_size: int = field(default=16, metadata={"help": "gradient batch size"})
    device: str | None = field(default=None, metadata={"help": "None: cuda when present, else cpu"})
    seed: int = field(default=0, metadata={"help": "seeds the projection"})
    shard_rows: int = field(default=16384, metadata={
        "help": "rows per feature-store file; under torchrun each process writes whole files"})

    def __post_init__(self) -> None:
        if self.preconditioner not in PRECONDITIONERS:
            raise ValueError(f"preconditioner must be one of {PRECONDITIONERS}, not {self.preconditioner!r}")
        if self.proj_budget not in PROJ_BUDGETS:
            raise ValueError(f"proj_budget must be one of {PROJ_BUDGETS}, not {self.proj_budget!r}")
        if self.checkpoints not in CHECKPOINT_MODES:
            raise ValueError(f"checkpoints must be one of {CHECKPOINT_MODES}, not {self.checkpoints!r}")
        if self.batch_size < 1 or self.shard_rows < 1 or (self.proj_dim is not None and self.proj_dim < 1):
            raise ValueError("batch_size, shard_rows and proj_dim must be at least 1")

    @property
    def out_dir(self) -> Path:
        return Path(self.out)

    @classmethod
    def of(cls, settings: AttributeSettings) -> ExtractSettings:
        """The extraction part of an `attribute` run's settings."""
        return cls(**{name: getattr(settings, name) for name in EXTRACT_FIELDS})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
