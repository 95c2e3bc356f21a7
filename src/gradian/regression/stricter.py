"""A refusal's second look: did the answers move on what the chosen capability does not check?

`json_formatting` passes any JSON object, so a fine-tune whose answers lost a field, or swapped a value, passes it as
well as the base did, and `attribute` answers "no regression". The answers are already generated; rescoring them
with a stricter check against the same references costs nothing. Where one finds a significant drop by the same
exact paired test, the refusal says so and names the capability to rerun with (`regression.stricter` in
report.json). A hint, never a verdict: the user's capability still decides.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gradian.capabilities import Capability, get_capability
from gradian.regression.statistics import compare

# the capabilities to try after each, the nearest first; any other with references on every row tries exact_match
STRICTER = {"json_formatting": ("json_formatting:keys", "exact_match"), "json_formatting:keys": ("exact_match",)}


def stricter_drop(rows: Sequence[Any], capability: Capability) -> dict[str, Any] | None:
    """The first stricter capability on which the same answers drop significantly (the exact paired test), as
    `{capability, base_rate, finetuned_rate, delta, p_value, n_broken, n_fixed}`; None when none does or some row
    has no reference. `rows` are `measure.RegressionRow`s: base and fine-tuned answers with their reference."""
    references = [row.reference for row in rows]
    if not rows or any(reference is None for reference in references):
        return None
    for name in STRICTER.get(capability.name, ("exact_match",)):
        if name == capability.name:
            continue
        stricter = get_capability(name)
        base = [stricter.score(row.base.text, row.reference) for row in rows]  # (n,)
        tuned = [stricter.score(row.finetuned.text, row.reference) for row in rows]  # (n,)
        summary = compare(base, tuned, binary=True, capability=name)
        if summary.significant:
            return {"capability": name, "base_rate": summary.base_rate, "finetuned_rate": summary.finetuned_rate,
                    "delta": summary.delta, "p_value": summary.p_value, "n_broken": summary.n_broken,
                    "n_fixed": summary.n_fixed}
    return None
