"""Each retrained adapter measured as `attribute` measured the fine-tune: same eval prompts, same decoding, same
capability, and paired statistics against the original fine-tune and the base.

The eval prompts are the token ids `attribute` rendered (`generations.jsonl` of the report folder), the token limit
is the one it generated with (`generations.settings.json`), and the base and fine-tuned scores are its own, so a
retrain is compared with exactly the answers the report measured. Recovery is

    recovery = (capability after − fine-tuned) / (base − fine-tuned)

1 = the retrain is back at the base, 0 = no better than the fine-tune; its CI is a paired bootstrap over eval
prompts (each prompt keeps its base, fine-tuned and retrained score together).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from gradian.capabilities import Capability
from gradian.errors import InputError
from gradian.files import atomic_write
from gradian.regression.generation import GENERATION_BATCH, generate
from gradian.regression.measure import GENERATIONS, SETTINGS
from gradian.regression.statistics import N_RESAMPLES

SCORES = "scores.json"


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
    """(after − fine-tuned) / (base − fine-tuned) with a paired bootstrap CI; None when nothing was lost."""
    gained = np.asarray(after, dtype=np.float64) - original.finetuned  # (n,)
    lost = original.base - original.finetuned  # (n,)
    if lost.mean() <= 0:
        return Recovery(None, None)
    value = float(gained.mean() / lost.mean())

    def ratio(g: np.ndarray, l: np.ndarray, axis: int = -1) -> np.ndarray:  # noqa: E741
        total = l.mean(axis=axis)
        return np.where(total > 0, g.mean(axis=axis) / np.where(total > 0, total, 1.0), 0.0)

    if np.all(gained == gained[0]) and np.all(lost == lost[0]):
        return Recovery(value, (value, value))
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():  # a degenerate BCa interval is not finite: the percentile one is used then
            warnings.simplefilter("ignore", RuntimeWarning)
            warnings.simplefilter("ignore", stats.DegenerateDataWarning)
            result = stats.bootstrap((gained, lost), ratio, paired=True, vectorized=True, method=method,
                                     confidence_level=confidence, n_resamples=N_RESAMPLES,
                                     rng=np.random.default_rng(seed))
        low, high = result.confidence_interval
        if np.isfinite(low) and np.isfinite(high):
            return Recovery(value, (float(low), float(high)))
    return Recovery(value, (value, value))


def mean_scores(scores: Sequence[np.ndarray]) -> np.ndarray:
    """(n,) per-prompt mean over several retrains (the controls), so their recovery has one paired CI."""
    return np.mean(np.stack([np.asarray(s, dtype=np.float64) for s in scores]), axis=0)
