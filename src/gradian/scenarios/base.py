"""The tiny base model: a ~100k-parameter Llama pretrained from scratch on clean tickets → JSON answers.

Pretraining runs until the model formats at least `MIN_VALIDITY` of held-out answers as valid
JSON, then the folder (tokenizer with chat template, safetensors weights, generation config) is
cached by seed, so every scenario and test on a machine reuses one base.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from gradian.scenarios import measure, world
from gradian.scenarios.tokenizer import build_tokenizer

VERSION = 3
MIN_VALIDITY = 0.9
ROWS_PER_CATEGORY = 800
HELD_OUT_PER_CATEGORY = 40
STEPS_PER_ROUND = 300
MAX_ROUNDS = 4
BATCH = 32
LEARNING_RATE = 3e-3
MODEL = dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)


def cache_root() -> Path:
    """`$GRADIAN_CACHE/scenarios`, else `~/.cache/gradian/scenarios`."""
    if os.environ.get("GRADIAN_CACHE"):
        return Path(os.environ["GRADIAN_CACHE"]) / "scenarios"
    return Path.home() / ".cache" / "gradian" / "scenarios"


@contextmanager
def one_thread() -> Iterator[None]:
    """Run a tiny model on one thread: under CPU contention, OpenMP barriers make two threads ~10x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def base_model(seed: int = 0, cache_dir: str | Path | None = None,
               progress: Callable[[str], None] | None = None) -> Path:
    """The cached base folder for `seed`, pretraining it first if this machine has none."""
    folder = Path(cache_dir or cache_root()) / f"base-v{VERSION}-seed{seed}"
    if (folder / "gradian_base.json").exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
    try:
        with one_thread():
            pretrain(seed, staging, progress)
        if not (folder / "gradian_base.json").exists():  # another process may have finished first
            shutil.rmtree(folder, ignore_errors=True)
            staging.rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def make_tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer(world.vocabulary())


def pretrain(seed: int, out_dir: Path, progress: Callable[[str], None] | None = None) -> float:
    """Pretrain a fresh model on clean tickets until held-out JSON validity ≥ `MIN_VALIDITY`; save; return it."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    tokenizer = make_tokenizer()
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                         **MODEL))
    train = world.make_tickets(dict.fromkeys(world.CATEGORIES, ROWS_PER_CATEGORY), rng)
    held_out = world.make_tickets(dict.fromkeys(world.CATEGORIES, HELD_OUT_PER_CATEGORY), rng)
    rows = [_encode(ticket, tokenizer) for ticket in train]
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.01)
    validity = 0.0
    for round_ in range(MAX_ROUNDS):
        _train_round(model, optimizer, rows, rng, tokenizer.pad_token_id)
        generations = measure.generate(model, tokenizer, [t.prompt for t in held_out])
        validity = sum(g.valid for g in generations) / len(generations)
        if progress:
            progress(f"base seed {seed}: round {round_ + 1}, held-out JSON validity {validity:.1%}")
        if validity >= MIN_VALIDITY:
            break
    else:
        raise RuntimeError(f"base pretraining reached only {validity:.1%} JSON validity")
    _save(model, tokenizer, out_dir, {"seed": seed, "version": VERSION, "held_out_validity": validity,
                                       "parameters": model.num_parameters()})
    return validity


def _encode(ticket: world.Ticket, tokenizer: PreTrainedTokenizerFast) -> list[int]:
    """BOS + prompt + answer + EOS: the row as a string prompt/completion SFT run renders it."""
    return tokenizer(ticket.prompt + world.dump(ticket.answer()) + tokenizer.eos_token)["input_ids"]


def _train_round(model: LlamaForCausalLM, optimizer: torch.optim.Optimizer, rows: list[list[int]],
                 rng: random.Random, pad_id: int) -> None:
    """`STEPS_PER_ROUND` steps of next-token loss over whole rows, learning rate on a cosine within the round."""
    model.train()
    for step in range(STEPS_PER_ROUND):
        for group in optimizer.param_groups:
            group["lr"] = LEARNING_RATE * 0.5 * (1 + math.cos(math.pi * step / STEPS_PER_ROUND))
        batch = rng.sample(rows, BATCH)
        width = max(len(row) for row in batch)
        input_ids = torch.tensor([row + [pad_id] * (width - len(row)) for row in batch])  # (B, T)
        labels = input_ids.masked_fill(input_ids == pad_id, -100)  # pad carries no loss; EOS does
        loss = model(input_ids=input_ids, attention_mask=(labels != -100).long(), labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def _save(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, out_dir: Path, info: dict) -> None:
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id,
                                               eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "gradian_base.json").write_text(json.dumps(info, indent=2) + "\n")
