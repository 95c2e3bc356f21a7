"""A refusal's look inside: did one category of eval prompts drop while the whole eval did not?

A fine-tune can get worse at one thing and better at another, so the whole eval moves inside its noise band while
one kind of prompt falls: a SmolLM2 swap scenario lost 22 of 48 account answers and fixed 33 shipping ones, and the
whole eval read +4.6% (p = 0.18). Where the eval rows say what they ask about (a `category` field, in 2 to
MAX_CATEGORIES values), each category's answers are tested by the same exact paired test as the whole
(`statistics.compare`), Holm-corrected over the categories, and a refusal names the one that drops most surely
(`regression.slice` in report.json) with the rerun that attributes it: the same command on those eval rows alone.
A hint, never a verdict.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from gradian.data.examples import Example
from gradian.regression.statistics import compare, holm

SLICE_FIELD = "category"
ALPHA = 0.05  # the family-wise error over the categories, as the whole eval's 95% test
MAX_CATEGORIES = 100  # a field with more values names rows, not kinds of prompt (and Holm over them detects nothing)


def worse_slice(rows: Sequence[Any], examples: Sequence[Example], *, binary: bool) -> dict[str, Any] | None:
    """The eval category whose answers drop significantly after Holm over every category, the surest first, as
    `{field, value, n, base_rate, finetuned_rate, delta, p_value, p_holm, categories, n_broken, n_fixed, ids}`; None
    when the eval rows carry no `category` in 2 to MAX_CATEGORIES values or none drops. `rows` are
    `measure.RegressionRow`s in the order of `examples`."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, example in enumerate(examples):
        value = example.raw.get(SLICE_FIELD)
        if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value):
            groups[str(value)].append(i)
    if not 2 <= len(groups) <= MAX_CATEGORIES:
        return None
    tests = []
    for value, index in groups.items():
        base = [float(rows[i].base_score) for i in index]  # (n_c,)
        tuned = [float(rows[i].finetuned_score) for i in index]  # (n_c,)
        tests.append((value, index, compare(base, tuned, binary=binary)))
    adjusted = holm([summary.p_value for _, _, summary in tests])  # (categories,)
    dropped = [(p, value, index, summary) for p, (value, index, summary) in zip(adjusted, tests, strict=True)
               if summary.delta < 0 and p < ALPHA]
    if not dropped:
        return None
    p_holm, value, index, summary = min(dropped, key=lambda d: (d[0], d[3].delta, d[1]))
    return {"field": SLICE_FIELD, "value": value, "n": len(index), "base_rate": summary.base_rate,
            "finetuned_rate": summary.finetuned_rate, "delta": summary.delta, "p_value": summary.p_value,
            "p_holm": float(p_holm), "categories": len(groups), "n_broken": summary.n_broken,
            "n_fixed": summary.n_fixed, "ids": [rows[i].id for i in index]}
