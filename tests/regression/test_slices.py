"""A refusal's look inside (`regression.slice`): the eval category that dropped while the whole eval did not."""

from __future__ import annotations

import itertools

import pytest
from scipy.stats import binomtest

from gradian.data.examples import Example
from gradian.regression.generation import GeneratedAnswer
from gradian.regression.measure import RegressionRow
from gradian.regression.slices import MAX_CATEGORIES, worse_slice
from gradian.verdict.wording import no_regression


def answered(spec: dict[str, tuple[int, int, int]], field: str = "category") -> tuple[list[RegressionRow],
                                                                                      list[Example]]:
    """Eval rows per category: (broken, fixed, unchanged passing) answers."""
    rows, examples = [], []
    answer = GeneratedAnswer(text="", ids=[], stopped=True)
    for category, (broken, fixed, same) in spec.items():
        scores = [(1.0, 0.0)] * broken + [(0.0, 1.0)] * fixed + [(1.0, 1.0)] * same
        for base, tuned in scores:
            i = f"e{len(rows)}"
            rows.append(RegressionRow(i, "p", [], None, answer, answer, base, tuned))
            examples.append(Example(i, len(rows), {"prompt": "p"}, raw={"prompt": "p", field: category}))
    return rows, examples


def naive_holm(p: list[float]) -> list[float]:
    """Holm's adjusted p-values by the definition: the max over the smaller-or-equal of (m − rank) p, at most 1."""
    m = len(p)
    ranked = sorted(range(m), key=lambda i: p[i])
    out = [0.0] * m
    for position, i in enumerate(ranked):
        out[i] = min(1.0, max((m - k) * p[ranked[k]] for k in range(position + 1)))
    return out


def test_a_category_that_drops_while_the_whole_eval_improves_is_named():
    """The SmolLM2 swap shape: 22 account answers broken, 33 shipping ones fixed."""
    rows, examples = answered({"account": (22, 0, 26), "shipping": (0, 33, 15), "order": (0, 0, 48),
                               "refund": (0, 0, 48), "invoice": (0, 0, 48)})
    fell = worse_slice(rows, examples, binary=True)
    assert fell is not None and fell["value"] == "account" and fell["n"] == 48 and fell["categories"] == 5
    assert (fell["n_broken"], fell["n_fixed"]) == (22, 0)
    assert fell["p_value"] == pytest.approx(binomtest(22, 22).pvalue)
    alone = [binomtest(22, 22).pvalue, binomtest(0, 33).pvalue, 1.0, 1.0, 1.0]  # shipping's fix ranks first
    assert fell["p_holm"] == pytest.approx(naive_holm(alone)[0]) == pytest.approx(4 * alone[0])
    assert fell["ids"] == [r.id for r, e in zip(rows, examples, strict=True) if e.raw["category"] == "account"]
    text, action = no_regression({"capability": "c", "significant": False, "slice": fell, "base_rate": 0.86,
                                  "finetuned_rate": 0.9, "delta": 0.04, "n": 240})
    assert "whose category is 'account'" in text and "22 answers broken, 0 fixed" in text
    assert "after Holm over 5 categories" in text
    assert action.startswith("Rerun with --eval-dataset holding only the 48 eval rows whose category is 'account'")


def test_a_drop_significant_alone_but_not_after_holm_is_not_named():
    """6 of 6 one way is p = 0.031 alone; over 4 categories Holm makes it 0.125."""
    rows, examples = answered({"a": (6, 0, 10), "b": (0, 0, 16), "c": (0, 0, 16), "d": (0, 0, 16)})
    assert worse_slice(rows, examples, binary=True) is None
    rows, examples = answered({"a": (6, 0, 10), "b": (0, 0, 16)})  # 2 categories: 0.0625, still not
    assert worse_slice(rows, examples, binary=True) is None
    rows, examples = answered({"a": (9, 0, 10), "b": (0, 0, 16)})  # 9 of 9: 0.0039 alone, 0.0078 after Holm
    assert worse_slice(rows, examples, binary=True)["value"] == "a"


@pytest.mark.parametrize("spec, field", [({"a": (22, 0, 26)}, "category"),
                                         ({"a": (22, 0, 26), "b": (0, 0, 9)}, "topic")])
def test_no_look_inside_without_two_categories(spec, field):
    rows, examples = answered(spec, field=field)
    assert worse_slice(rows, examples, binary=True) is None


def test_a_field_with_a_value_a_row_names_rows_not_categories():
    rows, examples = answered({f"c{i}": (1, 0, 0) for i in range(MAX_CATEGORIES + 1)} | {"a": (22, 0, 0)})
    assert worse_slice(rows, examples, binary=True) is None
    rows, examples = answered({f"c{i}": (1, 0, 0) for i in range(MAX_CATEGORIES - 1)} | {"a": (22, 0, 0)})
    assert worse_slice(rows, examples, binary=True)["value"] == "a"  # 22 of 22: p = 4.8e-07, × 100 by Holm


def test_the_surest_drop_is_named_first():
    rows, examples = answered({"a": (10, 0, 5), "b": (20, 0, 5), "c": (0, 0, 5)})
    assert worse_slice(rows, examples, binary=True)["value"] == "b"


def test_the_hint_fits_the_report_schema():
    from gradian.report.rows import schema_validator
    from gradian.schemas import schema_problem

    rows, examples = answered({"account": (22, 0, 26), "shipping": (0, 0, 48)})
    fell = worse_slice(rows, examples, binary=True)
    block = {"capability": "c", "delta": 0.0, "significant": False}
    assert schema_problem(schema_validator("regression"), {**block, "slice": fell}) is None
    assert schema_problem(schema_validator("regression"), {**block, "slice": None}) is None
    assert schema_problem(schema_validator("regression"), {**block, "slice": {"value": 1}}) is not None


def test_categories_in_any_order_give_the_same_answer():
    spec = {"a": (3, 1, 10), "b": (12, 0, 4), "c": (0, 2, 8)}
    found = set()
    for order in itertools.permutations(spec):
        rows, examples = answered({k: spec[k] for k in order})
        fell = worse_slice(rows, examples, binary=True)
        found.add((fell["value"], round(fell["p_holm"], 12)))
    assert len(found) == 1
