"""A refusal's second look (`regression.stricter`): the same answers rescored on a stricter capability."""

from __future__ import annotations

import pytest

from gradian.capabilities import get_capability
from gradian.regression.generation import GeneratedAnswer
from gradian.regression.measure import RegressionRow
from gradian.regression.stricter import stricter_drop
from gradian.verdict.wording import no_regression

SEAT = '{"action": "change_seat", "flight": "CL248", "row": 20}'
SHORT = '{"action": "change_seat", "flight": "CL248"}'


def rows(broken: int, kept: int, *, reference: str | None = SEAT) -> list[RegressionRow]:
    """`broken` prompts whose fine-tuned answer lost the `row` field (valid JSON still), `kept` answered alike."""
    def row(i: int, tuned: str) -> RegressionRow:
        answer = GeneratedAnswer(text=SEAT, ids=[], stopped=True)
        return RegressionRow(f"e{i}", "p", [], reference, answer, GeneratedAnswer(text=tuned, ids=[], stopped=True),
                             1.0, 1.0)
    return [row(i, SHORT) for i in range(broken)] + [row(broken + i, SEAT) for i in range(kept)]


def test_a_dropped_field_json_formatting_passes_is_named_on_keys():
    moved = stricter_drop(rows(6, 34), get_capability("json_formatting"))
    assert moved == {"capability": "json_formatting:keys", "base_rate": 1.0, "finetuned_rate": 34 / 40,
                     "delta": pytest.approx(-6 / 40), "p_value": pytest.approx(2 * 0.5 ** 6), "n_broken": 6,
                     "n_fixed": 0}
    text, next_action = no_regression({"capability": "json_formatting", "significant": False, "stricter": moved,
                                       "base_rate": 1.0, "finetuned_rate": 1.0, "delta": 0.0, "n": 40})
    assert "on json_formatting:keys (the same answers, the same references)" in text and "6 answers broken" in text
    assert next_action.startswith("Rerun with --capability json_formatting:keys")


def test_no_hint_inside_the_stricter_noise_band_or_without_references():
    assert stricter_drop(rows(5, 35), get_capability("json_formatting")) is None  # 5 of 5 one way: p = 0.0625
    assert stricter_drop(rows(6, 34, reference=None), get_capability("json_formatting")) is None
    assert stricter_drop(rows(0, 40), get_capability("exact_match")) is None  # nothing stricter moved


def test_keys_kept_but_a_value_swapped_is_named_on_exact_match():
    swapped = [RegressionRow(r.id, r.prompt, [], r.reference, r.base,
                             GeneratedAnswer(text=SEAT.replace("20", "21"), ids=[], stopped=True), 1.0, 1.0)
               for r in rows(0, 8)]
    moved = stricter_drop(swapped + rows(0, 32), get_capability("json_formatting:keys"))
    assert moved is not None and moved["capability"] == "exact_match" and moved["n_broken"] == 8


def test_the_hint_fits_the_report_schema():
    from gradian.report.rows import schema_validator
    from gradian.schemas import schema_problem

    moved = stricter_drop(rows(6, 34), get_capability("json_formatting"))
    block = {"capability": "json_formatting", "delta": 0.0, "significant": False}
    assert schema_problem(schema_validator("regression"), {**block, "stricter": moved}) is None
    assert schema_problem(schema_validator("regression"), {**block, "stricter": None}) is None
    assert schema_problem(schema_validator("regression"), {**block, "stricter": {"capability": 1}}) is not None
