"""Batched greedy generation with one stop rule for the base and the fine-tuned model.

Prompts come as token ids (rendered by `gradian.data.render.render_prompt`), are sorted by length
so a batch wastes little padding, left-padded (the new tokens line up at the right edge) and run
through `model.generate`. Each answer keeps its EOS token when the model emitted one: attribution
needs it, because stopping too early is itself the failure in the commonest regression.

Batches are large by default (`GENERATION_BATCH`): a decoding step reads every weight for one token
a row, so a small batch spends its step reading weights. On SmolLM2-135M on one CPU thread, 240
answers took 0.56x the time at 64 a batch as at 16, and 128 a batch gained little more
(BENCHMARKS.md). A batch is never larger than the key-value cache of its longest answer fits into
half the device's free memory (`rows_that_fit`: a CPU out of memory is a kill, not an error), and a
batch that runs out of memory all the same is halved, the rest following at the smaller size.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psutil
import torch
from accelerate.utils.memory import clear_device_cache, should_reduce_batch_size

from gradian.settings import GENERATION_BATCH

CACHE_SHARE = 0.5  # of the device's free memory, the most a batch's key-value cache may take


@dataclass
class GeneratedAnswer:
    """New tokens (EOS included when emitted), their text without special tokens, and whether EOS came."""

    ids: list[int]
    text: str
    stopped: bool

    def to_dict(self) -> dict[str, Any]:
        return {"ids": self.ids, "text": self.text, "stopped": self.stopped}


def stop_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """The stop tokens `model.generate` uses at inference: the generation config's, else the tokenizer's EOS.

    Not both: a run that replaced the tokenizer's EOS (SFTConfig `eos_token`) saves that tokenizer, but the
    model is served with its own generation config, so a model that learned to end on another token runs on.
    """
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = [configured] if isinstance(configured, int) else list(dict.fromkeys(configured or []))
    if not ids and tokenizer.eos_token_id is not None:
        ids = [tokenizer.eos_token_id]
    return ids


def generate(
    model: Any,
    tokenizer: Any,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    batch_size: int = GENERATION_BATCH,
    progress: Callable[[int], Any] | None = None,
    stops: list[int] | None = None,
) -> list[GeneratedAnswer]:
    """Greedy answers to `prompts`, in their order, ended by `stops` (None: the model's own, `stop_token_ids`).
    `progress(n)` gets the count finished by each batch. A batch that runs out of memory is retried at half the
    size, which the rest keep; at one prompt a batch the error stands."""
    from transformers import GenerationConfig

    if any(len(prompt) == 0 for prompt in prompts):
        raise ValueError("every prompt needs at least one token")
    stops = stop_token_ids(model, tokenizer) if stops is None else stops
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (stops[0] if stops else 0)
    config = GenerationConfig(
        do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=stops or None, pad_token_id=pad_id,
        num_beams=1, temperature=None, top_p=None, top_k=None,
    )
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    results: list[GeneratedAnswer | None] = [None] * len(prompts)
    fit = rows_that_fit(model, max(map(len, prompts), default=0) + max_new_tokens)
    batch_size = batch_size if fit is None else min(batch_size, fit)
    start = 0
    while start < len(order):
        batch = order[start : start + batch_size]
        try:
            answers = _generate_batch(model, tokenizer, [prompts[i] for i in batch], config, pad_id, set(stops))
        except RuntimeError as error:  # accelerate's test: CUDA, MPS, XPU or CPU out of memory
            if batch_size == 1 or not should_reduce_batch_size(error):
                raise
            clear_device_cache(garbage_collection=True)
            batch_size //= 2
            continue
        for index, generation in zip(batch, answers, strict=True):
            results[index] = generation
        start += len(batch)
        if progress is not None:
            progress(len(batch))
    return results  # type: ignore[return-value]


def rows_that_fit(model: Any, tokens: int) -> int | None:
    """How many rows of `tokens` tokens a batch's key-value cache fits into `CACHE_SHARE` of the device's free memory
    (at least one); None when the model's config does not say its cache's shape or the device its free memory."""
    per_token = cache_bytes_per_token(model)
    free = free_memory(next(model.parameters()).device)
    if per_token is None or free is None:
        return None
    return max(1, int(CACHE_SHARE * free) // (per_token * max(tokens, 1)))


def cache_bytes_per_token(model: Any) -> int | None:
    """Bytes of key-value cache a token takes: keys and values of every layer, from the model's config (None where
    the config does not say)."""
    config = getattr(model, "config", None)
    layers, heads = getattr(config, "num_hidden_layers", None), getattr(config, "num_attention_heads", None)
    hidden = getattr(config, "hidden_size", None)
    if not (isinstance(layers, int) and isinstance(heads, int) and isinstance(hidden, int)):
        return None
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    return 2 * layers * kv_heads * head_dim * next(model.parameters()).element_size()


def free_memory(device: torch.device) -> int | None:
    """Free bytes of `device`: CUDA's own count, the host's available memory for a CPU, else None."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "cpu":
        return int(psutil.virtual_memory().available)
    return None


@torch.no_grad()
def _generate_batch(
    model: Any, tokenizer: Any, prompts: Sequence[list[int]], config: Any, pad_id: int, stops: set[int]
) -> list[GeneratedAnswer]:
    device = next(model.parameters()).device
    width = max(len(prompt) for prompt in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)  # (B, T) left-padded
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)  # (B, T) 1 = real token
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        attention_mask[row, width - len(prompt) :] = 1
    output = model.generate(
        input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), generation_config=config
    )  # (B, T + new); rows that stopped early are padded after their EOS
    return [cut_at_stop(row[width:].tolist(), tokenizer, stops) for row in output]


def cut_at_stop(new_ids: list[int], tokenizer: Any, stops: set[int]) -> GeneratedAnswer:
    """Cut at the first stop token, keeping it: the answer as the model ended it."""
    for position, token in enumerate(new_ids):
        if token in stops:
            ids = new_ids[: position + 1]
            return GeneratedAnswer(ids, tokenizer.decode(ids, skip_special_tokens=True), True)
    return GeneratedAnswer(new_ids, tokenizer.decode(new_ids, skip_special_tokens=True), False)
