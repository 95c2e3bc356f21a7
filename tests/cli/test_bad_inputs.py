"""The bad-input corpus through the CLI: one sentence naming the file (and line) and exit code 2, never a traceback.

Some malformed-looking inputs are not errors (a JSON array, a BOM, NaN in the training log): those must be
read, and the table below says what `diagnose` must answer for each (1: findings, 0: clean).
"""

from __future__ import annotations

import collections

import pytest

from bad_inputs.corpus import CASES, Case
from bad_inputs.fixtures import assert_no_traceback, assert_one_line_error, gradian, snapshot, workspace  # noqa: F401

KINDS = ("dataset", "run", "model", "attribute", "hostile", "fuzz", "fault")


def assert_answer(case: Case, result) -> None:
    if case.exit_code == 2:
        assert_one_line_error(result, case.names)
    else:
        assert_no_traceback(result)
        assert result.exit_code == case.exit_code, (result.exit_code, result.output[-2000:])


def _param(case: Case):
    marks = [pytest.mark.xfail(strict=True, reason=case.bug)] if case.bug else []
    marks += [pytest.mark.slow] if case.slow else []
    return pytest.param(case, id=case.id, marks=marks)


@pytest.mark.parametrize("case", [_param(case) for case in CASES])
def test_bad_input(case: Case, workspace, gradian):  # noqa: F811
    args = case.build(workspace, workspace.scratch(case.id))
    before = snapshot(workspace.root)
    result = gradian(args)
    assert_answer(case, result)
    assert snapshot(workspace.root) == before, "an input file was changed, added or removed"


def test_50mb_row_is_read(tmp_path):
    """The reader takes a 50 MB row in stride (the full diagnose of it is the slow case dataset-50mb-row)."""
    from bad_inputs.corpus import huge_row
    from gradian.data.examples import read_dataset

    path = tmp_path / "train.jsonl"
    huge_row(50)(path)
    examples = read_dataset(path)
    assert [e.id for e in examples] == ["t0", "huge", "t1"]
    assert len(examples[1].completion_text) == 50 * 1024 * 1024


def test_corpus_counts(request):
    """At least 50 malformed inputs; prints how many cases of each kind this session collected."""
    assert len(CASES) >= 50
    assert len({case.id for case in CASES}) == len(CASES)
    assert all(case.kind in KINDS for case in CASES)
    counts = collections.Counter()
    for item in request.session.items:  # parametrized ids start with their kind; test_fuzz_* / test_fault_* too
        callspec = getattr(item, "callspec", None)
        name = callspec.id if callspec is not None else item.name.removeprefix("test_").replace("_", "-")
        if name.split("-", 1)[0] in KINDS:
            counts[name.split("-", 1)[0]] += 1
    print("bad-input cases per kind: " + ", ".join(f"{kind} {counts[kind]}" for kind in KINDS))
    print(f"corpus: {len(CASES)} cases, {sum(case.exit_code == 2 for case in CASES)} errors (exit 2), "
          f"{sum(bool(case.bug) for case in CASES)} known bugs")
