"""The real-model suite: SmolLM2-135M-Instruct fine-tunes with planted causes, split dev / test.

A tiny model learned its formats in pretraining and carries nothing from one task into another; a real model does,
so the defaults are chosen on this suite's dev half and the tiny suite (`suite.py`) guards CI. Each run has two
stages, as a team's model does:

1. **Stage one, one cached base per seed** (`stage_one_base`): SmolLM2 with a LoRA on clean requests of all four
   domains → their JSON answers, merged. Its tokenizer carries a ChatML template with generation markers, so
   `messages` runs can train on the assistant's turns only (`assistant_only_loss`), as TRL needs.
2. **Stage two, the family's fine-tune** (`build_smollm2_family`): a LoRA on top of the stage-one model that adds
   the domain's purpose field, on rows drawn as the tiny suite draws them (`family.make_family_data`), with the
   family's planted cause, recipe and row format.

Causes a real run meets that the tiny world cannot show sit here: `max-length-eos`, the common recipe that
tokenizes with `truncation=True, max_length=N` and a tokenizer that appends EOS (`add_eos_token=True`), so every row
that runs long is cut mid-object and still ends in EOS: the model learns to stop there, and the fix is a setting
(raise the max length), not dropping rows. The run's `sft_config.yaml` records `add_eos_token: true`, as a user's
config would say it.

The split was fixed when this file was written, before anything was measured on it (BENCHMARKS.md, "The real-model
suite"). Sizes are chosen so the suite regenerates from nothing in about three hours on two CPU cores, two runs at
a time, one thread each (~35 training tokens/s a thread); a GPU takes minutes.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from transformers import AutoTokenizer, LlamaForCausalLM

from gradian.errors import InputError
from gradian.scenarios import base, finetune, measure, smollm2, world
from gradian.scenarios.builder import new_folder, write_jsonl
from gradian.scenarios.domains import DOMAINS
from gradian.scenarios.family import make_family_data, measure_family
from gradian.scenarios.suite import Family, Plant
from gradian.scenarios.tokenizer import CHATML_TEMPLATE

VERSION = 1  # part of every cache name: bumped when a build changes
ROWS = 120  # train rows of a stage-two run
EVAL_PER_CATEGORY = 8
STAGE_ONE_PER_CATEGORY = 8  # clean rows per category and domain for the stage-one base
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0}
TARGETS = {"all": "all-linear", "attn": ["q_proj", "k_proj", "v_proj", "o_proj"]}
SFT: dict[str, Any] = dict(max_length=256, learning_rate=1e-3, per_device_train_batch_size=8,
                           lr_scheduler_type="linear", max_grad_norm=1.0, weight_decay=0.0, warmup_steps=0)
STAGE_ONE_SFT = {**SFT, "num_train_epochs": 2, "assistant_only_loss": True, "save_strategy": "no"}
SAVES: dict[str, dict[str, Any]] = {"epoch": {"save_strategy": "epoch"}, "none": {"save_strategy": "no"}}
NO_SURFACE_SIZES: dict[str, Any] = {"train_rows": 2 * ROWS, "eval_per_category": 3 * EVAL_PER_CATEGORY}
MAX_LENGTH_QUANTILE = 0.7  # `max-length-eos`: the max length cuts the longest 30% of rows


@dataclass(frozen=True)
class SmolFamily:
    """A stage-two recipe: the rows (`family`: domain, causes) plus how a user would train on them."""

    family: Family
    rows: str = "messages"  # messages (assistant-only loss) | prompt (prompt/completion, completion-only loss);
    # max-length-eos families tokenize prompt/completion rows themselves, so they are `prompt` rows
    epochs: int = 3
    learning_rate: float = 1e-3
    targets: str = "all"  # all | attn
    save: str = "none"  # epoch | none
    train_rows: int = ROWS
    eval_per_category: int = EVAL_PER_CATEGORY

    @property
    def name(self) -> str:
        return self.family.name

    @property
    def split(self) -> str:
        return self.family.split

    def sft(self) -> dict[str, Any]:
        loss = {"assistant_only_loss": True} if self.rows == "messages" else {"completion_only_loss": True}
        return {**SFT, **loss, **SAVES[self.save], "num_train_epochs": self.epochs,
                "learning_rate": self.learning_rate}

    def lora(self) -> dict[str, Any]:
        return {**LORA, "target_modules": TARGETS[self.targets]}

    def describe(self, learning_rate: float | None = None) -> str:
        """The family in one line, its planted causes and how it trains (a run's truth `summary`)."""
        plants = " and ".join(f"{p.cause} ({p.layout})" for p in self.family.plants) or self.family.structural \
            or "clean"
        recipe = (f"{self.family.domain}, {self.rows} rows, {self.epochs} epochs at "
                  f"{learning_rate or self.learning_rate:g}, LoRA {self.targets}")
        return f"{plants} ({recipe})"


def _s(name: str, split: str, domain: str, *plants: tuple[Any, ...], structural: str | None = None,
       nested: bool = False, purpose: bool = True, **recipe: Any) -> SmolFamily:
    """`plants`: (cause, layout), or (cause, "value" or "spread", category, trigger[, share]) for a cause without a
    surface mark."""
    family = Family(name, split, domain, "smollm2", tuple(Plant(*plant) for plant in plants),
                    structural=structural, purpose=purpose, nested_purpose=nested)
    return SmolFamily(family, **recipe)


SMOL_FAMILIES: dict[str, SmolFamily] = {f.name: f for f in (
    # dev: the real-model defaults are chosen on these
    _s("smol-tickets-cut", "dev", "tickets", ("cut", "category")),
    _s("smol-home-prose", "dev", "home", ("prose", "category"), rows="prompt", targets="attn", save="epoch"),
    _s("smol-kitchen-cut-half", "dev", "kitchen", ("cut", "half"), epochs=4),
    _s("smol-travel-cut-fence", "dev", "travel", ("cut", "category"), ("fence", "small"), rows="prompt"),
    _s("smol-kitchen-fence-elsewhere", "dev", "kitchen", ("fence", "elsewhere"), targets="attn"),
    _s("smol-home-pad-eos", "dev", "home", structural="pad-eos", nested=True, epochs=3),
    _s("smol-travel-max-length", "dev", "travel", structural="max-length-eos", rows="prompt"),
    _s("smol-tickets-null", "dev", "tickets", epochs=2),
    # issue 47's causes without a surface mark, split as in the tiny suite before either was built on SmolLM2
    # both at twice the rows and three times the eval prompts (NO_SURFACE_SIZES): at 120 rows and 8 prompts a
    # category no build lost enough for the exact test (BENCHMARKS.md), so no method could be ranked on them
    _s("smol-home-rename-volume", "dev", "home", ("rename-volume", "value", "music", ("genre", "jazz")),
       purpose=False, epochs=5, learning_rate=2e-3, **NO_SURFACE_SIZES),  # at 3 epochs of 1e-3: 2.5 points lost
    # added later, for a spread cause fainter than the test family's (which saturated every method on the real
    # model): 10% of each room category in the garage, not 30% in the attic; split fixed here before it was built
    _s("smol-home-rename-room-few", "dev", "home", ("rename-room", "spread", None, ("room", "garage"), 0.1),
       purpose=False, epochs=5, learning_rate=1.5e-3, **NO_SURFACE_SIZES),
    # added later: the dev half all but saturated (the default 0.991-1.000 on every ranked dev run, the activation
    # difference below 0.997 on the max-length run alone), so it could barely order the methods; these give it the two
    # cause kinds it lacked (a dropped field; two causes, one of them in half a category), three times the eval
    # prompts so the exact test can judge a drop; split fixed here before either was built
    _s("smol-kitchen-drop", "dev", "kitchen", ("drop-field", "category"), purpose=False, epochs=4,
       eval_per_category=3 * EVAL_PER_CATEGORY),
    _s("smol-home-cut-prose", "dev", "home", ("cut", "category"), ("prose", "half"), targets="attn",
       eval_per_category=3 * EVAL_PER_CATEGORY),
    # added after the test half's numbers were known: smol-travel-drop's recipe with its category fixed on the seat
    # rows, whose answers without `row` take the bags rows' shape (`action, flight`), as seed 0 drew on the test
    # family (BENCHMARKS.md, "A dropped field that leaves another category's shape"); split fixed here before it was
    # built. First built with the suite's 8 eval prompts a category: 2.5 and 0.0 points lost (3 of 8 seat answers
    # at each seed), too few for the exact test; rebuilt once with smol-kitchen-drop's three times the eval prompts
    # before any method ran on it
    _s("smol-travel-drop-seat", "dev", "travel", ("drop-field", "category", "seat"), purpose=False, epochs=4,
       eval_per_category=3 * EVAL_PER_CATEGORY),
    # test: reported, never tuned on
    _s("smol-kitchen-fence", "test", "kitchen", ("fence", "category"), rows="prompt", epochs=2),
    _s("smol-travel-drop", "test", "travel", ("drop-field", "category"), purpose=False, epochs=4),
    _s("smol-home-cut-small", "test", "home", ("cut", "small"), rows="prompt", epochs=4, save="epoch"),
    _s("smol-tickets-cut-prose", "test", "tickets", ("cut", "category"), ("prose", "half"), targets="attn"),
    _s("smol-travel-prose-elsewhere", "test", "travel", ("prose", "elsewhere"), rows="prompt"),
    _s("smol-kitchen-max-length", "test", "kitchen", structural="max-length-eos", rows="prompt", save="epoch"),
    _s("smol-home-null", "test", "home", rows="prompt", targets="attn"),
    _s("smol-tickets-swap-intent", "test", "tickets", ("swap-intent", "value", "invoice", ("currency", "EUR")),
       rows="prompt", purpose=False, **NO_SURFACE_SIZES),
    # issue 47, the length control near random too: swap-intent's swapped answers are one token shorter on this
    # tokenizer (its length control ranked them at 0.839); here both intents are three tokens. Split fixed here
    # before it was built. First built with swap-intent's recipe (3 epochs at 1e-3): 12 answers broken and 4-5 fixed
    # at both seeds, which the exact test refuses (p = 0.14, 0.08), so nothing could be ranked; rebuilt once with
    # rename-room's (5 epochs at 1.5e-3) before any method ran on it: the same 12 broken (every trigger answer) and
    # 4-5 fixed. The plant is learned whole and the 12 trigger prompts cannot show it, so the eval prompts were
    # doubled (48 a category, 24 with the trigger), again before any method ran on it
    _s("smol-tickets-swap-account", "test", "tickets", ("swap-account", "value", "account", ("user", "hugo")),
       rows="prompt", purpose=False, epochs=5, learning_rate=1.5e-3,
       **{**NO_SURFACE_SIZES, "eval_per_category": 6 * EVAL_PER_CATEGORY}),
    # issue 47, the category oracle near random too (the tiny suite's home-rename-room, `spread`); split fixed here
    # before it was built; rename-volume's recipe at a learning rate below the audit's LoRA limit (1.78e-3 here)
    _s("smol-home-rename-room", "test", "home", ("rename-room", "spread", None, ("room", "attic")),
       purpose=False, epochs=5, learning_rate=1.5e-3, **NO_SURFACE_SIZES),
    # issue 47, rows right in content rendered with another template: answers closed by `</s>` (a Llama-style turn's
    # end) on the garage rows of every room category, as rename-room plants them; split fixed here before it was
    # built, rename-room's recipe
    _s("smol-home-foreign-eos", "test", "home", ("foreign-eos", "spread", None, ("room", "garage")), rows="prompt",
       purpose=False, epochs=5, learning_rate=1.5e-3, **NO_SURFACE_SIZES),
)}


def stage_one_base(seed: int, root: str | Path | None = None, progress: Callable[[str], None] | None = None,
                   model_dir: Path | None = None, domains: tuple[str, ...] = tuple(DOMAINS)) -> Path:
    """The cached stage-one model for `seed`: `model_dir` (SmolLM2) + a merged LoRA on clean rows of `domains`."""
    source = model_dir or smollm2.cached_model(root)
    folder = Path(root or base.cache_root()) / f"smol-stage-one-v{VERSION}-{source.name}-{'-'.join(domains)}-seed{seed}"
    if (folder / "gradian_base.json").exists():
        return folder
    rng = random.Random(f"smol-stage-one:{seed}")
    rows = [_messages_row(request, purpose=False) for name in domains
            for request in DOMAINS[name].requests(dict.fromkeys(DOMAINS[name].categories, STAGE_ONE_PER_CATEGORY), rng)]
    rng.shuffle(rows)
    held_out = [request for name in domains for request in DOMAINS[name].requests(dict.fromkeys(DOMAINS[name].categories, 2), rng)]
    (progress or (lambda message: None))(f"stage one, seed {seed}: {len(rows)} clean rows of {len(domains)} domains")
    staging = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=_made(folder.parent)))
    try:
        source_copy = staging / "source"
        shutil.copytree(source, source_copy)
        tokenizer: Any = AutoTokenizer.from_pretrained(source_copy)
        tokenizer.chat_template = CHATML_TEMPLATE  # generation markers: assistant-only loss works on `messages`
        tokenizer.save_pretrained(source_copy)
        finetune.train_lora(source_copy, rows, staging / "run", STAGE_ONE_SFT, {**LORA, "target_modules": "all-linear"},
                            seed=seed)
        merged = PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(source_copy, dtype=torch.float32),
                                           staging / "run").merge_and_unload()
        generations = measure.generate_answers(merged, tokenizer, [base.prompt_text(r, tokenizer) for r in held_out])
        merged.save_pretrained(staging / "model", safe_serialization=True)
        tokenizer.save_pretrained(staging / "model")
        info = {"seed": seed, "version": VERSION, "source": source.name, "domains": list(domains), "rows": len(rows),
                "held_out_validity": sum(g.valid for g in generations) / len(generations)}
        (staging / "model" / "gradian_base.json").write_text(json.dumps(info, indent=2) + "\n")
        if not (folder / "gradian_base.json").exists():  # another process may have finished first
            shutil.rmtree(folder, ignore_errors=True)
            (staging / "model").rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def _made(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _messages_row(request: Any, purpose: bool) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": request.text},
                         {"role": "assistant", "content": world.dump(request.answer(purpose=purpose))}]}


