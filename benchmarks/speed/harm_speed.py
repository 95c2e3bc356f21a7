"""What the default ranking's passes over the training rows cost beside a training step, as ratios in one run.

On random-weight Llamas from a config (`gradient_speed.SHAPES`: `tiny`, `smollm2-135m`), the same rows and batches:

- a training step over the rows (forward, backward, AdamW step on the LoRA weights): the epoch every ratio is of;
- the per-example gradient extraction (`gradients.extract`), which every gradient ranking pays;
- the same extraction given the failing queries' hidden states, whose forward also gives each row's RepSim
  (`gradients.sides`: what `--rank combined` runs), and given the queries' direction too, whose backward also gives
  each row's harmful positions (what `gradian attribute` runs by default), and the positions' pass on its own
  (`token_harm.position_harms`);
- the harmful tokens (`token_harm.row_harms`, one forward-mode pass: `--row-harm tokens`);
- RepSim's forward pass on its own (`relevance.mean_hidden_states`).

Best of `--repeats` interleaved timings each (a shared machine's noise hits all alike). Prints a markdown table.

    python -m benchmarks.speed.harm_speed --models tiny smollm2-135m
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch

from benchmarks.speed import gradient_speed as speed
from gradian.gradients.batches import collate, plan_batches
from gradian.gradients.extract import GradientSettings, extract_train_features, summed_nll
from gradian.gradients.hooks import lora_matrices
from gradian.scores.relevance import mean_hidden_states
from gradian.scores.token_harm import position_harms, row_harms


def training_step_seconds(model, rows, settings, device) -> float:
    """One pass of AdamW steps over the rows in extraction's batches, the LoRA weights trained (then put back)."""
    params = [p for p in model.parameters() if p.requires_grad]
    saved = [p.detach().clone() for p in params]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    batches = plan_batches({i: len(r.input_ids) for i, r in enumerate(rows)}, settings)
    speed.sync(device)
    start = time.perf_counter()
    for batch_rows in batches:
        batch = {k: v.to(device) for k, v in collate([(rows[i].input_ids, rows[i].labels) for i in batch_rows],
                                                      0).items()}
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits
        summed_nll(logits, batch["labels"]).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    speed.sync(device)
    seconds = time.perf_counter() - start
    with torch.no_grad():
        for param, value in zip(params, saved, strict=True):
            param.copy_(value)
    return seconds


def fused_seconds(model, rows, settings, direction, states) -> float:
    with tempfile.TemporaryDirectory() as store:
        return timed(extract_train_features, model, rows, store, settings=settings, direction=direction,
                     representations=states)


def timed(function, *args, **kwargs) -> float:
    start = time.perf_counter()
    function(*args, **kwargs)
    return time.perf_counter() - start


def measure(name: str, device: str, repeats: int) -> dict:
    model = speed.build(name, device, torch.float32, "all-linear")
    rows = speed.make_rows(name)
    settings = GradientSettings()
    generator = torch.Generator().manual_seed(1)
    direction = [torch.randn(m.shape, generator=generator).to(device) for m in lora_matrices(model)]
    states = torch.randn((8, model.config.hidden_size), generator=generator).double().numpy()  # (Q, d)
    passes = {
        "train": lambda r: training_step_seconds(model, r, settings, device),
        "extract": lambda r: speed.extraction_seconds(model, r, settings, device),
        "repsim_fused": lambda r: fused_seconds(model, r, settings, None, states),
        "fused": lambda r: fused_seconds(model, r, settings, direction, states),
        "positions": lambda r: timed(position_harms, model, r, direction, batch_size=settings.batch_size),
        "tokens": lambda r: timed(row_harms, model, r, direction, batch_size=settings.batch_size),
        "repsim": lambda r: timed(mean_hidden_states, model, [row.input_ids for row in r],
                                  batch_size=settings.batch_size),
    }
    for run in passes.values():  # warm every path once
        run(rows[:2])
    times: dict[str, list[float]] = {key: [] for key in passes}
    for _ in range(repeats):
        for key, run in passes.items():
            times[key].append(run(rows))
    best = {key: min(values) for key, values in times.items()}
    epoch = best["train"]
    return {"model": name, "device": device, "rows": len(rows), "tokens": sum(len(r.input_ids) for r in rows),
            "seconds": best, **{f"{key}_per_epoch": value / epoch for key, value in best.items()},
            "default_per_epoch": best["fused"] / epoch,
            "tokens_default_per_epoch": (best["repsim_fused"] + best["tokens"]) / epoch,
            "sum_per_epoch": best["repsim_fused"] / epoch}


def table(results: list[dict]) -> str:
    lines = ["| model | rows | tokens | training pass (s) | extraction | with RepSim | with RepSim and positions "
             "(the default) | positions alone | RepSim alone | harmful tokens | `--row-harm tokens` | "
             "`--row-harm sum` |", "|" + "---|" * 12]
    for r in results:
        lines.append(f"| {r['model']} | {r['rows']} | {r['tokens']} | {r['seconds']['train']:.2f} | "
                     f"{r['extract_per_epoch']:.2f} | {r['repsim_fused_per_epoch']:.2f} | "
                     f"**{r['default_per_epoch']:.2f}** | {r['positions_per_epoch']:.2f} | "
                     f"{r['repsim_per_epoch']:.2f} | {r['tokens_per_epoch']:.2f} | "
                     f"{r['tokens_default_per_epoch']:.2f} | {r['sum_per_epoch']:.2f} |")
    return "\n".join(lines) + "\n\nEach pass ÷ the training pass over the same rows (one epoch), best of the repeats."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2-135m"], choices=["tiny", "smollm2-135m"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the results as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = [measure(name, args.device, args.repeats) for name in args.models]
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)
    print(table(results))


if __name__ == "__main__":
    main()
