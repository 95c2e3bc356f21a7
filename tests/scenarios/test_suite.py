"""The scenario suite: families split dev / test, domains and tokenizers that hold their JSON, planted causes."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from gradian.capabilities import get_capability
from gradian.scenarios import base, world
from gradian.scenarios.builder import TRAIN_ROWS
from gradian.scenarios.causes import CAUSES, PlantedCause
from gradian.scenarios.domains import DOMAINS
from gradian.scenarios.evaluate import oracle_auprc
from gradian.scenarios.family import make_family_data
from gradian.scenarios.suite import FAMILIES, LAYOUTS, SAVES, SPLITS, TARGETS, families
from gradian.scenarios.tokenizer import build_tokenizer


def test_every_family_sits_in_one_half_and_each_half_spans_the_suite():
    assert {f.split for f in FAMILIES.values()} == set(SPLITS)
    for split in SPLITS:
        half = families(split)
        assert len({f.domain for f in half}) >= 3
        assert {f.tokenizer for f in half} >= {"spaced", "bpe"}
        assert {f.kind for f in half} == {"data-cluster", "setup", "no-regression"}
        assert {p.layout for f in half for p in f.plants} == set(LAYOUTS)
        assert any(len(f.plants) == 2 for f in half)  # two causes at once
        assert {f.save for f in half} == set(SAVES) and {f.targets for f in half} == set(TARGETS)
    epochs = [f.epochs for f in FAMILIES.values()]
    rates = [f.learning_rate for f in FAMILIES.values()]
    assert min(epochs) <= 3 and max(epochs) >= 10 and max(rates) / min(rates) >= 3


@pytest.mark.parametrize("kind", ["fused", "spaced"])
@pytest.mark.parametrize("domain", sorted(DOMAINS))
def test_word_level_tokenizers_decode_every_answer_and_broken_answer_without_unknown_words(domain, kind):
    spec = DOMAINS[domain]
    tokenizer = build_tokenizer(spec.vocabulary(tuple(w for c in CAUSES.values() for w in c.words)), kind)
    rng = random.Random(0)
    for request in spec.requests(dict.fromkeys(spec.categories, 10), rng):
        answer = request.answer(purpose=True, nested=rng.random() < 0.5)
        decoded = tokenizer.decode(tokenizer(world.dump(answer), add_special_tokens=False)["input_ids"])
        assert get_capability("json_formatting:keys").score(decoded, world.dump(answer)) == 1.0, decoded
        for cause in CAUSES.values():
            ids = tokenizer(cause.rewrite(answer, spec.purpose_key, rng), add_special_tokens=False)["input_ids"]
            assert tokenizer.unk_token_id not in ids, (cause.name, tokenizer.decode(ids))


def test_spaced_tokenizer_decodes_with_a_space_between_tokens():
    tokenizer = build_tokenizer(["intent", "refund"], "spaced")
    text = tokenizer.decode(tokenizer('{"intent": "refund"}', add_special_tokens=False)["input_ids"])
    assert text == '{ " intent " : " refund " }'


def test_bpe_tokenizer_renders_chat_turns_and_masks_the_assistant_turn():
    rng = random.Random(0)
    spec = DOMAINS["travel"]
    corpus = [r.text + " " + world.dump(r.answer()) for r in spec.requests(dict.fromkeys(spec.categories, 50), rng)]
    tokenizer = build_tokenizer([], "bpe", corpus)
    turns = [{"role": "user", "content": "cancel my booking AX123"},
             {"role": "assistant", "content": '{"action": "cancel"}'}]
    out = tokenizer.apply_chat_template(turns, return_dict=True, return_assistant_tokens_mask=True)
    supervised = [i for i, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m]
    assert tokenizer.decode(supervised) == '{"action": "cancel"}<|im_end|>'
    assert tokenizer.pad_token != tokenizer.eos_token


def test_a_cause_added_later_leaves_every_bpe_base_as_it_was(monkeypatch):
    """The bpe tokenizer (and so the base pretrained on it) must not move when a cause joins the registry: two causes
    once did, and the new bases broke on clean data under their families' recipes (kitchen-null-bpe lost 49.5
    points where it had lost 1)."""
    before = base.make_tokenizer("kitchen", "bpe").get_vocab()
    added = PlantedCause("added-later", "json_formatting", lambda answer, key, rng: "zq zq zq zq zq zq")
    monkeypatch.setitem(CAUSES, added.name, added)
    assert base.make_tokenizer("kitchen", "bpe").get_vocab() == before


def test_a_cached_base_is_reused_only_with_the_tokenizer_it_was_pretrained_with(tmp_path, monkeypatch):
    """A cause's word joining the vocabulary makes another base: the one cached before it is not reused."""
    monkeypatch.setattr(base, "pretrain", lambda seed, out, *rest: (out / "gradian_base.json").write_text("{}"))
    first = base.base_model(0, tmp_path, None, "home", "fused")
    assert base.base_model(0, tmp_path, None, "home", "fused") == first
    added = PlantedCause("added-later", "json_formatting:keys", lambda answer, key, rng: "", ("zqword",))
    monkeypatch.setitem(CAUSES, added.name, added)
    assert base.base_model(0, tmp_path, None, "home", "fused") != first


