"""The settings of a run: one object from the CLI through the library to every artifact.

`ExtractSettings` is what extraction reads (`gradian extract`); `AttributeSettings` extends it with what
`gradian attribute` adds (the eval rows, the capability, the query, the ranking), so each shared field, its help and
its validation exist once. Choices are `Literal` types a type checker sees; the CLI's options are generated from
the fields (`cli.options.settings_options`), and `--help` says why a default is what it is. The benchmark numbers
behind each default live in BENCHMARKS.md, not here: they change when the suite is measured again.
"""

from __future__ import annotations

import typing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args

QueryKind = Literal[
    "departure-first", "departure", "repaired-first", "repaired", "contrastive-first", "contrastive", "naive"
]
PreconditionerName = Literal["identity", "adam", "gauss-newton", "kfac", "ekfac"]
CheckpointMode = Literal["auto", "on", "off", "captured"]
ProjBudget = Literal["energy", "size"]
RankRule = Literal["gradient", "combined", "activation"]
RowHarm = Literal["auto", "positions", "tokens", "sum"]
ModelDtype = Literal["auto", "float32", "bfloat16", "float16"]

QUERY_KINDS: tuple[str, ...] = get_args(QueryKind)
PRECONDITIONERS: tuple[str, ...] = get_args(PreconditionerName)
CHECKPOINT_MODES: tuple[str, ...] = get_args(CheckpointMode)
PROJ_BUDGETS: tuple[str, ...] = get_args(ProjBudget)
RANKS: tuple[str, ...] = get_args(RankRule)
ROW_HARMS: tuple[str, ...] = get_args(RowHarm)
MAX_SEED = 2**32 - 1  # numpy's and scikit-learn's seeds stop here
GENERATION_BATCH = 64  # prompts a batch when models answer (`regression.generation`, which halves it on out of memory)
AUTO_ROW_HARM = "positions"  # what auto reads where it can: the suite's dev rule chose it (BENCHMARKS.md)


def row_harm_of(row_harm: str, preconditioner: str, unit_norm_train: bool, *, tracin: bool) -> str:
    """How a row's harm is taken (`scores.token_harm`): positions, tokens or sum; auto reads `AUTO_ROW_HARM` where the
    effects are the final adapter's raw gradients with the identity preconditioner (what both read), else sum."""
    if row_harm != "auto":
        return row_harm
    return AUTO_ROW_HARM if not tracin and preconditioner == "identity" and not unit_norm_train else "sum"


def choices(cls: type, name: str) -> tuple[str, ...]:
    """The values a `Literal` field of settings class `cls` takes; () for any other field."""
    kind = typing.get_type_hints(cls)[name]
    return get_args(kind) if typing.get_origin(kind) is Literal else ()


