"""TracIn-CP with the projection shared by each checkpoint's own gradient energy, against the final adapter's shares.

`gradian attribute` measures the energy shares once, on the final adapter, and projects every checkpoint's
gradients with them. This measures what calibrating them per checkpoint would change, on a built SmolLM2
story folder whose default `attribute` run already sits in `--out` (its generations and stores are reused).

    python -m benchmarks.studies.checkpoint_shares --folder /tmp/smollm2-summary --out /tmp/smollm2-summary/report \
        --output bench-out/checkpoint-shares.md
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from benchmarks.harness.run_all import prepared
from gradian.gradients.energy import share_budget
from gradian.gradients.point import restored_weights
from gradian.scenarios.evaluate import culprit_metrics
from gradian.scores.pairs import base_kind, query_pairs
from gradian.scores.scoring import total_effect
from gradian.scores.tracin import checkpoint_weights, load_checkpoint, tracin_cp_effects
from gradian.settings import AttributeSettings


def own_shares_effects(model, rendered, pairs, checkpoints, gradient, kind: str, root: Path) -> np.ndarray:
    """(Q, N) TracIn-CP effects, each checkpoint's term from `tracin_cp_effects` under shares from its own energy."""
    total = 0.0
    for checkpoint in checkpoints:
        with restored_weights(model):
            load_checkpoint(model, checkpoint)  # θ ← θ_c, only to measure its energy
            own, _ = share_budget(model, rendered, gradient, "energy",
                                  cache=root / f"shares-{checkpoint.step}.json")  # once for every query
        effects = tracin_cp_effects(model, rendered, pairs, [checkpoint], root, settings=own, kind=kind)  # (Q, N)
        total = total + checkpoint.weight * effects
    return total / sum(checkpoint.weight for checkpoint in checkpoints)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True, help="the folder of a default `attribute` run on it")
    parser.add_argument("--output", type=Path, default=Path("bench-out/checkpoint-shares.md"))
    args = parser.parse_args()
    torch.set_num_threads(2)
    folder = args.folder
    truth = json.loads((folder / "truth.json").read_text())
    settings = AttributeSettings(
        base_model=str(folder / "base"), adapter=str(folder / "run"), run=str(folder / "run"),
        dataset=str(folder / "train.jsonl"), eval_dataset=str(folder / "eval.jsonl"),
        capability="json_formatting", out=str(args.out), batch_size=8,
    )
    audit, model, tokenizer, capability, regression, gradient, store = prepared(settings)
    checkpoints = checkpoint_weights(settings.run)
    ids = [row.example_id for row in audit.rendered]
    lines = [f"`{truth['scenario']}` (seed {truth['seed']}), TracIn-CP over {len(checkpoints)} checkpoints, "
             f"{len(truth['culprit_ids'])} of {len(ids)} rows planted; one run.", "",
             "| query | shares from | AUPRC | P@k | separation |", "|---|---|---|---|---|"]
    root = Path(tempfile.mkdtemp(prefix="checkpoint-shares-"))
    for query in ("naive", "contrastive", settings.query):
        pairs = query_pairs(regression, capability, audit.eval_examples, tokenizer, audit.setup, query, model)
        final = tracin_cp_effects(model, audit.rendered, pairs, checkpoints, args.out / "gradients-checkpoints",
                                  settings=gradient, kind=base_kind(query), final_store=store)
        own = own_shares_effects(model, audit.rendered, pairs, checkpoints, gradient, base_kind(query), root)
        for name, effects in (("the final adapter (default)", final), ("each checkpoint", own)):
            m = culprit_metrics(total_effect(effects), ids, truth, truth["seed"])
            lines.append(f"| {query} | {name} | {m['auprc']:.3f} | {m['precision_at_k']:.3f} | {m['separation']:.1f} |")
            print(lines[-1], flush=True)
    shutil.rmtree(root)
    args.output.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
