"""`build(name, out_dir, seed)`: one scenario folder, from data to measured regression.

    out_dir/
      base/           the cached tiny base (tokenizer + safetensors + chat template)
      train.jsonl     id, prompt, completion, category
      eval.jsonl      id, prompt, reference, category
      run/            the TRL SFTTrainer + PEFT LoRA run folder, with sft_config.yaml
      truth.json      kind, culprit_ids, structural_cause, affected_category, category_ids, seed, cluster_share,
                      learning_rate (the one the run used; diffuse climbs a ladder until the run regresses)
      measured.json   JSON validity of base vs fine-tuned, overall and per category, with counts

The seed draws the cluster's share of train rows (5–20%), the affected category and the row order.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from transformers import AutoTokenizer, LlamaForCausalLM

from gradian.errors import InputError
from gradian.scenarios import base, finetune, measure, world
from gradian.scenarios.catalog import CATALOG, Scenario

TRAIN_ROWS = 400
EVAL_PER_CATEGORY = 40
SHARE_RANGE = (0.05, 0.20)
CULPRIT_FRACTION_OF_CATEGORY = (0.7, 0.85)
# A scenario with a learning-rate ladder (diffuse) stops climbing at the first rate whose run loses this many
# points of JSON validity overall: ten points on 200 eval rows is far outside the paired noise band.
DIFFUSE_MIN_DROP = 10.0


def build(name: str, out_dir: str | Path, seed: int = 0, *, base_seed: int = 0, cache_dir: str | Path | None = None,
          progress: Callable[[str], None] | None = None) -> Path:
    """Build catalog scenario `name` into `out_dir` (created; must be empty or absent) and return it."""
    if name not in CATALOG:
        raise InputError(f"unknown scenario {name!r}; choose one of: {', '.join(CATALOG)}.")
    out = new_folder(out_dir)
    scenario = CATALOG[name]
    say = progress or (lambda message: None)
    with base.one_thread():
        base_dir = base.base_model(base_seed, cache_dir, progress)
        shutil.copytree(base_dir, out / "base")
        train, eval_rows, truth = make_data(scenario, seed)
        write_jsonl(out / "train.jsonl", train)
        write_jsonl(out / "eval.jsonl", eval_rows)
        for rate in scenario.lr_ladder or (None,):
            sft = scenario.sft_config() if rate is None else {**scenario.sft_config(), "learning_rate": rate}
            shutil.rmtree(out / "run", ignore_errors=True)
            say(f"{name}: fine-tuning on {len(train)} rows (learning rate {sft['learning_rate']:g})")
            finetune.train_lora(out / "base", train, out / "run", sft, scenario.lora_config(), scenario.collator, seed)
            say(f"{name}: measuring JSON validity on {len(eval_rows)} eval rows")
            measured = measure_run(out / "base", out / "run", eval_rows, truth["affected_category"])
            if measured["drop_points"]["overall"] >= DIFFUSE_MIN_DROP:
                break
        truth["learning_rate"] = sft["learning_rate"]
    (out / "truth.json").write_text(json.dumps(truth, indent=2) + "\n")
    (out / "measured.json").write_text(json.dumps(measured, indent=2) + "\n")
    return out


def new_folder(out_dir: str | Path) -> Path:
    """`out_dir` as a Path; InputError when it already holds something."""
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise InputError("is not empty; give a new folder for the scenario.", out)
    return out


def make_data(scenario: Scenario, seed: int) -> tuple[list[dict], list[dict], dict[str, Any]]:
    """Train rows, eval rows and the ground truth, all drawn from `seed`."""
    rng = random.Random(f"{scenario.name}:{seed}")
    share = rng.uniform(*SHARE_RANGE) if scenario.corrupt or scenario.overlap else 0.0
    affected = rng.choice(world.CATEGORIES) if scenario.corrupt else None
    counts, n_culprits = _category_counts(affected, share, rng)
    tickets = world.make_tickets(counts, rng)
    eval_tickets = world.make_tickets(dict.fromkeys(world.CATEGORIES, EVAL_PER_CATEGORY), rng)
    eval_rows = [_row(f"e{i:04d}", t, "reference", scenario.purpose) for i, t in enumerate(eval_tickets, start=1)]
    if scenario.overlap:
        copied = rng.sample(eval_tickets, round(share * TRAIN_ROWS))
        tickets = tickets[: TRAIN_ROWS - len(copied)] + copied
        rng.shuffle(tickets)
    train = [_row(f"t{i:04d}", t, "completion", scenario.purpose) for i, t in enumerate(tickets, start=1)]
    culprits = _plant(scenario, train, tickets, affected, n_culprits, eval_tickets, rng)
    category_ids = [row["id"] for row in train if row["category"] == affected] if affected else []
    truth = {"scenario": scenario.name, "kind": scenario.kind, "summary": scenario.summary, "purpose": scenario.purpose,
             "culprit_ids": culprits, "structural_cause": scenario.structural_cause, "affected_category": affected,
             "category_ids": category_ids, "seed": seed, "cluster_share": len(culprits) / len(train)}
    return train, eval_rows, truth


def _category_counts(affected: str | None, share: float, rng: random.Random) -> tuple[dict[str, int], int]:
    """Rows per category; the affected one holds the culprits plus 15–30% clean neighbours."""
    if affected is None:
        return dict.fromkeys(world.CATEGORIES, TRAIN_ROWS // len(world.CATEGORIES)), 0
    n_culprits = round(share * TRAIN_ROWS)
    n_category = max(round(n_culprits / rng.uniform(*CULPRIT_FRACTION_OF_CATEGORY)), n_culprits + 2)
    others = [c for c in world.CATEGORIES if c != affected]
    counts = {c: (TRAIN_ROWS - n_category) // len(others) for c in others}
    counts[others[0]] += TRAIN_ROWS - n_category - sum(counts.values())
    return {**counts, affected: n_category}, n_culprits


def _plant(scenario: Scenario, train: list[dict], tickets: list[world.Ticket], affected: str | None,
           n_culprits: int, eval_tickets: list[world.Ticket], rng: random.Random) -> list[str]:
    """Corrupt `n_culprits` random rows of the affected category, or name the rows copied from eval."""
    if scenario.overlap:
        copied = set(map(id, eval_tickets))
        return [row["id"] for row, ticket in zip(train, tickets, strict=True) if id(ticket) in copied]
    if scenario.corrupt is None:
        return []
    members = [i for i, row in enumerate(train) if row["category"] == affected]
    chosen = sorted(rng.sample(members, n_culprits))
    for i in chosen:
        train[i]["completion"] = scenario.corrupt(tickets[i].answer(scenario.purpose))
    return [train[i]["id"] for i in chosen]


def _row(row_id: str, ticket: world.Ticket, answer_key: str, purpose: str) -> dict[str, str]:
    return {"id": row_id, "prompt": ticket.prompt, answer_key: world.dump(ticket.answer(purpose)),
            "category": ticket.category}


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def measure_run(base_dir: Path, run_dir: Path, eval_rows: list[dict], affected: str | None) -> dict[str, Any]:
    """JSON validity of the base and of base + adapter on the eval prompts."""
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = LlamaForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    prompts, categories = [r["prompt"] for r in eval_rows], [r["category"] for r in eval_rows]
    references = [r["reference"] for r in eval_rows]
    before = measure.summarize_generations(measure.generate_answers(model, tokenizer, prompts), categories, references)
    tuned = PeftModel.from_pretrained(model, run_dir)
    after = measure.summarize_generations(measure.generate_answers(tuned, tokenizer, prompts), categories, references)
    return measure.compare_runs(before, after, affected)
