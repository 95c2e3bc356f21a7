"""How the verdict and the report word their numbers: shares, numbers, the regression, symptoms and checks."""

from __future__ import annotations

from typing import Any

import numpy as np

from gradian.regression.symptoms import Symptoms

SYMPTOM_PHRASES = {
    "stops-early": "stop early inside the structure (EOS before it closes)",
    "never-stops": "never stop (they run to the token limit)",
    "wrapped": "are wrapped in fences or prose around a valid answer",
    "wrong-fields": "are valid but have missing or renamed fields",
    "other": "fail in another way",
}

CHECK_PHRASES = {
    "truncated_completion": "completions truncated by the run's max length",
    "cut_in_data": "completions cut in the data itself",
    "missing_eos": "no EOS in the supervised tokens",
    "duplicate": "duplicated rows",
    "near_duplicate": "near-duplicate rows",
    "train_eval_overlap": "rows copied from the eval set",
    "prompt_loss": "loss on the prompt",
    "fails_capability": "completions that fail the capability themselves",
}


def measured(regression: dict[str, Any]) -> str:
    """The regression in one sentence: rates, difference, CI, p-value, n."""
    return (
        f"On {regression.get('capability', 'the capability')}, the fine-tuned model scores "
        f"{pct(regression.get('finetuned_rate'))} vs {pct(regression.get('base_rate'))} for the base model "
        f"(difference {pct(regression.get('delta'), signed=True)}, 95% CI {pct(regression.get('ci_low'), signed=True)} "
        f"to {pct(regression.get('ci_high'), signed=True)}, p = {number(regression.get('p_value'))}, "
        f"n = {regression.get('n', '?')} eval prompts)."
    )


def symptom_sentence(symptoms: Symptoms) -> str:
    """"90.0% of the 20 failing answers stop early ...", or the mix when no symptom dominates."""
    dominant = symptoms.dominant
    if dominant is None:
        mixed = ", ".join(f"{pct(symptoms.shares[s])} {s}" for s in symptoms.counts if symptoms.counts[s])
        return f"The {symptoms.n_failing} failing answers fail in mixed ways ({mixed})." if mixed else ""
    return (f"{pct(symptoms.shares[dominant])} of the {symptoms.n_failing} failing answers "
            f"{SYMPTOM_PHRASES[dominant]}.")


def pct(value: Any, *, signed: bool = False) -> str:
    """A share as a percentage with one decimal ("81.0%"), "n/a" when absent."""
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return "n/a"
    return f"{100 * float(value):+.1f}%" if signed else f"{100 * float(value):.1f}%"


def number(value: Any) -> str:
    """A number with 3 significant digits, "n/a" when absent."""
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return "n/a"
    return f"{float(value):.3g}"
