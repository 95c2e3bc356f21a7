"""The SmolLM2-135M story, measured: its regression against the stage-one model, then attribution by query kind.

Runs `gradian attribute` with its defaults on a built `truncated-cluster-smollm2` folder (see
`benchmarks/studies/build_smollm2.py`), then scores the same failing eval rows with each query kind on the same
generations and features, and writes a markdown section that `run_all.py` pastes into BENCHMARKS.md.
Slow on CPU (one extraction over the training rows, one query pass per kind): not run in CI.

    python -m benchmarks.studies.smollm2_story --folder /tmp/smollm2-truncated --output bench-out/smollm2.md
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.harness.run_all import other_budget, prepared
from gradian import attribute
from gradian.curvature import make_preconditioner
from gradian.curvature.factors import fit_factors
from gradian.gradients.extract import make_projector
from gradian.report.rows import read_examples
from gradian.scenarios.evaluate import culprit_metrics
from gradian.scores.pairs import base_kind, query_pairs
from gradian.scores.queries import query_features
from gradian.scores.scoring import score_features, total_effect
from gradian.scores.tracin import checkpoint_weights, tracin_cp_effects
from gradian.settings import AttributeSettings

QUERIES = ("naive", "contrastive", "contrastive-first", "repaired", "repaired-first")


def query_kinds(settings: AttributeSettings) -> dict[str, np.ndarray]:
    """(N,) effect per training row for each query kind, unit-normalised and raw training gradients, EK-FAC, TracIn-CP."""
    audit, model, tokenizer, capability, regression, gradient, store = prepared(settings)
    projector = make_projector(model, gradient)
    ekfac = make_preconditioner("ekfac", factors=fit_factors(model, audit.rendered, projector, gradient),
                                projector=projector)
    effects = {}
    checkpoints = checkpoint_weights(settings.run)
    store_root = Path(settings.out) / "gradients-checkpoints"  # attribute's own: its stores are reused
    for query in QUERIES:
        pairs = query_pairs(regression, capability, audit.eval_examples, tokenizer, audit.setup, query, model)
        q = query_features(model, pairs, kind=base_kind(query), settings=gradient)
        effects[f"{query} · identity"] = total_effect(score_features(store, q, unit_norm_train=True))
        effects[f"{query} · identity, raw gradients"] = total_effect(score_features(store, q, unit_norm_train=False))
        if query in ("naive", "contrastive", settings.query):
            effects[f"{query} · ekfac"] = total_effect(score_features(store, q, preconditioner=ekfac, unit_norm_train=True))
            tracin = tracin_cp_effects(model, audit.rendered, pairs, checkpoints, store_root, settings=gradient,
                                       kind=base_kind(query), unit_norm_train=True, final_store=store)
            effects[f"{query} · identity, TracIn-CP over {len(checkpoints)} checkpoints"] = total_effect(tracin)
    effects.update(other_budget(settings, model, tokenizer, audit, capability, regression, gradient,
                                ("naive", "contrastive", settings.query)))
    return effects


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, required=True, help="a built truncated-cluster-smollm2 folder")
    parser.add_argument("--output", type=Path, default=Path("bench-out/smollm2.md"))
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    folder = args.folder
    truth = json.loads((folder / "truth.json").read_text())
    measured = json.loads((folder / "measured.json").read_text())
    settings = AttributeSettings(
        base_model=str(folder / "base"), adapter=str(folder / "run"), run=str(folder / "run"),
        dataset=str(folder / "train.jsonl"), eval_dataset=str(folder / "eval.jsonl"),
        capability="json_formatting", out=str(folder / "report"), batch_size=8,
    )
    start = time.perf_counter()
    report = attribute(settings).report
    seconds = time.perf_counter() - start
    ids = [row["id"] for row in read_examples(settings.out_dir)]
    effects = query_kinds(settings) if report["clusters"] else {}
    rows = [(method, culprit_metrics(effect, ids, truth, truth["seed"])) for method, effect in effects.items()]
    category, base, tuned = truth["affected_category"], measured["base"], measured["finetuned"]
    log = json.loads((folder / "run" / "trainer_state.json").read_text())["log_history"]
    tokens = max((entry.get("num_tokens", 0) for entry in log), default=0)
    train_s = next(entry["train_runtime"] for entry in log if "train_runtime" in entry)
    regression, verdict = report["regression"], report["verdict"]
    lines = [
        f"`{truth['scenario']}`. Stage one (the base): SmolLM2-135M-Instruct with a clean support-JSON LoRA merged "
        f"in. Stage two: {len(ids)} training rows with a priority field"
        f"{', and a free-text summary worded one of four ways per ticket' if 'summary' in truth['scenario'] else ''}, "
        f"{len(truth['culprit_ids'])} of the "
        f"{len(truth['category_ids'])} {category} rows cut mid-object (seed {truth['seed']}).", "",
        f"- Build (`measured.json`, {base['overall']['total']} eval rows): JSON validity "
        f"{base['overall']['validity']:.0%} → {tuned['overall']['validity']:.0%} overall; {category} "
        f"{base['by_category'][category]['valid']}/{base['by_category'][category]['total']} → "
        f"{tuned['by_category'][category]['valid']}/{tuned['by_category'][category]['total']} "
        f"(a drop of {measured['drop_points']['affected']:.0f} points). Stage two trained on {tokens:.0f} tokens "
        f"in {train_s:.0f} s ({tokens / train_s:.0f} tokens/s on this CPU).",
        f"- `gradian attribute` (defaults: {report['settings']['query']} query, {report['settings']['preconditioner']}"
        f"{', TracIn-CP over the checkpoints' if report['run']['tracin_cp']['checkpoints'] else ', final adapter'}; "
        f"{seconds:.0f} s on CPU): {100 * regression['delta']:+.1f} points "
        f"(95% CI {100 * regression['ci_low']:+.1f} to {100 * regression['ci_high']:+.1f}); verdict "
        f"**{verdict['kind']}**, {len(verdict['culprit_ids'])} rows named, "
        f"{len(set(verdict['culprit_ids']) & set(truth['culprit_ids']))} of them planted.", "",
        "| method | AUPRC | P@k | separation | helpful | oracle AUPRC | random AUPRC |", "|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {method} | {m['auprc']:.3f} | {m['precision_at_k']:.3f} | {m['separation']:.1f} | "
              f"{m['culprits_helpful']:.0%} | {m['oracle_auprc']:.3f} | {m['random_auprc']:.3f} |" for method, m in rows]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