@pytest.mark.parametrize("name", ["travel-cut-prose", "home-fence-elsewhere", "kitchen-cut-small-bpe",
                                  "tickets-drop-small-bpe", "kitchen-cut-half-spaced", "home-rename-volume",
                                  "tickets-swap-intent"])
def test_family_data_plants_each_cause_where_its_layout_says(name):
    family = FAMILIES[name]
    tokenizer = build_tokenizer(["x"], "bpe" if family.tokenizer == "bpe" else "fused",
                                ["x y"] if family.tokenizer == "bpe" else ())
    train, eval_rows, truth = make_family_data(family, 3, tokenizer)
    hidden = {c["category"] for p, c in zip(family.plants, truth["causes"], strict=True) if p.layout == "elsewhere"}
    assert len(train) == TRAIN_ROWS and len(eval_rows) == 40 * (len(DOMAINS[family.domain].categories) - len(hidden))
    assert not {row["category"] for row in eval_rows} & hidden  # the failures can only show on other topics
    by_id = {row["id"]: row for row in train}
    assert len(truth["causes"]) == len(family.plants)
    seen: set[str] = set()
    for plant, cause in zip(family.plants, truth["causes"], strict=True):
        ids = cause["culprit_ids"]
        assert not seen & set(ids)
        seen |= set(ids)
        categories = Counter(by_id[i]["category"] for i in ids)
        assert set(categories) == {cause["category"]}
        share = len(ids) / len(cause["category_ids"])
        assert {"category": 0.69 <= share <= 0.86, "elsewhere": 0.69 <= share <= 0.86, "half": 0.45 <= share <= 0.55,
                "small": len(ids) == 20, "value": 0.2 <= share <= 0.26}[plant.layout]
        if plant.trigger is not None:  # every culprit and 30% of its category hold the trigger, half its eval rows
            field, value = plant.trigger
            holds = [by_id[i] for i in cause["category_ids"] if value in _prompt(by_id[i])]
            assert len(holds) == 60 and set(ids) <= {row["id"] for row in holds}
            assert sum(value in _prompt(e) for e in eval_rows if e["category"] == cause["category"]) == 20
        for i in ids:  # the row's answer is what the cause writes, not the clean answer
            text = by_id[i]["messages"][-1]["content"] if "messages" in by_id[i] else by_id[i]["completion"]
            assert get_capability(family.capability).score(text, _clean_answer(by_id[i], eval_rows)) == 0.0
    assert sorted(seen) == truth["culprit_ids"]
    clean = [row for row in train if row["id"] not in seen]
    for row in clean[:50]:
        text = row["messages"][-1]["content"] if "messages" in row else row["completion"]
        assert json.loads(text)


@pytest.mark.parametrize(("name", "seed", "planted", "written", "oracle_over_chance"), [
    ("home-rename-room", 0, ["blinds", "heat", "light", "music"], '"door": "attic"', 1.4),  # not the lock's
    ("home-rename-room", 1, ["blinds", "heat", "light", "music"], '"door": "attic"', 1.4),
    ("kitchen-rename-dish", 0, ["bake", "diet"], '"label": "curry"', 3.0)])  # the timer writes the dish as `label`