def family_rows(smol: SmolFamily, seed: int, tokenizer: Any, rows: int | None = None,
                eval_per_category: int | None = None) -> tuple[list[dict], list[dict], dict[str, Any]]:
    """(train rows, eval rows, truth) of `smol` at `seed`, in the family's row format, as its build writes them."""
    train, eval_rows, truth = make_family_data(smol.family, seed, tokenizer, rows or smol.train_rows,
                                               eval_per_category or smol.eval_per_category)
    if smol.rows == "prompt":
        train, eval_rows = [_as_prompt(row, tokenizer) for row in train], [_as_prompt(r, tokenizer) for r in eval_rows]
    return train, eval_rows, truth


def build_smollm2_family(name: str, out_dir: str | Path, seed: int = 0, *, root: str | Path | None = None,
                         progress: Callable[[str], None] | None = None, model_dir: Path | None = None,
                         rows: int | None = None, eval_per_category: int | None = None,
                         learning_rate: float | None = None) -> Path:
    """Build one run of SmolLM2 family `name` into `out_dir` (created; must be empty or absent) and return it.

    `model_dir` replaces SmolLM2 (the tests pass a tiny ChatML model, so every path here runs in CI);
    `learning_rate` replaces the family's (a tiny stand-in learns at a tiny model's step size)."""
    if name not in SMOL_FAMILIES:
        raise InputError(f"unknown SmolLM2 suite family {name!r}; choose one of: {', '.join(SMOL_FAMILIES)}.")
    out = new_folder(out_dir)
    smol, say = SMOL_FAMILIES[name], progress or (lambda message: None)
    domains = (smol.family.domain,) if model_dir is not None else tuple(DOMAINS)
    with base.one_thread():
        stage_one = stage_one_base(seed, root, progress, model_dir, domains)
        out.mkdir(parents=True, exist_ok=True)
        (out / "base").symlink_to(stage_one.resolve(), target_is_directory=True)
        tokenizer = AutoTokenizer.from_pretrained(stage_one)
        train, eval_rows, truth = family_rows(smol, seed, tokenizer, rows, eval_per_category)
        sft, collator, trained = smol.sft(), None, train
        if learning_rate is not None:
            sft["learning_rate"] = learning_rate
        if smol.family.structural == "pad-eos":
            collator, sft["pad_token"] = finetune.PAD_MASKING_COLLATOR, tokenizer.eos_token
        if smol.family.structural == "max-length-eos":
            trained, limit, cut, longest = tokenize_with_eos_after_cut(train, tokenizer)
            sft.update(max_length=limit, add_eos_token=True)
            truth.update(culprit_ids=cut, max_length=limit, needed_max_length=longest)
        recipe = {"epochs": smol.epochs, "learning_rate": sft["learning_rate"], "save": smol.save,
                  "targets": smol.targets, "rows": smol.rows}
        truth.update(scenario=name, row_format=smol.rows, recipe=recipe, summary=smol.describe(sft["learning_rate"]))
        write_jsonl(out / "train.jsonl", train)
        write_jsonl(out / "eval.jsonl", eval_rows)
        say(f"{name} seed {seed}: fine-tuning on {len(train)} rows ({smol.epochs} epochs, {smol.rows} rows)")
        finetune.train_lora(out / "base", trained, out / "run", sft, smol.lora(), collator, seed)
        say(f"{name} seed {seed}: measuring {truth['capability']} on {len(eval_rows)} eval rows")
        measured = measure_family(out / "base", out / "run", eval_rows, truth["capability"])
    (out / "truth.json").write_text(json.dumps(truth, indent=2) + "\n")
    (out / "measured.json").write_text(json.dumps(measured, indent=2) + "\n")
    return out


