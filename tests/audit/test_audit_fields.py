"""`missing_fields`: training targets that lack keys the nearest eval references agree on, dropped or renamed."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest

from gradian.audit.fields import CRITICAL_SHARE, missing_fields, object_fields
from gradian.audit.registry import teaches
from gradian.capabilities import get_capability
from gradian.data.examples import Example, read_dataset
from gradian.scenarios.family import make_family_data
from gradian.scenarios.suite import FAMILIES
from gradian.scenarios.tokenizer import build_tokenizer

RENAMES = sorted(name for name, family in FAMILIES.items() if any(p.cause.startswith("rename") for p in family.plants))

CATEGORIES = {  # category -> (prompt words, the answer's fields)
    "timer": ("set a timer for {n} minutes", {"task": "timer", "minutes": 5, "label": "tea"}),
    "diet": ("is dish {n} ok for a vegan diet", {"task": "diet", "dish": "soup", "diet": "vegan"}),
    "shop": ("add {n} eggs to my shopping list", {"task": "shop", "items": ["eggs"]}),
    "menu": ("show the dishes of menu {n}", {"task": "menu", "dish": "soup"}),  # diet's keys but one
}


def row(name: str, i: int, category: str, drop: str | None = None, rename: str | None = None) -> Example:
    """A row of `category` (an eval row's `completion` is its reference, as `read_dataset` reads it), without its
    field `drop`, or with it under the key `rename`."""
    prompt, answer = CATEGORIES[category]
    answer = {(rename or k) if k == drop else k: v for k, v in answer.items() if k != drop or rename}
    return Example(name, i, {"prompt": prompt.format(n=i), "completion": " " + json.dumps(answer)})


def context(examples, eval_examples, capability="json_formatting:keys"):
    return SimpleNamespace(examples=examples, eval_examples=eval_examples, capability=get_capability(capability),
                           tokenizer=SimpleNamespace(eos_token="</s>"), setup=SimpleNamespace(eos_token=None),
                           trained=lambda: iter(examples))


def world(dropped: set[int], n: int = 60):
    """n training rows over the three categories; the diet rows in `dropped` leave out their `diet` field; eval
    references are whole."""
    rng = random.Random(0)
    categories = [rng.choice(list(CATEGORIES)[:3]) for _ in range(n)]
    train = [row(f"t{i}", i, c, "diet" if i in dropped else None) for i, c in enumerate(categories)]
    evals = [row(f"e{j}", 100 + j, c) for j, c in enumerate(list(CATEGORIES)[:3] * 8)]
    return train, evals


def test_flags_exactly_the_rows_that_drop_a_field():
    train, evals = world(set())
    diet = [i for i, e in enumerate(train) if "diet" in e.prompt_text]
    dropped = set(diet[: len(diet) // 2])
    train, evals = world(dropped)
    (finding,) = missing_fields(context(train, evals))
    assert finding.example_ids == [train[i].id for i in sorted(dropped)]
    assert finding.values["missing"] == {"diet": len(dropped)}
    assert finding.severity == ("critical" if len(dropped) >= CRITICAL_SHARE * len(train) else "warning")
    assert "'diet'" in finding.title and train[min(dropped)].id in finding.fix
    assert teaches("missing_fields") == ("wrong-fields",)


def test_flags_the_rows_that_hold_a_field_under_another_name():
    """Schema drift: diet rows give `regime` where the eval's diet answers give `diet`, the same task and dish. A
    renamed key teaches the same wrong fields as a dropped one; the rows are named with the key they hold instead."""
    train = [row(f"d{i}", i, "diet") for i in range(12)] + [row(f"r{i}", 20 + i, "diet", "diet", "regime")
                                                           for i in range(6)] + [row(f"x{i}", 40 + i, "diet", "diet")
                                                                                 for i in range(2)]
    train += [row(f"t{i}", 60 + i, "timer") for i in range(10)]
    evals = [row(f"e{j}", 100 + j, c) for j, c in enumerate(["diet", "timer"] * 6)]
    (finding,) = missing_fields(context(train, evals))
    assert finding.example_ids == [f"r{i}" for i in range(6)] + ["x0", "x1"]
    assert finding.values["missing"] == {"diet": 8} and finding.values["instead"] == {"regime": 6}
    assert finding.values["renamed"] == 6 and "'regime'" in finding.title
    assert finding.fix.startswith("rename 'regime' to 'diet' in rows r0") and "add the missing fields" in finding.fix


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", RENAMES)
def test_the_suite_rename_families_planted_rows_are_the_rows_flagged(name, seed, tmp_path):
    """Every rename family of the scenario suite, as it draws its rows (no model: the check reads text): the check
    names the planted rows, all of them and no clean one."""
    train, eval_rows, truth = make_family_data(FAMILIES[name], seed, build_tokenizer(["x"], "fused"))
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in eval_rows))
    examples = read_dataset(tmp_path / "train.jsonl")
    (finding,) = missing_fields(context(examples, read_dataset(tmp_path / "eval.jsonl", eval_set=True)))
    assert sorted(finding.example_ids) == truth["culprit_ids"]


def test_a_row_of_another_kind_with_as_many_other_keys_is_not_a_rename():
    """A timer row held against diet references (the eval holds only diet prompts): three keys for three, but its
    task is another one, so it renames nothing."""
    train = [row(f"t{i}", i, "timer") for i in range(10)] + [row(f"d{i}", 20 + i, "diet") for i in range(5)]
    evals = [row(f"e{j}", 100 + j, "diet") for j in range(8)]
    assert missing_fields(context(train, evals)) == []


def test_whole_rows_and_other_capabilities_are_not_flagged():
    train, evals = world(set())
    assert missing_fields(context(train, evals)) == []
    dropped = {i for i, e in enumerate(train) if "diet" in e.prompt_text}
    train, evals = world(dropped)
    assert missing_fields(context(train, evals, "json_formatting")) == []  # it compares no keys
    assert missing_fields(context(train, [])) == []  # no eval references to hold the rows against


def test_a_row_whose_keys_only_differ_is_not_flagged():
    """A category no eval prompt covers is matched to other categories' references: its keys differ from theirs
    but are not a subset of them, so it is not a dropped field."""
    train, evals = world(set())
    evals = [e for e in evals if "shopping" not in e.prompt_text]
    assert missing_fields(context(train, evals)) == []


def test_a_row_of_another_kind_is_not_held_against_the_only_category_the_eval_holds():
    """The eval holds only the diet prompts the user saw fail. A menu row's answer has diet's keys but one, yet it
    answers another task (its label differs from the one every diet reference gives): it leaves nothing out. A diet
    row without its `diet` field still does."""
    train = [row(f"m{i}", i, "menu") for i in range(10)] + [row(f"d{i}", 20 + i, "diet", "diet") for i in range(5)]
    evals = [row(f"e{j}", 100 + j, "diet") for j in range(8)]
    (finding,) = missing_fields(context(train, evals))
    assert finding.example_ids == [f"d{i}" for i in range(5)]


def test_keys_are_compared_as_the_symptom_compares_them():
    assert object_fields('{" Task ": 1, "dish": {"b": 2, "a": 1}}') == {"task": "1", "dish": '{"a": 1, "b": 2}'}
    assert object_fields("[1, 2]") is None and object_fields("{cut") is None and object_fields(None) is None


def test_rows_are_matched_a_chunk_at_a_time_with_the_same_result(monkeypatch):
    train, evals = world(set())
    dropped = {i for i, e in enumerate(train) if "diet" in e.prompt_text}
    train, evals = world(dropped)
    (whole,) = missing_fields(context(train, evals))
    monkeypatch.setattr("gradian.audit.fields.CHUNK_ROWS", 7)
    (chunked,) = missing_fields(context(train, evals))
    assert chunked.example_ids == whole.example_ids == [train[i].id for i in sorted(dropped)]
