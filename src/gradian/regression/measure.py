"""Is there a regression? Generate from the base (adapter disabled) and the fine-tuned model, score, compare.

Writes into the output folder:
- `generations.jsonl`: one row per eval example (prompt, reference, both outputs and token ids, both scores);
- `generations.settings.json`: what the generations depend on (prompts, token limit, adapter weights, dtype).
  A rerun with the same settings reuses the generations and only rescores them (so a new capability is
  cheap); any other settings regenerate.
- `regression.json`: the summary (the `regression` block of report.json).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gradian.capabilities import Capability, get_capability, passed
from gradian.data.base_model import loaded_identity
from gradian.data.examples import Example
from gradian.data.render import render_prompt
from gradian.data.setup import TrainingSetup
from gradian.errors import InputError
from gradian.files import atomic_write
from gradian.gradients.hooks import lora_fingerprint
from gradian.regression.generation import GENERATION_BATCH, GeneratedAnswer, generate, stop_token_ids
from gradian.regression.statistics import RegressionSummary, compare

GENERATIONS = "generations.jsonl"
SETTINGS = "generations.settings.json"
SUMMARY = "regression.json"
DEFAULT_MAX_NEW_TOKENS = 256


@dataclass
class RegressionRow:
    """One eval example answered by both models."""

    id: str
    prompt: str
    prompt_ids: list[int]
    reference: str | None
    base: GeneratedAnswer
    finetuned: GeneratedAnswer
    base_score: float
    finetuned_score: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "prompt": self.prompt, "reference": self.reference,
            "base_output": self.base.text, "finetuned_output": self.finetuned.text,
            "base_ids": self.base.ids, "finetuned_ids": self.finetuned.ids,
            "base_score": self.base_score, "finetuned_score": self.finetuned_score,
            "base_stopped": self.base.stopped, "finetuned_stopped": self.finetuned.stopped,
            "prompt_ids": self.prompt_ids,
        }


@dataclass
class RegressionResult:
    rows: list[RegressionRow]
    summary: RegressionSummary
    cached: bool = False

    def explain(self) -> str:
        """One sentence with the numbers, e.g. '... inside the noise band, so Gradian does not attribute.'"""
        return self.summary.explain()

    def failures(self) -> list[RegressionRow]:
        """Rows where the fine-tuned model fails the capability (the queries attribution starts from)."""
        return [row for row in self.rows if not passed(row.finetuned_score)]


def measure_regression(
    model: Any,
    tokenizer: Any,
    eval_examples: Sequence[Example],
    capability: Capability | str,
    setup: TrainingSetup,
    out_dir: str | Path,
    *,
    max_new_tokens: int | None = None,
    batch_size: int = GENERATION_BATCH,
    progress: Callable[[int], Any] | None = None,
    seed: int = 0,
    min_effect: float = 0.0,
) -> RegressionResult:
    """Paired base-vs-fine-tuned comparison on `eval_examples`.

    `progress(n)` is called as answers finish, 2 × len(eval_examples) in all (base, then fine-tuned);
    `min_effect` is the smallest drop, as a fraction, that counts as a regression.
    """
    if isinstance(capability, str):
        capability = get_capability(capability)
    references = _check_eval_set(eval_examples, capability)
    prompts = [render_prompt(example, tokenizer, setup) for example in eval_examples]
    if max_new_tokens is None:
        max_new_tokens = default_max_new_tokens(tokenizer, references)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = _settings(model, tokenizer, eval_examples, prompts, max_new_tokens)
    cached = _read_cache(out_dir, settings, len(prompts))
    if cached is None:
        base, tuned = _generate_both(model, tokenizer, prompts, max_new_tokens, batch_size, progress)
    else:
        base, tuned = cached
    rows = [
        RegressionRow(example.id, example.prompt_text, prompt, reference, b, t,
                      capability.score(b.text, reference), capability.score(t.text, reference))
        for example, prompt, reference, b, t in zip(eval_examples, prompts, references, base, tuned, strict=True)
    ]
    summary = _summarise(rows, capability, min_effect, seed)
    _write(out_dir, rows, settings, summary)
    return RegressionResult(rows, summary, cached=cached is not None)


def _check_eval_set(examples: Sequence[Example], capability: Capability) -> list[str | None]:
    """The reference of every row; rows Gradian cannot prompt or score raise `InputError`."""
    if not examples:
        raise InputError("the eval set is empty; give at least one row with a prompt.")
    references = []
    for example in examples:
        if example.prompt is None or (isinstance(example.prompt, str) and not example.prompt.strip()):
            raise InputError("this eval row has no prompt; give prompt/completion, messages or instruction/output.",
                             example.source or None, example.line)
        reference = example.completion_text if example.completion is not None else None
        if reference is None and capability.needs_reference:
            raise InputError(f"this eval row has no reference answer, which {capability.name} needs; "
                             "add a completion or choose another capability.", example.source or None, example.line)
        references.append(reference)
    return references


def default_max_new_tokens(tokenizer: Any, references: Sequence[str | None]) -> int:
    """1.5 × the longest reference in tokens, plus 8 (room for EOS and small drift); 256 without references."""
    texts = [reference for reference in references if reference]
    if not texts:
        return DEFAULT_MAX_NEW_TOKENS
    longest = max(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])
    return int(1.5 * longest) + 8


def _generate_both(
    model: Any, tokenizer: Any, prompts: list[list[int]], max_new_tokens: int, batch_size: int,
    progress: Callable[[int], Any] | None,
) -> tuple[list[GeneratedAnswer], list[GeneratedAnswer]]:
    """Same prompts, same decoding: the base is the same PeftModel with its adapter switched off."""
    with model.disable_adapter():
        base = generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size,
                        progress=progress)
    tuned = generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size,
                     progress=progress)
    return base, tuned


def _summarise(rows: list[RegressionRow], capability: Capability, min_effect: float, seed: int) -> RegressionSummary:
    base = np.array([row.base_score for row in rows], dtype=np.float64)
    tuned = np.array([row.finetuned_score for row in rows], dtype=np.float64)
    return compare(
        base, tuned, binary=scores_are_binary(capability, base, tuned), min_effect=min_effect, seed=seed, capability=capability.name,
        base_stopped=[row.base.stopped for row in rows], finetuned_stopped=[row.finetuned.stopped for row in rows],
    )


def scores_are_binary(capability: Capability, *scores: np.ndarray) -> bool:
    """Pass/fail evidence (McNemar) when the capability is binary or every score is 0 or 1, else graded (Wilcoxon)."""
    return capability.binary or bool(np.all(np.isin(np.concatenate(scores), (0.0, 1.0))))


def _settings(
    model: Any, tokenizer: Any, examples: Sequence[Example], prompts: list[list[int]], max_new_tokens: int
) -> dict:
    """Everything the generations depend on; the capability is not here, since scoring is redone on every run."""
    return {
        "max_new_tokens": max_new_tokens,
        "decoding": "greedy",
        "ids": [example.id for example in examples],
        "prompts_sha256": _sha256(json.dumps(prompts).encode()),
        "base_model": loaded_identity(model),
        "adapter_sha256": lora_fingerprint(model),
        "dtype": str(next(model.parameters()).dtype),
        "stop_token_ids": stop_token_ids(model, tokenizer),
    }


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_cache(out_dir: Path, settings: dict, n: int) -> tuple[list[GeneratedAnswer], list[GeneratedAnswer]] | None:
    """Cached generations when they were made with exactly these settings, else None."""
    settings_file, rows_file = out_dir / SETTINGS, out_dir / GENERATIONS
    if not (settings_file.is_file() and rows_file.is_file()):
        return None
    try:
        if json.loads(settings_file.read_text(encoding="utf-8")) != settings:
            return None
        rows = [json.loads(line) for line in rows_file.read_text(encoding="utf-8").splitlines() if line.strip()]
        if [row["id"] for row in rows] != settings["ids"] or len(rows) != n:
            return None
        base = [GeneratedAnswer(row["base_ids"], row["base_output"], row["base_stopped"]) for row in rows]
        tuned = [GeneratedAnswer(row["finetuned_ids"], row["finetuned_output"], row["finetuned_stopped"]) for row in rows]
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError):
        return None  # a damaged cache is regenerated, never trusted
    return base, tuned


def _write(out_dir: Path, rows: list[RegressionRow], settings: dict, summary: RegressionSummary) -> None:
    """Rows first, settings last: a run killed in between leaves settings that do not vouch for the rows."""
    (out_dir / SETTINGS).unlink(missing_ok=True)
    atomic_write(out_dir / GENERATIONS, "".join(json.dumps(row.to_dict(), ensure_ascii=False) + "\n" for row in rows))
    atomic_write(out_dir / SUMMARY, json.dumps(summary.to_dict(), indent=2) + "\n")
    atomic_write(out_dir / SETTINGS, json.dumps(settings, indent=2) + "\n")
