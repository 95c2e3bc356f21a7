"""Speed of per-example gradient extraction, as ratios measured in one run on the same model and rows.

- extraction tokens/s ÷ a plain batched LoRA forward+backward on the same batches (the physical floor: 1.0)
- extraction tokens/s ÷ a naive batch-1 loop (one forward + autograd.grad per row, LESS-style)
- peak RSS of an extraction of N and 10·N rows (each in a fresh process, CPU), to show memory stays flat

Models are random-weight Llamas from a config: `tiny` (conftest-sized), `smollm2-135m` (SmolLM2-135M's
shape), and `llama-1b` (Llama-3.2-1B's shape, meant for a GPU in bf16). Prints a markdown table.

    python -m benchmarks.speed.gradient_speed --models tiny smollm2-135m
    python -m benchmarks.speed.gradient_speed --models llama-1b --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from gradian.data.render import IGNORE, Rendered
from gradian.gradients.batches import collate, plan_batches
from gradian.gradients.extract import GradientSettings, extract_train_features, summed_nll

SHAPES = {
    "tiny": dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
    ),
    "smollm2-135m": dict(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=49152,
        tie_word_embeddings=True,
    ),
    "llama-1b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        tie_word_embeddings=True,
    ),
}
# (rows, min, max len). The tiny model's 512 rows take half a second: at 64 rows (70 ms) the run's fixed costs
# (store files, the adapter's hash) weigh as much as a tenth of it, and tokens/s would measure them, not throughput.
ROWS = {"tiny": (512, 24, 96), "smollm2-135m": (12, 32, 128), "llama-1b": (64, 256, 1024)}


def build(name: str, device: str, dtype: torch.dtype, targets: str) -> torch.nn.Module:
    torch.manual_seed(0)
    config = LlamaConfig(max_position_embeddings=2048, **SHAPES[name])
    model = LlamaForCausalLM(config).to(device=device, dtype=dtype)
    lora = LoraConfig(
        r=8,
        lora_alpha=16,
        target_modules=targets if targets == "all-linear" else targets.split(","),
        init_lora_weights=False,
    )
    return get_peft_model(model, lora).eval()


def make_rows(name: str, n: int | None = None, seed: int = 0) -> list[Rendered]:
    count, low, high = ROWS[name]
    generator = torch.Generator().manual_seed(seed)
    vocab = SHAPES[name]["vocab_size"]
    rows = []
    for i in range(n or count):
        length = int(torch.randint(low, high + 1, (1,), generator=generator))
        ids = torch.randint(3, vocab, (length,), generator=generator).tolist()
        prompt = length // 3
        rows.append(Rendered(str(i), ids, [IGNORE] * prompt + ids[prompt:], length, prompt))
    return rows


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def plain_step_seconds(model, rows, settings, device) -> float:
    """Batched forward + backward of the summed loss, LoRA weight gradients only: what a training step costs.

    The gradients are dropped as an optimizer's `zero_grad` drops them, by parameter (`model.zero_grad` walks
    every module, a cost of its own that would flatter the ratio).
    """
    batches = plan_batches({i: len(r.input_ids) for i, r in enumerate(rows)}, settings)
    params = [p for p in model.parameters() if p.requires_grad]
    sync(device)
    start = time.perf_counter()
    for batch_rows in batches:
        batch = {
            k: v.to(device) for k, v in collate([(rows[i].input_ids, rows[i].labels) for i in batch_rows], 0).items()
        }
        logits = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
        ).logits
        summed_nll(logits, batch["labels"]).backward()
        for param in params:
            param.grad = None
    sync(device)
    return time.perf_counter() - start


def naive_row_gradient(model, row: Rendered, params: list[torch.Tensor], device) -> torch.Tensor:
    """One unpadded forward + autograd.grad: the row's LoRA gradient, flattened (LESS's batch-1 step)."""
    ids, labels = (torch.tensor([values], device=device) for values in (row.input_ids, row.labels))
    loss = summed_nll(model(input_ids=ids).logits, labels)
    return torch.cat([g.flatten() for g in torch.autograd.grad(loss, params)])


def naive_loop_seconds(model, rows, device) -> float:
    """`naive_row_gradient` per row, to the CPU (LESS's batch-1 loop, no projection)."""
    params = [p for p in model.parameters() if p.requires_grad]
    sync(device)
    start = time.perf_counter()
    for row in rows:
        naive_row_gradient(model, row, params, device).float().cpu()
    sync(device)
    return time.perf_counter() - start


def extraction_seconds(model, rows, settings, device) -> float:
    with tempfile.TemporaryDirectory() as store:
        sync(device)
        start = time.perf_counter()
        extract_train_features(model, rows, store, settings=settings)
        sync(device)
        return time.perf_counter() - start


def peak_rss_mb(name: str, n: int, targets: str) -> float:
    """Peak RSS of a fresh process that extracts n rows of `name` (CPU)."""
    out = subprocess.run(
        [sys.executable, __file__, "--rss-child", name, str(n), targets], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_rss_mb"]


def rss_child(name: str, n: int, targets: str) -> None:
    torch.set_num_threads(2)
    model = build(name, "cpu", torch.float32, targets)
    extraction_seconds(model, make_rows(name, n), GradientSettings(), "cpu")
    print(json.dumps({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def measure(name: str, device: str, dtype: torch.dtype, targets: str, rss_rows: int | None, repeats: int) -> dict:
    model = build(name, device, dtype, targets)
    rows = make_rows(name)
    settings = GradientSettings()
    warm = rows[:2]
    plain_step_seconds(model, warm, settings, device), extraction_seconds(model, warm, settings, device)
    tokens = sum(len(r.input_ids) for r in rows)
    times: dict[str, list[float]] = {"plain": [], "extract": [], "naive": []}
    for _ in range(repeats):  # interleaved, best of `repeats`: a shared machine's noise hits all three alike
        times["plain"].append(plain_step_seconds(model, rows, settings, device))
        times["extract"].append(extraction_seconds(model, rows, settings, device))
        times["naive"].append(naive_loop_seconds(model, rows, device))
    plain, extract, naive = (min(times[key]) for key in ("plain", "extract", "naive"))
    result = {
        "model": name,
        "device": device,
        "dtype": str(dtype).removeprefix("torch."),
        "targets": targets,
        "rows": len(rows),
        "tokens": tokens,
        "extract_tok_s": tokens / extract,
        "plain_tok_s": tokens / plain,
        "naive_tok_s": tokens / naive,
        "vs_plain": plain / extract,
        "vs_naive": naive / extract,
    }
    if rss_rows:
        result["rss_n"], result["rss_10n"] = rss_rows, 10 * rss_rows
        result["rss_mb_n"] = peak_rss_mb(name, rss_rows, targets)
        result["rss_mb_10n"] = peak_rss_mb(name, 10 * rss_rows, targets)
    return result


def table(results: list[dict]) -> str:
    lines = [
        "| model | device / dtype | LoRA targets | rows | tokens | extraction tok/s | ÷ plain fwd+bwd | "
        "÷ naive batch-1 | peak RSS N → 10·N |",
        "|" + "---|" * 9,
    ]
    for r in results:
        rss = (
            f"{r['rss_mb_n']:.0f} MB ({r['rss_n']}) → {r['rss_mb_10n']:.0f} MB ({r['rss_10n']})"
            if "rss_n" in r
            else "–"
        )
        lines.append(
            f"| {r['model']} | {r['device']} / {r['dtype']} | {r['targets']} | {r['rows']} | {r['tokens']} "
            f"| {r['extract_tok_s']:.0f} | {r['vs_plain']:.2f} | {r['vs_naive']:.1f} | {rss} |"
        )
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--rss-child":
        rss_child(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2-135m"], choices=list(SHAPES))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--targets", default="all-linear", help="all-linear or a comma list, e.g. q_proj,v_proj")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rss-rows", type=int, default=200,
                        help="N for the peak-RSS check on the tiny model (the SmolLM2 shape uses its 12 rows)")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many interleaved timings")
    parser.add_argument("--json", help="also write the results as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    rss_rows = {"tiny": args.rss_rows, "smollm2-135m": ROWS["smollm2-135m"][0]}  # peak RSS is a CPU measure
    results = [
        measure(name, args.device, dtype, args.targets, rss_rows.get(name) if args.device == "cpu" else None,
                args.repeats)
        for name in args.models
    ]
    print(table(results))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