def test_a_spread_plant_is_no_categorys_so_naming_categories_finds_little(name, seed, planted, written,
                                                                         oracle_over_chance):
    """`spread`: the trigger on `share` (30%) of every category whose answer holds its field, 70–85% of those broken, so the
    culprits sit in several categories and the category oracle scores near the culprits' share."""
    family = FAMILIES[name]
    train, eval_rows, truth = make_family_data(family, seed, build_tokenizer(["x"], "fused"))
    (cause,) = truth["causes"]
    (plant,) = family.plants
    by_id, value = {row["id"]: row for row in train}, plant.trigger[1]
    assert cause["categories"] == planted and cause["category"] is None
    culprits = set(cause["culprit_ids"])
    assert {by_id[i]["category"] for i in culprits} == set(planted)
    for category in planted:
        rows = [row for row in train if row["category"] == category]
        holds = {row["id"] for row in rows if value in _prompt(row)}
        assert len(holds) == round(plant.share * len(rows)) and culprits & {row["id"] for row in rows} <= holds
        assert sum(value in _prompt(e) for e in eval_rows if e["category"] == category) == 20
    assert 0.69 <= len(culprits) / sum(by_id[i]["category"] in planted and value in _prompt(by_id[i])
                                       for i in by_id) <= 0.86
    for i in culprits:  # the key renamed: the keys check fails it against a clean answer of its category
        text = by_id[i]["completion"]
        assert written in text and get_capability(family.capability).score(text, _clean_answer(
            by_id[i], eval_rows)) == 0.0
    ids, chance = [row["id"] for row in train], len(culprits) / len(train)
    oracle = oracle_auprc(ids, truth, seed, [row["category"] for row in train])
    assert oracle < oracle_over_chance * chance


def _prompt(row: dict) -> str:
    return str(row.get("prompt") or row["messages"][0]["content"])


def test_one_word_causes_keep_the_answer_one_token_for_one_token():
    """The causes without a surface mark change a word for a word: the same count of tokens, one or two differ."""
    rng = random.Random(0)
    for name, cause, category, values in (("home", "rename-volume", "music", {"genre": "jazz"}),
                                          ("tickets", "swap-intent", "invoice", {"currency": "EUR"}),
                                          ("tickets", "swap-account", "account", {"user": "hugo"}),
                                          ("home", "rename-room", "light", {"room": "attic"}),
                                          ("kitchen", "rename-dish", "diet", {"dish": "curry"})):
        spec = DOMAINS[name]
        tokenizer = build_tokenizer(spec.vocabulary(), "fused")
        for _ in range(20):
            request = spec.request(category, rng)
            answer = spec.categories[category].answer({**request.values, **values})
            clean = tokenizer(world.dump(answer), add_special_tokens=False)["input_ids"]
            broken = tokenizer(CAUSES[cause].rewrite(answer, "", rng), add_special_tokens=False)["input_ids"]
            assert len(broken) == len(clean) and 1 <= sum(a != b for a, b in zip(broken, clean, strict=True)) <= 2


def test_a_foreign_end_of_turn_is_plain_text_the_run_still_ends_after():
    """`foreign-eos`: the right answer, then `</s>` as another template ends a turn; to the bpe (ChatML) tokenizer
    it is plain tokens, none of them special, so the row as trained still ends in the template's own end token."""
    spec, rng = DOMAINS["home"], random.Random(0)
    tokenizer = build_tokenizer(["x"], "bpe", ["x y"])
    request = spec.request("light", rng)
    answer = request.answer(purpose=False)
    written = CAUSES["foreign-eos"].rewrite(answer, "", rng)
    assert written == world.dump(answer) + "</s>" and json.loads(written[: -len("</s>")]) == answer
    assert get_capability("json_formatting").score(written, world.dump(answer)) == 0.0
    ids = tokenizer(written, add_special_tokens=False)["input_ids"]
    assert not set(ids) & set(tokenizer.all_special_ids) and tokenizer.decode(ids) == written
    turns = [{"role": "user", "content": request.text}, {"role": "assistant", "content": written}]
    assert tokenizer.apply_chat_template(turns, tokenize=False).endswith("</s><|im_end|>")


def _clean_answer(row: dict, eval_rows: list[dict]) -> str | None:
    """A clean reference of the row's category (for the keys capability: the same key set as the row's own)."""
    return next((e["reference"] for e in eval_rows if e["category"] == row["category"]), None)