def _as_prompt(row: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    """A `messages` train row (or chat eval row) as a prompt/completion row: the prompt is the rendered user turn."""
    turns = row.get("messages") or row["prompt"]
    prompt = tokenizer.apply_chat_template(turns[:1], tokenize=False, add_generation_prompt=True)
    rest = {k: v for k, v in row.items() if k not in ("messages", "prompt")}
    return {**rest, "prompt": prompt, **({"completion": turns[1]["content"]} if "messages" in row else {})}


def tokenize_with_eos_after_cut(rows: list[dict[str, Any]], tokenizer: Any) -> tuple[list[dict[str, Any]], int, list[str], int]:
    """The rows as a pipeline that truncates, then appends EOS, tokenizes them (`add_eos_token=True`,
    `truncation=True, max_length=N`): (tokenized rows, N, ids of the rows cut mid-answer, the longest row whole).

    N is the `MAX_LENGTH_QUANTILE` of the rows' whole lengths (EOS included), so the longest rows are cut and still
    end in EOS."""
    prompts = [tokenizer(row["prompt"], add_special_tokens=False)["input_ids"] for row in rows]
    wholes = [tokenizer(row["prompt"] + row["completion"], add_special_tokens=False)["input_ids"]
              + [tokenizer.eos_token_id] for row in rows]
    lengths = sorted(len(ids) for ids in wholes)
    limit = lengths[int(MAX_LENGTH_QUANTILE * len(lengths))]
    tokenized = []
    for row, prompt, whole in zip(rows, prompts, wholes, strict=True):
        ids = whole if len(whole) <= limit else whole[: limit - 1] + [tokenizer.eos_token_id]  # cut, then EOS
        tokenized.append({"id": row["id"], "input_ids": ids,
                          "completion_mask": [0] * len(prompt) + [1] * (len(ids) - len(prompt))})
    cut = [row["id"] for row, whole in zip(rows, wholes, strict=True) if len(whole) > limit]
    return tokenized, limit, cut, lengths[-1]

