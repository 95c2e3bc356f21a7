"""Each retrained adapter measured as `attribute` measured the fine-tune: same eval prompts, same decoding, same
capability, and paired statistics against the original fine-tune and the base.

The eval prompts are the token ids `attribute` rendered (`generations.jsonl` of the report folder), the token limit
is the one it generated with (`generations.settings.json`), and the base and fine-tuned scores are its own, so a
retrain is compared with exactly the answers the report measured. Recovery is

    recovery = (capability after − fine-tuned) / (base − fine-tuned)

1 = the retrain is back at the base, 0 = no better than the fine-tune. Its CI is the posterior of that ratio when
the prompts are a draw from a population of (base, fine-tuned, after) score triples with a Dirichlet process prior
whose base measure is the 8 corners of the score cube, ½ each (Jeffreys' ½ a cell for pass/fail scores). Each prompt
keeps its three scores together, as in a paired bootstrap, but the corners stand for the prompts not seen: a retrain
that fixed the 8 answers of 40 the fine-tune broke reads 100% (62% to 159%), where a bootstrap, which resamples only
what was seen, read 100% to 100%. In simulated retrains (`benchmarks/studies/recovery_coverage.py`, BENCHMARKS.md)
the bootstrap held the true recovery in as few as 11% of draws, this interval in at least 95%; ½ a corner is the
smallest weight of ½, ¼ and ⅛ that held it in every cell.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gradian.capabilities import Capability
from gradian.errors import InputError
from gradian.files import atomic_write
from gradian.regression.generation import GENERATION_BATCH, generate
from gradian.regression.measure import GENERATIONS, SETTINGS
from gradian.regression.statistics import N_RESAMPLES

SCORES = "scores.json"
CORNERS = np.array([(b, f, a) for b in (0.0, 1.0) for f in (0.0, 1.0) for a in (0.0, 1.0)])  # (8, 3)
PRIOR = 0.5  # each corner's weight in the prior: ½ a cell, Jeffreys' for pass/fail scores
DRAWS_PER_BLOCK = 1000


@dataclass
class Original:
    """What `attribute` measured: one row per eval prompt."""

    ids: list[str]
    prompt_ids: list[list[int]]
    references: list[str | None]
    base: np.ndarray  # (n,) base scores
    finetuned: np.ndarray  # (n,) fine-tuned scores
    max_new_tokens: int


def read_original(report_dir: Path, capability: Capability) -> Original:
    """The report's generations, rescored with `capability` (as `attribute` rescores a cached run); a row or setting
    out of shape is an `InputError` naming the file (and line)."""
    rows_file, settings_file = report_dir / GENERATIONS, report_dir / SETTINGS
    try:
        lines = rows_file.read_text(encoding="utf-8").splitlines()
        settings = json.loads(settings_file.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        raise InputError(f"has no readable {GENERATIONS} / {SETTINGS}; rerun `gradian attribute` into it first.",
                         report_dir) from None
    max_new_tokens = settings.get("max_new_tokens") if isinstance(settings, dict) else None
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise InputError("has no max_new_tokens (a positive whole number); rerun `gradian attribute` into its folder.",
                         settings_file)
    rows = [_generation(line, rows_file, number) for number, line in enumerate(lines, start=1) if line.strip()]
    if not rows:
        raise InputError(f"{GENERATIONS} holds no eval rows; rerun `gradian attribute` into it.", report_dir)
    return Original(
        ids=[row["id"] for row in rows], prompt_ids=[list(row["prompt_ids"]) for row in rows],
        references=[row["reference"] for row in rows],
        base=np.array([capability.score(row["base_output"], row["reference"]) for row in rows], dtype=np.float64),
        finetuned=np.array([capability.score(row["finetuned_output"], row["reference"]) for row in rows],
                           dtype=np.float64),
        max_new_tokens=max_new_tokens,
    )


def _generation(line: str, path: Path, number: int) -> dict[str, Any]:
    """One line of generations.jsonl: an id, the prompt's token ids, the reference and both models' answers."""
    try:
        row = json.loads(line)
    except (ValueError, RecursionError):
        row = None
    ids = row.get("prompt_ids") if isinstance(row, dict) else None
    fine = (isinstance(row, dict) and isinstance(row.get("id"), str) and isinstance(ids, list) and ids
            and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)
            and isinstance(row.get("reference", ""), (str, type(None)))
            and all(isinstance(row.get(name), str) for name in ("base_output", "finetuned_output")))
    if not fine:
        raise InputError("is not a generation row (id, prompt_ids, reference, base_output, finetuned_output); the "
                         "file was cut or edited: rerun `gradian attribute` into its folder.", path, number)
    return {**row, "reference": row.get("reference")}


def measure_adapter(
    folder: Path,
    base: Any,
    original: Original,
    capability: Capability,
    *,
    device: str,
    batch_size: int = GENERATION_BATCH,
    progress: Callable[[int], Any] | None = None,
) -> np.ndarray:
    """(n,) scores of the retrained adapter in `folder` on the report's eval prompts; cached in `folder`, keyed by
    the prompts' tokens and references as well as their ids: a report attributed again on edited eval rows with the
    same ids measures the retrain again."""
    from gradian.regression.loading import load_models

    cache = folder / SCORES
    prompts = hashlib.sha256(json.dumps([original.prompt_ids, original.references]).encode()).hexdigest()
    key = {"ids": original.ids, "prompts_sha256": prompts, "max_new_tokens": original.max_new_tokens,
           "capability": capability.name, "device": device}
    try:
        cached = json.loads(cache.read_text(encoding="utf-8"))
        if cached["key"] == key:
            return np.array(cached["scores"], dtype=np.float64)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    model, tokenizer = load_models(base, folder, device=device)  # the dtype attribute measured with
    answers = generate(model, tokenizer, original.prompt_ids, max_new_tokens=original.max_new_tokens,
                       batch_size=batch_size, progress=progress)
    scores = [capability.score(a.text, ref) for a, ref in zip(answers, original.references, strict=True)]
    atomic_write(cache, json.dumps({"key": key, "scores": scores, "outputs": [a.text for a in answers]}) + "\n")
    return np.array(scores, dtype=np.float64)


@dataclass
class Recovery:
    value: float | None
    ci: tuple[float, float] | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"ci": list(self.ci) if self.ci is not None else None}


def recovery(after: np.ndarray, original: Original, seed: int = 0, confidence: float = 0.95) -> Recovery:
    """(after − fine-tuned) / (base − fine-tuned) with its posterior interval (module docstring); None when nothing
    was lost."""
    gained = np.asarray(after, dtype=np.float64) - original.finetuned  # (n,)
    lost = original.base - original.finetuned  # (n,)
    if lost.mean() <= 0:
        return Recovery(None, None)
    value = float(gained.mean() / lost.mean())
    return Recovery(value, ratio_interval(gained, lost, np.random.default_rng(seed), confidence))


def ratio_interval(gained: np.ndarray, lost: np.ndarray, rng: np.random.Generator, confidence: float = 0.95,
                   prior: float = PRIOR) -> tuple[float, float]:
    """Equal-tailed posterior interval of Σ w·gained / Σ w·lost, w ~ Dirichlet(1 a prompt, `prior` a corner), over
    the draws whose loss is above 0 (a recovery is of a loss). `gained`, `lost` (n,)."""
    gain = np.r_[gained, CORNERS[:, 2] - CORNERS[:, 1]]  # (n + 8,)
    loss = np.r_[lost, CORNERS[:, 0] - CORNERS[:, 1]]  # (n + 8,)
    shape = np.r_[np.ones(len(gained)), np.full(len(CORNERS), prior)]  # (n + 8,)
    ratios = []
    for start in range(0, N_RESAMPLES, DRAWS_PER_BLOCK):
        w = rng.gamma(shape, size=(min(DRAWS_PER_BLOCK, N_RESAMPLES - start), len(shape)))  # (B, n + 8), unnormalised
        total_gained, total_lost = w @ gain, w @ loss  # (B,): the Dirichlet's normalisation cancels in the ratio
        ratios.append(total_gained[total_lost > 0] / total_lost[total_lost > 0])
    drawn = np.concatenate(ratios)
    tail = (1 - confidence) / 2
    return float(np.quantile(drawn, tail)), float(np.quantile(drawn, 1 - tail))


def mean_scores(scores: Sequence[np.ndarray]) -> np.ndarray:
    """(n,) per-prompt mean over several retrains (the controls), so their recovery has one paired CI."""
    return np.mean(np.stack([np.asarray(s, dtype=np.float64) for s in scores]), axis=0)
