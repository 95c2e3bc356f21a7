"""Culprit recovery on the scenario world: AUPRC of query kinds × preconditioners × train normalisation.

For each scenario: generate with the fine-tuned model on the eval prompts, keep the rows that fail the
capability, build query pairs (y⁺ = reference, or its minimal-edit repair of the failing output; y⁻ = the
failing output), extract training features (plain and Adam-scaled), score, and rank training rows by
−effect (most harmful first). AUPRC uses the planted culprits as positives (sklearn average precision).
Baselines: random (= culprit share) and, where the truth names the affected category, its oracle.

    python benchmarks/attribution_quality.py --scenarios truncated-cluster format-cluster --seeds 0
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import average_precision_score

from gradian.data.base_model import resolve_base_model
from gradian.data.examples import read_dataset
from gradian.data.render import render_dataset, render_prompt
from gradian.data.run_folder import read_run
from gradian.gradients.extract import GradientSettings, extract_train_features
from gradian.regression.capabilities import get_capability
from gradian.regression.generation import generate
from gradian.regression.loading import load_models
from gradian.scores.preconditioners import GaussNewton, Identity, adam
from gradian.scores.queries import QueryPair, query_features
from gradian.scores.scoring import score, total_effect

KINDS = ("naive", "contrastive", "contrastive-first")


def answer_ids(tokenizer, prompt_ids: list[int], prompt_text: str, answer: str) -> list[int]:
    """Tokens of `answer` (EOS appended) as they follow the prompt."""
    full = tokenizer(prompt_text + answer + tokenizer.eos_token)["input_ids"]
    return (
        full[len(prompt_ids) :]
        if full[: len(prompt_ids)] == prompt_ids
        else tokenizer(answer + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
    )


def query_pairs(model, tokenizer, setup, evals, capability) -> dict[str, list[QueryPair]]:
    """Pairs for the failing eval rows: y⁺ = reference ('ref') and y⁺ = repaired failing output ('repaired')."""
    prompts = [render_prompt(example, tokenizer, setup) for example in evals]
    references = [example.completion_text for example in evals]
    longest = max(len(tokenizer(r)["input_ids"]) for r in references)
    outputs = generate(model, tokenizer, prompts, max_new_tokens=longest + 16)
    pairs: dict[str, list[QueryPair]] = {"ref": [], "repaired": []}
    for example, prompt, ref, out in zip(evals, prompts, references, outputs, strict=True):
        if capability.passes(out.text, ref):
            continue
        positive = answer_ids(tokenizer, prompt, example.prompt_text, ref)
        pairs["ref"].append(QueryPair(example.id, prompt, positive, out.ids))
        repaired = capability.repair(out.text, ref)
        fixed = answer_ids(tokenizer, prompt, example.prompt_text, repaired) if repaired else positive
        pairs["repaired"].append(QueryPair(example.id, prompt, fixed, out.ids))
    return pairs


def scenario_dir(name: str, seed: int, root: Path) -> Path:
    from gradian.scenarios import build  # engineer B's scenario world

    out = root / f"{name}-{seed}"
    if not (out / "truth.json").exists():
        build(name, out, seed)
    return out


def run_scenario(folder: Path, settings: GradientSettings, capability_spec: str) -> list[dict]:
    truth = json.loads((folder / "truth.json").read_text())
    run = read_run(folder / "run")
    model, tokenizer = load_models(
        resolve_base_model(folder / "base"), run.adapter_dir or folder / "run", device="cpu"
    )
    train = read_dataset(folder / "train.jsonl")
    evals = read_dataset(folder / "eval.jsonl", eval_set=True)
    rendered = render_dataset(train, tokenizer, run.setup)
    culprits = set(map(str, truth["culprit_ids"]))
    labels = np.array([row.example_id in culprits for row in rendered])
    pairs = query_pairs(model, tokenizer, run.setup, evals, get_capability(capability_spec))
    results = [{"method": "random", "auprc": labels.mean(), "queries": len(pairs["ref"])}]
    if truth.get("category_ids"):
        category = set(map(str, truth["category_ids"]))
        oracle = np.array([row.example_id in category for row in rendered], float)
        oracle += np.random.default_rng(0).random(len(oracle)) * 1e-3  # random order inside the category
        results.append({"method": "category-oracle", "auprc": average_precision_score(labels, oracle)})
    if not pairs["ref"]:
        return results
    scales = {"identity": None}
    if run.optimizer_path:
        scales["adam"] = adam(run.optimizer_path, model)
    with tempfile.TemporaryDirectory() as tmp:
        for scale_name, scale in scales.items():
            start = time.perf_counter()
            store = extract_train_features(model, rendered, Path(tmp) / scale_name, settings=settings, scale=scale)
            seconds = time.perf_counter() - start
            for variant, variant_pairs in pairs.items():
                for kind in KINDS:
                    if variant == "repaired" and kind == "naive":
                        continue
                    queries = query_features(model, variant_pairs, kind=kind, settings=settings)
                    for precond in ("identity", "gauss-newton", "gauss-newton:1.0"):
                        for unit in (False, True):
                            ratio = float(precond.partition(":")[2] or 0.1)
                            pre = GaussNewton(ratio) if precond.startswith("gauss") else Identity()
                            effect = total_effect(score(store, queries, preconditioner=pre, unit_norm_train=unit))
                            name = f"{kind}{'+repaired' if variant == 'repaired' else ''}"
                            results.append(
                                {
                                    "method": name,
                                    "scale": scale_name,
                                    "preconditioner": precond,
                                    "unit_norm": unit,
                                    "auprc": average_precision_score(labels, -effect),
                                    "extract_s": round(seconds, 1),
                                }
                            )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", nargs="+", default=["truncated-cluster", "format-cluster"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "gradian-scenarios")
    parser.add_argument("--proj-dim", type=int, default=GradientSettings().proj_dim)
    parser.add_argument("--capability", default="json_formatting")
    parser.add_argument("--json", type=Path, help="also write every result here")
    args = parser.parse_args()
    torch.set_num_threads(2)
    settings = GradientSettings(proj_dim=args.proj_dim)
    everything = []
    for name in args.scenarios:
        for seed in args.seeds:
            for row in run_scenario(scenario_dir(name, seed, args.root), settings, args.capability):
                everything.append({"scenario": name, "seed": seed, **row})
    print("| scenario | seed | method | train scale | preconditioner | unit-norm train | AUPRC |")
    print("|---|---|---|---|---|---|---|")
    for r in everything:
        print(
            f"| {r['scenario']} | {r['seed']} | {r['method']} | {r.get('scale', '–')} | "
            f"{r.get('preconditioner', '–')} | {r.get('unit_norm', '–')} | {r['auprc']:.3f} |"
        )
    if args.json:
        args.json.write_text(json.dumps(everything, indent=2, default=float))


if __name__ == "__main__":
    main()
