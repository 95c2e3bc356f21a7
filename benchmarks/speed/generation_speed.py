"""Throughput of Gradian's batched greedy generation vs one prompt at a time, on the same model and prompts.

Both runs go through `gradian.regression.generation.generate` (the code `gradian attribute` uses), with the
LoRA adapter active, so the ratio is what batching buys when measuring a regression. Also reported: the
share of answers that are token-for-token identical between the two runs (left padding must not change
greedy answers; in bf16 a few may differ at near-ties).

Models are random-weight Llamas from a config (`tiny`, `smollm2-135m`, `llama-1b` shapes) with a random
LoRA adapter on q/v, or a real base + adapter with `--base-model` and `--adapter`. Prints a markdown table.

`--scenario FOLDER` times what `attribute`'s regression step does on a built scenario: its eval prompts rendered
as the run renders them, answered by the base (adapter off) and then the fine-tuned model, at each batch size
against `--baseline` (`generate`'s default batch, `GENERATION_BATCH`, was chosen this way).

    python -m benchmarks.speed.generation_speed --models tiny smollm2-135m
    python -m benchmarks.speed.generation_speed --models smollm2-135m llama-1b --device cuda --batch-size 16 64
    OMP_NUM_THREADS=1 python -m benchmarks.speed.generation_speed --threads 1 --baseline 16 --batch-size 32 64 128 \
        --scenario ~/.cache/gradian/smollm2-suite/runs/smol-kitchen-drop-seed0
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from gradian.regression.generation import generate

SHAPES = {
    "tiny": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=64),
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True),
    "llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True),
}


def random_model(name: str, device: str, dtype: torch.dtype) -> tuple[torch.nn.Module, SimpleNamespace]:
    """A seeded random Llama of `name`'s shape with a random (non-zero) LoRA adapter, and a stub tokenizer."""
    torch.manual_seed(0)
    shape = SHAPES[name]
    config = LlamaConfig(max_position_embeddings=2048, bos_token_id=1, eos_token_id=2, pad_token_id=0, **shape)
    model = LlamaForCausalLM(config).to(device=device, dtype=dtype)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    tokenizer = SimpleNamespace(eos_token_id=2, pad_token_id=0, decode=lambda ids, skip_special_tokens=True: "")
    return get_peft_model(model, lora).eval(), tokenizer


def real_model(base: str, adapter: str, device: str, dtype: torch.dtype) -> tuple[torch.nn.Module, object]:
    from gradian.data.base_model import resolve_base_model
    from gradian.regression.loading import load_models

    return load_models(resolve_base_model(base), adapter, device=device, dtype=dtype)


def scenario(folder: str, device: str) -> tuple[torch.nn.Module, object, list[list[int]], int]:
    """A built scenario's fine-tuned model and tokenizer, its eval prompts as `attribute` renders them, and the
    answer limit `attribute` sets from their references."""
    from gradian.data.render import render_prompt
    from gradian.gradients.distributed import Ranks
    from gradian.regression.measure import default_max_new_tokens
    from gradian.scenarios import attribute_settings
    from gradian.stages import load, run_audit

    with tempfile.TemporaryDirectory() as out:  # nothing is written: the audit is read, not kept
        settings = attribute_settings(folder, out, device=device)
        audit = run_audit(settings, write=False)
        model, tokenizer = load(settings, audit, Ranks())
    examples = audit.eval_examples or []
    prompts = [render_prompt(example, tokenizer, audit.setup) for example in examples]
    return model, tokenizer, prompts, default_max_new_tokens(tokenizer, [e.completion_text for e in examples])


def make_prompts(vocab: int, count: int, low: int, high: int, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high + 1, (count,), generator=generator).tolist()
    return [torch.randint(3, vocab, (length,), generator=generator).tolist() for length in lengths]


def timed(model, tokenizer, prompts, max_new_tokens: int, batch_size: int, device: str, both: bool = False):
    """The answers and seconds of the adapter's model; `both`: the base's answers first (timed, adapter off)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    answers = []
    if both:
        with model.disable_adapter():
            answers = generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size)
    answers += generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return answers, time.perf_counter() - start


def measure(label, model, tokenizer, prompts, args, both: bool = False) -> list[str]:
    """One table row per batch size, each against the same `--baseline` run (batch 1 by default)."""
    generate(model, tokenizer, prompts[:2], max_new_tokens=4, batch_size=2)  # warm-up: kernels, allocator
    single, single_s = timed(model, tokenizer, prompts, args.max_new_tokens, args.baseline, args.device, both)
    single_tps = sum(len(a.ids) for a in single) / single_s
    lines = []
    for batch_size in args.batch_size:
        batched, batched_s = timed(model, tokenizer, prompts, args.max_new_tokens, batch_size, args.device, both)
        batched_tps = sum(len(a.ids) for a in batched) / batched_s
        same = sum(a.ids == b.ids for a, b in zip(single, batched, strict=True)) / len(single)
        tokens = sum(len(a.ids) for a in batched)
        lines.append(
            f"| {label} | {args.device} {str(args.dtype).removeprefix('torch.')} | {len(single)} | {tokens} | "
            f"{_rate(single_tps)} | {batch_size} | {_rate(batched_tps)} | **{batched_tps / single_tps:.2f}×** | "
            f"{same:.0%} |"
        )
    return lines


def _rate(tokens_per_second: float) -> str:
    return f"{tokens_per_second:,.0f}" if tokens_per_second >= 100 else f"{tokens_per_second:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2-135m"], choices=sorted(SHAPES))
    parser.add_argument("--base-model", help="a real base model folder (with --adapter) instead of --models")
    parser.add_argument("--adapter")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="float32 | bfloat16 (default: bf16 on CUDA, else fp32)")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--prompt-length", type=int, nargs=2, default=(16, 48), metavar=("MIN", "MAX"))
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--batch-size", type=int, nargs="+", default=[16])
    parser.add_argument("--baseline", type=int, default=1, help="the batch size each row is compared with")
    parser.add_argument("--scenario", help="a built scenario folder: its eval prompts, base and fine-tuned model")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.dtype = getattr(torch, args.dtype) if args.dtype else (
        torch.bfloat16 if args.device.startswith("cuda") else torch.float32)
    lines = [
        f"| model | device | answers | new tokens | batch-{args.baseline} tok/s | batch | batched tok/s | speed-up "
        "| identical |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    if args.scenario:
        model, tokenizer, prompts, args.max_new_tokens = scenario(args.scenario, args.device)
        lines += measure(Path(args.scenario).name + " (base, then fine-tuned)", model, tokenizer, prompts, args, True)
    elif args.base_model:
        model, tokenizer = real_model(args.base_model, args.adapter, args.device, args.dtype)
        prompts = make_prompts(len(tokenizer), args.prompts, *args.prompt_length)
        lines += measure(args.base_model, model, tokenizer, prompts, args)
    for name in [] if args.base_model or args.scenario else args.models:
        model, tokenizer = random_model(name, args.device, args.dtype)
        prompts = make_prompts(SHAPES[name]["vocab_size"], args.prompts, *args.prompt_length)
        lines += measure(name, model, tokenizer, prompts, args)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
