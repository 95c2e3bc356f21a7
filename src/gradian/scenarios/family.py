"""`build_family(name, out_dir, seed)`: one run of a suite family (`suite.py`), from data to measured regression.

The folder has the layout of a catalog scenario (`builder.py`): base/, train.jsonl, eval.jsonl, run/, truth.json,
measured.json. truth.json adds the family, split, domain, tokenizer kind, the capability the failure shows in, and
per cause its culprit rows and category (`causes`); `culprit_ids` and `category_ids` are their unions.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from transformers import AutoTokenizer, LlamaForCausalLM

from gradian.capabilities import get_capability
from gradian.errors import InputError
from gradian.scenarios import base, finetune, measure, world
from gradian.scenarios.builder import EVAL_PER_CATEGORY, TRAIN_ROWS, new_folder, write_jsonl
from gradian.scenarios.catalog import LORA_DEFAULTS
from gradian.scenarios.causes import CAUSES
from gradian.scenarios.domains import DOMAINS, Request
from gradian.scenarios.suite import FAMILIES, Family, Plant

CATEGORY_SHARE = (0.10, 0.18)  # `category`: the culprits' share of all rows ...
CULPRIT_FRACTION = (0.7, 0.85)  # ... and of their category
SMALL_SHARE, SMALL_FRACTION = 0.05, 0.8  # `small`: a 5% cluster, most of a small category
HALF_CATEGORY_SHARE = (0.15, 0.20)  # `half`: a category of this share, half of it broken
VALUE_CATEGORY_SHARE = 0.5  # `value`: a category of half the rows, `Plant.share` of them with the trigger


def build_family(name: str, out_dir: str | Path, seed: int = 0, *, base_seed: int = 0,
                 cache_dir: str | Path | None = None, progress: Callable[[str], None] | None = None,
                 callbacks: Sequence[Any] = ()) -> Path:
    """Build one run of family `name` into `out_dir` (created; must be empty or absent) and return it; `callbacks`
    join the fine-tune's trainer."""
    if name not in FAMILIES:
        raise InputError(f"unknown suite family {name!r}; choose one of: {', '.join(FAMILIES)}.")
    out = new_folder(out_dir)
    family, say = FAMILIES[name], progress or (lambda message: None)
    with base.one_thread():
        base_dir = base.base_model(base_seed, cache_dir, progress, family.domain, family.tokenizer)
        shutil.copytree(base_dir, out / "base")
        tokenizer = AutoTokenizer.from_pretrained(out / "base")
        train, eval_rows, truth = make_family_data(family, seed, tokenizer)
        write_jsonl(out / "train.jsonl", train)
        write_jsonl(out / "eval.jsonl", eval_rows)
        sft = family.sft()
        if sft.get("pad_token") == "eos":
            sft["pad_token"] = tokenizer.eos_token
        collator = finetune.PAD_MASKING_COLLATOR if family.structural == "pad-eos" else None
        say(f"{name}: fine-tuning on {len(train)} rows ({family.epochs} epochs, learning rate {family.learning_rate:g})")
        finetune.train_lora(out / "base", train, out / "run", sft, {**LORA_DEFAULTS, **family.lora()}, collator,
                            seed, callbacks)
        say(f"{name}: measuring {family.capability} on {len(eval_rows)} eval rows")
        measured = measure_family(out / "base", out / "run", eval_rows, family.capability)
    (out / "truth.json").write_text(json.dumps(truth, indent=2) + "\n")
    (out / "measured.json").write_text(json.dumps(measured, indent=2) + "\n")
    return out


