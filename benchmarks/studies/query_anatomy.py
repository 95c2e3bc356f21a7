"""Where the naive query's gradient comes from, on the failing eval rows of built scenarios.

The naive query ∇log p(y⁺|x) sums one gradient per reference token. Split at the first token j where the
reference y⁺ and the fine-tuned model's output y⁻ part ways, it is the sum of three parts:

    prefix  tokens < j   shared by y⁺ and y⁻: the contrastive query cancels them exactly
    split   token j      the decision that failed
    tail    tokens > j   the rest of the reference

For each part this prints its norm over the whole naive query's (projected like the training features) and
the cosine between the naive and the contrastive query. When the fine-tuned model predicts the shared prefix
almost surely, its tokens add almost nothing and the two queries coincide; where the prefix is text the model
cannot predict (free wording), it weighs in the naive query and the contrast removes it.

    python -m benchmarks.studies.query_anatomy --runs bench-out/truncated-cluster-seed0:bench-out/reports/truncated-cluster-seed0
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from gradian.audit import diagnose
from gradian.capabilities import get_capability
from gradian.data.render import IGNORE
from gradian.gradients.batches import collate
from gradian.gradients.extract import GradientSettings, example_gradients, make_projector
from gradian.regression.loading import load_models
from gradian.regression.measure import measure_regression
from gradian.scores.pairs import query_pairs
from gradian.scores.queries import first_divergence, query_features

PARTS = ("prefix", "split", "tail")


def part_rows(prompt: list[int], positive: list[int], split: int) -> list[tuple[list[int], list[int]]]:
    """(input_ids, labels) of y⁺ with loss on: all its tokens, the prefix, the split token, the tail."""
    def only(keep) -> tuple[list[int], list[int]]:
        return prompt + positive, [IGNORE] * len(prompt) + [t if keep(j) else IGNORE for j, t in enumerate(positive)]

    return [only(lambda j: True), only(lambda j: j < split), only(lambda j: j == split), only(lambda j: j > split)]


def anatomy(folder: Path, out: Path) -> dict:
    """Mean over failing rows: each part's norm ÷ the naive query's norm, and cos(naive, contrastive)."""
    audit = diagnose(folder / "train.jsonl", base_model=str(folder / "base"), eval_dataset=folder / "eval.jsonl",
                     run=folder / "run")
    model, tokenizer = load_models(audit.base_ref, str(folder / "run"), device="cpu")
    capability = get_capability("json_formatting")
    regression = measure_regression(model, tokenizer, audit.eval_examples, capability, audit.setup, out, batch_size=8)
    pairs = [p for p in query_pairs(regression, capability, audit.eval_examples, tokenizer, audit.setup,
                                    "contrastive") if p.negative_ids is not None]
    settings = GradientSettings()
    projector = make_projector(model, settings)
    pad_id = getattr(model.config, "pad_token_id", None) or 0
    shares = {part: [] for part in PARTS}
    prefix_tokens = []
    with example_gradients(model, projector) as compute:
        for pair in pairs:
            split = first_divergence(pair.positive_ids, pair.negative_ids)
            if split is None or split >= len(pair.positive_ids):
                continue  # y⁺ is a prefix of y⁻: no split token in the reference
            rows = part_rows(pair.prompt_ids, pair.positive_ids, split)
            grads = compute(collate(rows, pad_id)).double().numpy()  # (4, k)
            whole = np.linalg.norm(grads[0])
            for part, grad in zip(PARTS, grads[1:], strict=True):
                shares[part].append(np.linalg.norm(grad) / whole)
            prefix_tokens.append(split)
    naive = query_features(model, pairs, kind="naive", settings=settings)  # (Q, k) unit rows
    contrastive = query_features(model, pairs, kind="contrastive", settings=settings)
    truth = json.loads((folder / "truth.json").read_text())
    return {"run": f"{truth['scenario']}, seed {truth['seed']}", "rows": len(prefix_tokens),
            "prefix_tokens": float(np.mean(prefix_tokens)), **{part: float(np.mean(values)) for part, values in shares.items()},
            "cosine": float(np.mean(np.sum(naive * contrastive, axis=1)))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", required=True,
                        help="FOLDER:OUT pairs: a built scenario and the attribute --out that cached its generations")
    parser.add_argument("--output", type=Path, help="also write the markdown table here")
    args = parser.parse_args()
    torch.set_num_threads(2)
    lines = ["| run | failing rows | shared prefix (tokens) | ‖prefix‖ | ‖split‖ | ‖tail‖ | cos(naive, contrastive) |",
             "|---|---|---|---|---|---|---|"]
    for spec in args.runs:
        folder, out = (Path(part) for part in spec.split(":"))
        r = anatomy(folder, out)
        lines.append(f"| {r['run']} | {r['rows']} | {r['prefix_tokens']:.1f} | {r['prefix']:.2f} | {r['split']:.2f} "
                     f"| {r['tail']:.2f} | {r['cosine']:.2f} |")
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.output:
        args.output.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