@dataclass
class ExtractSettings:
    """`gradian extract`: the training rows' features into `out`, as `attribute` computes them (it reuses them)."""

    base_model: str = field(metadata={"help": "local folder, .gguf file or hub id in the local cache"})
    adapter: str = field(metadata={"help": "PEFT adapter folder (adapter_config.json + weights)"})
    dataset: str = field(metadata={"help": (
        "the training rows the adapter was trained on (JSONL, a JSON array, either gzip-compressed, Parquet, or a "
        "save_to_disk folder)")})
    out: str = field(metadata={"help": "output folder; every stage is resumable in it, and `gradian attribute` "
                                       "into a folder `gradian extract` filled reuses its features"})
    run: str | None = field(default=None, metadata={"help": "training run folder (trainer_state.json, checkpoints)"})
    config: str | None = field(default=None, metadata={"help": "training config file (TRL SFTConfig or axolotl)"})
    preconditioner: PreconditionerName = field(default="identity", metadata={
        "help": "P in the effect −qᵀPg: identity (default: the only one whose effects split by position or token, "
                "--row-harm), adam (the run's optimizer state), gauss-newton, kfac or ekfac (curvature fitted on "
                "the training rows)"})
    checkpoints: CheckpointMode = field(default="off", metadata={
        "help": "TracIn-CP: sum effects over the run's checkpoint-*/ folders, weighted by learning rate; auto: when "
                "the run has them and the preconditioner is identity; on; off (default): the final adapter only, "
                "because on the suite the checkpoints cost a backward pass each and ranked no better "
                "(BENCHMARKS.md); captured: TracIn over the steps each row trained at, from the gradients "
                "GradianCallback(capture=True) took in training (the run folder's gradian_capture/), with no "
                "extraction pass"})
    adapter_scale: float = field(default=1.0, metadata={"min": 0.0, "max": 1.0, "help": (
        "read the gradients with every LoRA B matrix times this: 1 (default) the fine-tune itself; below 1 a point "
        "on the way from the base (B starts at 0), where a row the base already answers alike carries less of the "
        "harm. 0.75 ranked best on the real-model suite's dev half and worst on the tiny proxy's cut and fenced "
        "families (BENCHMARKS.md); the final adapter only, not TracIn-CP or --rank activation")})
    proj_dim: int | None = field(default=None, metadata={"min": 1, "help": "projected feature size; None: automatic"})
    proj_budget: ProjBudget = field(default="energy", metadata={
        "help": "how proj_dim is shared over the LoRA matrices when they are projected: energy (shares ∝ each "
                "matrix's gradient energy on 64 sampled training rows, whose gradients extraction then reuses) or "
                "size (equal shares)"})
    batch_size: int = field(default=16, metadata={"min": 1, "help": "gradient batch size (rows a backward pass)"})
    device: str | None = field(default=None, metadata={"help": "None: cuda when present, else cpu"})
    dtype: ModelDtype = field(default="auto", metadata={
        "help": "the model's dtype: auto (bfloat16 on CUDA, else float32), float32, bfloat16 or float16"})
    gradient_check: bool = field(default=True, metadata={
        "help": "before any row is ranked, compare a few rows' gradients as the run takes them (batched, padded, "
                "in the model's dtype) with the same rows' taken alone, unpadded, in float32, and refuse when they "
                "disagree (bf16 rounding or a padding fault would rank noise); --no-gradient-check ranks without it"})
    seed: int = field(default=0, metadata={"min": 0, "max": MAX_SEED,
                                           "help": "seeds projections, bootstraps and clustering"})
    shard_rows: int = field(default=16384, metadata={"min": 1,
        "help": "rows per feature-store file; under torchrun each process writes whole files"})

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def out_dir(self) -> Path:
        return Path(self.out)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_fields(settings: Any) -> None:
    """Every field of a settings dataclass within what its type and metadata allow: a `Literal` field one of its
    choices, a field with a `min` or `max` (None or) within it; the CLI's choices and ranges come from the same
    place."""
    for spec in fields(settings):
        allowed, least, value = choices(type(settings), spec.name), spec.metadata.get("min"), getattr(settings, spec.name)
        most = spec.metadata.get("max")
        if allowed and value not in allowed:
            raise ValueError(f"{spec.name} must be one of {allowed}, not {value!r}")
        if least is not None and value is not None and value < least:
            raise ValueError(f"{spec.name} must be {'0 or more' if least == 0 else f'at least {least}'}, not {value}")
        if most is not None and value is not None and value > most:
            raise ValueError(f"{spec.name} must be at most {most}, not {value}")