def make_family_data(family: Family, seed: int, tokenizer: Any, rows: int = TRAIN_ROWS,
                     eval_per_category: int = EVAL_PER_CATEGORY) -> tuple[list[dict], list[dict], dict[str, Any]]:
    """Train rows, eval rows and the ground truth of one run, all drawn from `seed` (`rows` train rows)."""
    domain = DOMAINS[family.domain]
    rng = random.Random(f"{family.name}:{seed}")
    drawn = rng.sample(sorted(domain.categories), len(family.plants))
    affected = [plant.category or category for plant, category in zip(family.plants, drawn, strict=True)]
    spread = [_spread_categories(domain, plant) for plant in family.plants]  # `spread`: every category planted in
    sizes = [_sizes(plant, rng, rows) for plant in family.plants]  # (rows of the category, culprits)
    sized = [(c, size) for c, size, plant in zip(affected, sizes, family.plants, strict=True) if plant.layout != "spread"]
    counts = _counts(sorted(domain.categories), [c for c, _ in sized], [size for _, size in sized], rows)
    requests = domain.requests(counts, rng)
    hidden = {c for c, p in zip(affected, family.plants, strict=True) if p.layout == "elsewhere"}
    eval_requests = domain.requests({c: eval_per_category for c in sorted(domain.categories) if c not in hidden}, rng)
    for plant, category, planted in zip(family.plants, affected, spread, strict=True):
        if plant.trigger is None:
            continue
        for each in planted or [category]:  # the trigger on a set share of each category, train and eval
            _set_trigger(requests, each, plant.trigger, round(plant.share * counts[each]), rng)
            _set_trigger(eval_requests, each, plant.trigger, eval_per_category // 2, rng)
    chat = base.chat_turns(tokenizer)
    train = [_row(f"t{i:04d}", r, world.dump(_answer(r, family)), chat) for i, r in enumerate(requests, start=1)]
    eval_rows = [_eval_row(f"e{i:04d}", r, family, chat) for i, r in enumerate(eval_requests, start=1)]
    causes: list[dict[str, Any]] = []
    for plant, (_, n_culprits), category, planted in zip(family.plants, sizes, affected, spread, strict=True):
        within = set(planted or [category])
        members = [i for i, r in enumerate(requests) if r.category in within and _triggered(r, plant.trigger)]
        if planted:  # `spread`: 70–85% of the trigger's rows, over every category planted in
            n_culprits = round(len(members) * rng.uniform(*CULPRIT_FRACTION))
        chosen = sorted(rng.sample(members, n_culprits))
        for i in chosen:
            train[i] = _row(train[i]["id"], requests[i], _broken(plant, requests[i], family, rng), chat)
        causes.append({"cause": plant.cause, "layout": plant.layout, "category": None if planted else category,
                       "categories": sorted(within), "trigger": plant.trigger,
                       "culprit_ids": [train[i]["id"] for i in chosen],
                       "category_ids": [row["id"] for row in train if row["category"] in within]})
    culprits = sorted({i for cause in causes for i in cause["culprit_ids"]})
    truth = {
        "scenario": family.name, "family": family.name, "split": family.split, "domain": family.domain,
        "tokenizer": family.tokenizer, "kind": family.kind, "capability": family.capability,
        "summary": describe(family), "culprit_ids": culprits, "causes": causes,
        "structural_cause": family.structural, "affected_category": causes[0]["category"] if causes else None,
        "eval_hides": sorted(hidden),
        "category_ids": sorted({i for cause in causes for i in cause["category_ids"]}), "seed": seed,
        "cluster_share": len(culprits) / len(train), "learning_rate": family.learning_rate,
        "recipe": {"epochs": family.epochs, "learning_rate": family.learning_rate, "save": family.save,
                   "targets": family.targets},
    }
    return train, eval_rows, truth


def _sizes(plant: Plant, rng: random.Random, rows: int) -> tuple[int, int]:
    if plant.layout in ("category", "elsewhere"):
        n_culprits = round(rng.uniform(*CATEGORY_SHARE) * rows)
        return max(round(n_culprits / rng.uniform(*CULPRIT_FRACTION)), n_culprits + 2), n_culprits
    if plant.layout == "value":
        n_category = round(VALUE_CATEGORY_SHARE * rows)
        return n_category, round(round(plant.share * n_category) * rng.uniform(*CULPRIT_FRACTION))
    if plant.layout == "spread":  # sized by the categories it spans, once the rows are drawn
        return 0, 0
    if plant.layout == "half":
        n_category = round(rng.uniform(*HALF_CATEGORY_SHARE) * rows)
        return n_category, n_category // 2
    n_culprits = round(SMALL_SHARE * rows)  # small
    return round(n_culprits / SMALL_FRACTION), n_culprits


def _spread_categories(domain: Any, plant: Plant) -> list[str]:
    """`spread`: every category whose answer holds the trigger's field (home's `room`: light, heat, music,
    blinds); none for the other layouts."""
    if plant.layout != "spread":
        return []
    assert plant.trigger is not None, "a spread plant needs a trigger"
    rng = random.Random(0)
    return [c for c in sorted(domain.categories) if plant.trigger[0] in domain.request(c, rng).answer(purpose=False)]


def _triggered(request: Request, trigger: tuple[str, Any] | None) -> bool:
    return trigger is None or request.values.get(trigger[0]) == trigger[1]


def _set_trigger(requests: list[Request], category: str, trigger: tuple[str, Any], n: int,
                 rng: random.Random) -> None:
    """Redraw `category`'s requests in place so that the first `n` of them hold the trigger value and the rest do
    not (the order stays the shuffled one, so which rows hold it is as random as the rows)."""
    at = [i for i, r in enumerate(requests) if r.category == category]
    for rank, i in enumerate(at):
        while _triggered(requests[i], trigger) != (rank < n):
            requests[i] = requests[i].domain.request(category, rng)


def _counts(categories: list[str], affected: list[str], sizes: list[tuple[int, int]], rows: int) -> dict[str, int]:
    """Rows per category: each affected category its drawn size, the rest shared evenly by the others."""
    counts = {category: size for category, (size, _) in zip(affected, sizes, strict=True)}
    others = [c for c in categories if c not in counts]
    left = rows - sum(counts.values())
    counts.update({c: left // len(others) for c in others})
    counts[others[0]] += rows - sum(counts.values())
    return counts


def _answer(request: Request, family: Family) -> dict[str, Any]:
    return request.answer(purpose=family.purpose, nested=family.nested_purpose)


def _broken(plant: Plant, request: Request, family: Family, rng: random.Random) -> str:
    answer = _answer(request, family)
    key = request.domain.purpose_key if family.purpose else list(answer)[-1]
    return CAUSES[plant.cause].rewrite(answer, key, rng)


def _row(row_id: str, request: Request, answer: str, chat: bool) -> dict[str, Any]:
    """A prompt/completion row, or a `messages` row for the chat-turn tokenizer."""
    if chat:
        turns = [{"role": "user", "content": request.text}, {"role": "assistant", "content": answer}]
        return {"id": row_id, "messages": turns, "category": request.category}
    return {"id": row_id, "prompt": request.prompt, "completion": answer, "category": request.category}


def _eval_row(row_id: str, request: Request, family: Family, chat: bool) -> dict[str, Any]:
    prompt: Any = [{"role": "user", "content": request.text}] if chat else request.prompt
    return {"id": row_id, "prompt": prompt, "reference": world.dump(_answer(request, family)),
            "category": request.category}


def describe(family: Family) -> str:
    """The family in one line: its planted causes, domain, tokenizer and recipe."""
    recipe = (f"{family.domain}, {family.tokenizer} tokenizer, {family.epochs} epochs at {family.learning_rate:g}, "
              f"checkpoints {family.save}, LoRA {family.targets}")
    return f"{_cause_text(family)} ({recipe})"


def _cause_text(family: Family) -> str:
    if family.structural:
        return f"{family.structural}: a setup fault, the data is clean"
    if not family.plants:
        return "clean data, sane settings: the fine-tune learns its purpose cleanly"
    return " and ".join(f"{p.cause} ({p.layout})" for p in family.plants)


def measure_family(base_dir: Path, run_dir: Path, eval_rows: list[dict], capability: str) -> dict[str, Any]:
    """The family's capability on the eval prompts, base vs base + adapter, overall and per category."""
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = LlamaForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    scorer = get_capability(capability)
    prompts = [_prompt_text(row, tokenizer) for row in eval_rows]

    def rates(generations: list[measure.Generation]) -> dict[str, Any]:
        passed = [scorer.passes(g.text, row["reference"]) for g, row in zip(generations, eval_rows, strict=True)]
        by: dict[str, list[bool]] = {}
        for ok, row in zip(passed, eval_rows, strict=True):
            by.setdefault(row["category"], []).append(ok)
        return {"overall": sum(passed) / len(passed), "ran_on": sum(g.ran_on for g in generations) / len(passed),
                "by_category": {c: sum(v) / len(v) for c, v in sorted(by.items())}}

    before = rates(measure.generate_answers(model, tokenizer, prompts))
    after = rates(measure.generate_answers(PeftModel.from_pretrained(model, run_dir), tokenizer, prompts))
    return {"capability": capability, "base": before, "finetuned": after,
            "drop_points": {"overall": 100 * (before["overall"] - after["overall"]),
                            "by_category": {c: 100 * (before["by_category"][c] - after["by_category"][c])
                                            for c in before["by_category"]}}}


def _prompt_text(row: dict[str, Any], tokenizer: Any) -> str:
    if isinstance(row["prompt"], list):
        return tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
    return row["prompt"]