@dataclass
class AttributeSettings(ExtractSettings):
    """`gradian attribute`: extraction's settings, and the eval rows, the capability, the query and the ranking."""

    eval_dataset: str = field(kw_only=True, metadata={
        "help": "JSONL of eval prompts, with optional reference answers"})
    capability: str = field(kw_only=True, metadata={
        "help": "json_formatting, exact_match, contains, regex:P, module:function …"})
    query: QueryKind = field(default="naive", metadata={
        "help": "query kind: where y⁺ comes from and how it is contrasted with the failing answer y⁻. naive "
                "(default): the gradient of the correct answer's log-likelihood, the kind that ranked the "
                "culprits best on the suite's dev half once the rows' harm is read at their harmful positions "
                "(BENCHMARKS.md)"})
    damping: float | None = field(default=None, metadata={
        "help": "damping of gauss-newton, kfac and ekfac, relative to the mean eigenvalue; None: the benchmark's"})
    unit_norm_train: bool = field(default=False, metadata={
        "help": "unit-normalise training gradients; off (default): only raw gradients can be ranked by their "
                "harmful positions or tokens (--row-harm), and on summed effects raw ranked as well"})
    rank: RankRule = field(default="gradient", metadata={
        "help": "how training rows are ranked: gradient (default: the harm alone; chosen on the real-model suite's "
                "dev half, SmolLM2-135M, where relevance to the failing prompts, mostly about the first cause, hid "
                "part of a second one) or combined (the harm's robust z plus the TF-IDF and RepSim relevance to the "
                "failing prompts, each counted only as far as it picks out the gradient's most harmful rows: for "
                "models so small that large unrelated gradients outrank the culprits; BENCHMARKS.md) or activation "
                "(the cosine of what each row's completion changes in the base model's middle-layer hidden state, "
                "against its own greedy answer, with the change from the references to the fine-tune's failing "
                "answers; needs reference answers on the failing eval rows, generates the base's answer to every "
                "training prompt once, kept in the output folder; not yet measured on the suite)"})
    row_harm: RowHarm = field(default="auto", metadata={
        "help": "a row's harm in the ranking: positions (its harmful positions alone, Σ_s max(0, h_s), from the "
                "extraction's own backward pass: a culprit's right tokens, the rest of a valid answer, no longer "
                "cancel its wrong one), tokens (its harmful tokens alone, Σ_t max(0, vᵀ∇ℓ_t), one more forward-mode "
                "pass), sum (its effect, every token summed) or auto (default: positions where the effects are the "
                "final adapter's raw gradients with the identity preconditioner, else sum)"})
    n_clusters: int | None = field(default=None, metadata={"min": 1, "help": "number of clusters; None: automatic"})
    min_effect: float = field(default=0.0, metadata={"help": "smallest drop worth attributing (rate, 0-1)"})
    force: bool = field(default=False, metadata={"help": "attribute even inside the noise band"})
    max_new_tokens: int | None = field(default=None, metadata={"min": 1, "help": "None: from the references' lengths"})
    generation_batch_size: int = field(default=GENERATION_BATCH, metadata={"min": 1, "help": (
        "prompts a batch when the base and fine-tuned models answer (halved while a batch runs out of memory): "
        "on one CPU thread, 64 took 0.56x the time of 16 on SmolLM2-135M (BENCHMARKS.md)")})
    served_outputs: str | None = field(default=None, metadata={
        "help": "JSONL of the fine-tune's answers as served ({\"id\": eval row id, \"output\": text}, one per eval "
                "row): Gradian measures the served regression beside its own and explains a drop only serving "
                "shows (docs/serving.md)"})
    served_base_outputs: str | None = field(default=None, metadata={
        "help": "the same JSONL for the base model as served; None: Gradian's own base answers are the base side"})
    served_model: str | None = field(default=None, metadata={
        "folder": True, "help": "the exported model folder as served (config.json, generation_config.json, tokenizer "
                                "files with the chat template; weights not needed): its stop tokens, token limit "
                                "and template are diffed against training's"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.row_harm in ("positions", "tokens") and (self.checkpoints != "off" or self.preconditioner != "identity"
                                                         or self.unit_norm_train):
            raise ValueError(f"row_harm {self.row_harm} reads the final adapter's raw gradients with the identity "
                             "preconditioner; with checkpoints, another preconditioner or unit-normalised gradients "
                             "use row_harm sum or auto")
        if self.checkpoints in ("on", "captured") and self.preconditioner != "identity":
            raise ValueError(f"checkpoints {self.checkpoints} (TracIn) uses the identity preconditioner (captured "
                             f"gradients hold the run's own Adam scaling), not {self.preconditioner!r}")
        if self.damping is not None and not self.damping > 0:
            raise ValueError(f"damping must be above 0, not {self.damping}")
        if not 0 <= self.min_effect <= 1:
            raise ValueError("min_effect is a rate between 0 and 1")
        if self.served_outputs is None and (self.served_base_outputs is not None or self.served_model is not None):
            raise ValueError("served_base_outputs and served_model describe the served fine-tune: give its answers "
                             "with served_outputs too")
