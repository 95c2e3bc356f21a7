"""Counterfactual scores of every ranking method: recovery@k and the LDS, from zero-weight retrains.

    python -m benchmarks.harness.counterfactual FOLDER [FOLDER ...] --work DIR [--subsets 100] [--fraction 0.5]
        [--seeds 0 1] [--lds FAMILY ...] [--methods NAME ...] [--max-steps N] [--jobs N] [--results R.json]
        [--markdown R.md]

Each FOLDER is a built scenario (`benchmarks/harness/suite_build.py`: `base/`, `run/`, `train.jsonl`, `eval.jsonl`,
`truth.json`). Per folder, in `DIR/<folder name>/`:

1. `gradian attribute --rank combined` (the suite's settings), and where a method needs its own run, `attribute`
   with `--preconditioner ekfac` (EK-FAC) and with `--checkpoints on` (TracIn-CP, when the run kept checkpoints);
2. each method's score per training row (higher = more suspect): the default (`--rank gradient`: the report's
   `row_harm`), the combined rank (`rank_score`), EK-FAC and TracIn-CP (−effect), TF-IDF, BM25 and RepSim (mean over
   the failing prompts), the category oracle (every row of the planted rows' category first), random, and the
   planted rows (the scenario's claim, a ceiling on planted-row metrics);
3. recovery@k: the top k rows of each method (k = the number of planted rows) at zero weight under the run's seed
   (no recorded order is replayed: the data order is the one that seed draws, the same in every retrain;
   `gradian.verify.retrain`), measured on the report's eval prompts as `gradian verify` measures
   (`gradian.verify.measure`): recovery with its paired bootstrap CI; and the default's full curve (k = 1, 2, 5,
   10, 20% of the rows);
4. LDS, on the folders named by `--lds` (or all): M random subsets, each leaving out `--fraction` of the rows at zero
   weight, retrained under each `--seeds` retrain seed (the measured change is averaged over the seeds, as bergson
   averages its ground truth); per failing query, its loss = the summed NLL of the reference answer after the
   prompt; measured change = loss without S − loss of the same-seed retrain with every row; predicted change of a
   method = −Σ_{i∈S} score_i (removing suspect rows lowers the failing queries' loss); `lds.lds` averages the
   per-query Spearman ρ and bootstraps the subsets.

Resumable: every retrain is cached in `DIR/<folder>/retrains/<name>/` (marker, adapter, scores.json, losses.json);
a rerun measures nothing twice. `--max-steps` caps every retrain (a smoke run only: the numbers are then not
counterfactuals of the run).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import jobs
from benchmarks.harness import lds as lds_module
from gradian.data.examples import Example, read_dataset
from gradian.files import atomic_write

METHODS = ("default", "combined", "EK-FAC", "TracIn-CP", "TF-IDF", "BM25", "RepSim", "category oracle", "random",
           "planted rows")
LOSSES = "losses.json"


@dataclass
class BuiltFolder:
    """What each step reads of one folder, read once: its truth.json, the attribute report and the training rows."""

    truth: dict[str, Any]
    report_dir: Path  # WORK/attribute
    report: dict[str, Any]  # its report.json
    train: list[Example]  # train.jsonl


def attribute_run(folder: Path, out: Path, **overrides: Any) -> Path:
    """`gradian attribute` on the scenario into `out` (cached by attribute's own stages); returns `out`."""
    from gradian.pipeline import attribute
    from gradian.scenarios import attribute_settings

    if not (out / "report.json").is_file():
        attribute(attribute_settings(folder, out, **{"rank": "combined", **overrides}))
    return out


def method_scores(folder: Path, work: Path, wanted: Sequence[str], built: BuiltFolder) -> dict[str, np.ndarray]:
    """name -> (N,) score, higher = more suspect, in dataset order; cached in WORK/scores.npz."""
    cache = work / "scores.npz"
    if cache.is_file():
        cached = dict(np.load(cache))
        if all(m in cached for m in wanted if m not in ("TracIn-CP",)):
            return cached
    from benchmarks.harness.baselines import bm25_scores
    from gradian.report.rows import read_examples
    from gradian.scenarios.evaluate import category_oracle, random_scores
    from gradian.scores import relevance as rel

    truth, report = built.truth, built.report_dir
    rows = read_examples(report)
    column = {name: np.array([row.get(name) if row.get(name) is not None else np.nan for row in rows], dtype=float)
              for name in ("rank_score", "row_harm", "gradient_effect", "relevance_tfidf", "relevance_repsim")}
    out: dict[str, np.ndarray] = {"combined": column["rank_score"], "random": random_scores(len(rows), truth["seed"])}
    harm = column["row_harm"]  # the default's score: --rank gradient ranks by it
    out["default"] = harm if np.isfinite(harm).all() else -column["gradient_effect"]
    categories = [e.raw.get("category") if isinstance(e.raw, dict) else None for e in built.train]
    out["category oracle"] = category_oracle([e.id for e in built.train], truth, truth["seed"], categories)
    out["TF-IDF"], out["RepSim"] = column["relevance_tfidf"], column["relevance_repsim"]
    planted = set(truth["culprit_ids"])
    out["planted rows"] = np.array([1.0 if row["id"] in planted else 0.0 for row in rows])
    if "BM25" in wanted:
        texts = [e.text for e in built.train]
        generations = [json.loads(line) for line in (report / "generations.jsonl").read_text().splitlines()]
        failing = set(built.report["run"]["queries"])
        out["BM25"] = rel.aggregate(bm25_scores(texts, [g["prompt"] for g in generations if g["id"] in failing]),
                                    "mean")
    if "EK-FAC" in wanted:
        out["EK-FAC"] = -effects(attribute_run(folder, work / "ekfac", preconditioner="ekfac", rank="gradient"))
    if "TracIn-CP" in wanted and list((folder / "run").glob("checkpoint-*")):
        out["TracIn-CP"] = -effects(attribute_run(folder, work / "tracin", checkpoints="on", rank="gradient"))
    np.savez(cache, **out)
    return out


def effects(report_dir: Path) -> np.ndarray:
    from gradian.report.rows import read_examples

    return np.array([row["effect"] if row.get("effect") is not None else 0.0 for row in read_examples(report_dir)])


class Retrainer:
    """Zero-weight retrains of one run, cached in WORK/retrains/, measured as `gradian verify` measures."""

    def __init__(self, folder: Path, work: Path, max_steps: int | None, built: BuiltFolder) -> None:
        from gradian.capabilities import get_capability
        from gradian.data.base_model import resolve_base_model
        from gradian.data.run_folder import read_run
        from gradian.regression.loading import read_adapter_config
        from gradian.verify.measure import read_original
        from gradian.verify.recipe import read_recipe

        self.capability = get_capability(built.truth.get("capability", "json_formatting"))
        self.original = read_original(built.report_dir, self.capability)
        self.recipe = read_recipe(read_run(folder / "run"), read_adapter_config(folder / "run"))
        self.rows = built.train
        self.base = resolve_base_model(str(folder / "base"))
        self.root, self.max_steps = work / "retrains", max_steps
        failing = set(built.report["run"]["queries"])
        self.failing = [i for i, qid in enumerate(self.original.ids) if qid in failing]

    def adapter(self, name: str, removed: Sequence[str], seed: int | None = None) -> Path:
        from gradian.verify.retrain import Retrain, retrain

        job = Retrain(name, self.rows, self.recipe.seed if seed is None else seed, zero_ids=frozenset(removed))
        folder, _ = retrain(job, self.recipe, self.base, self.root, device="cpu", max_steps=self.max_steps)
        return folder

    def scores(self, name: str, removed: Sequence[str]) -> np.ndarray:
        from gradian.verify.measure import measure_adapter

        return measure_adapter(self.adapter(name, removed), self.base, self.original, self.capability, device="cpu")

    def losses(self, name: str, removed: Sequence[str], seed: int) -> np.ndarray:
        """(Q,) summed NLL of each failing query's reference answer after its prompt; cached beside the adapter."""
        folder = self.adapter(name, removed, seed)
        cache = folder / LOSSES
        if cache.is_file():
            return np.array(json.loads(cache.read_text()))
        import torch

        from gradian.regression.loading import load_models

        model, tokenizer = load_models(self.base, folder, device="cpu")
        out = []
        with torch.no_grad():
            for i in self.failing:
                prompt = self.original.prompt_ids[i]
                answer = tokenizer(self.original.references[i] or "", add_special_tokens=False)["input_ids"]
                ids = torch.tensor([prompt + answer + [tokenizer.eos_token_id]])  # (1, T)
                logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].double()  # (A + 1, V)
                out.append(float(torch.nn.functional.cross_entropy(logits, ids[0, len(prompt):], reduction="sum")))
        atomic_write(cache, json.dumps(out) + "\n")
        return np.array(out)


def recovery_at_k(retrainer: Retrainer, scores: dict[str, np.ndarray], k: int) -> dict[str, Any]:
    from gradian.verify.measure import recovery
    from gradian.verify.sets import top_k

    ids = [e.id for e in retrainer.rows]
    out = {}
    for name, score in scores.items():
        removed = top_k(score, ids, k)
        result = recovery(retrainer.scores(f"{slug(name)}-top{k}", removed), retrainer.original)
        out[name] = {"k": k, "recovery": result.value, "ci": list(result.ci) if result.ci else None}
    return out


def curve(retrainer: Retrainer, score: np.ndarray) -> list[dict[str, Any]]:
    from gradian.verify.measure import recovery
    from gradian.verify.sets import curve_sizes, top_k

    ids = [e.id for e in retrainer.rows]
    points = []
    for share, k in curve_sizes(len(ids)):
        result = recovery(retrainer.scores(f"default-top{k}", top_k(score, ids, k)), retrainer.original)
        points.append({"share": share, "k": k, "recovery": result.value, "ci": list(result.ci) if result.ci else None})
    return points


def lds_scores(retrainer: Retrainer, scores: dict[str, np.ndarray], subsets: int, fraction: float,
               seeds: Sequence[int]) -> dict[str, Any]:
    """Each method's LDS over `subsets` zero-weight leave-out retrains, the measured change averaged over seeds."""
    ids = [e.id for e in retrainer.rows]
    size = max(1, round(fraction * len(ids)))
    drawn = [np.random.default_rng([7, m]).choice(len(ids), size=size, replace=False) for m in range(subsets)]
    measured = np.zeros((subsets, len(retrainer.failing)))  # (M, Q)
    for seed in seeds:
        full = retrainer.losses(f"full-seed{seed}", [], seed)
        for m, rows in enumerate(drawn):
            measured[m] += (retrainer.losses(f"subset{m}-seed{seed}", [ids[i] for i in rows], seed) - full) / len(seeds)
    out = {name: lds_module.lds(np.array([-score[rows].sum() for rows in drawn]), measured)
           for name, score in scores.items() if np.isfinite(score).all()}
    return {"fraction": fraction, "size": size, "subsets": subsets, "seeds": list(seeds), "methods": out}


def slug(name: str) -> str:
    """A method's name as a retrain folder's: "gradient + activation" -> "gradient-plus-activation"."""
    return name.lower().replace("+", "plus").replace("(", "").replace(")", "").replace(" ", "-")


def run_folder(folder: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    truth = json.loads((folder / "truth.json").read_text())
    report_dir = attribute_run(folder, work / "attribute")
    built = BuiltFolder(truth, report_dir, json.loads((report_dir / "report.json").read_text()),
                        read_dataset(folder / "train.jsonl"))
    scores = method_scores(folder, work, args.methods, built)
    scores = {name: scores[name] for name in args.methods if name in scores}
    retrainer = Retrainer(folder, work, args.max_steps, built)
    k = len(truth["culprit_ids"])
    record: dict[str, Any] = {"folder": folder.name, "family": truth.get("family", truth["scenario"]),
                              "split": truth.get("split"), "kind": truth["kind"], "seed": truth["seed"], "k": k,
                              "n_rows": len(retrainer.rows), "capped": args.max_steps,
                              "methods_missing": [m for m in args.methods if m not in scores]}
    record["recovery_at_k"] = recovery_at_k(retrainer, scores, k) if k else {}
    record["curve"] = curve(retrainer, scores["default"]) if "default" in scores else []
    record["curve_of"] = "default"
    if args.lds is None or record["family"] in args.lds or folder.name in args.lds:
        record["lds"] = lds_scores(retrainer, scores, args.subsets, args.fraction, args.seeds)
    atomic_write(work / "counterfactual.json", json.dumps(record, indent=2) + "\n")
    return record


def markdown(records: list[dict[str, Any]]) -> str:
    def cell(value: float | None, ci: Sequence[float] | None = None) -> str:
        if value is None or not np.isfinite(value):
            return "n/a"
        return f"{value:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")

    lines = ["| run | k | " + " | ".join(METHODS) + " |", "|---|---|" + "---|" * len(METHODS)]
    for r in records:
        at = r["recovery_at_k"]
        lines.append(f"| {r['folder']} | {r['k']} | " + " | ".join(
            cell(at[m]["recovery"], at[m]["ci"]) if m in at else "n/a" for m in METHODS) + " |")
    lines += ["", "LDS (mean per-query Spearman, 95% bootstrap CI over subsets):", "",
              "| run | subsets × fraction | " + " | ".join(METHODS) + " |", "|---|---|" + "---|" * len(METHODS)]
    for r in records:
        if "lds" in r:
            methods = r["lds"]["methods"]
            lines.append(f"| {r['folder']} | {r['lds']['subsets']} × {r['lds']['fraction']} | " + " | ".join(
                cell(methods[m]["lds"], methods[m]["ci"]) if m in methods else "n/a" for m in METHODS) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--subsets", type=int, default=100)
    parser.add_argument("--fraction", type=float, default=0.5, help="share of the rows each LDS subset leaves out")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="retrain seeds the LDS averages over")
    parser.add_argument("--lds", nargs="*", default=None, help="families or folders to measure the LDS on (all)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--max-steps", type=int, default=None, help="cap retrains (a smoke run only)")
    parser.add_argument("--results", type=Path, default=None)
    parser.add_argument("--markdown", type=Path, default=None)
    parser.add_argument("--jobs", type=int, default=1, help="folders at once, one thread each")
    args = parser.parse_args(argv)
    records = jobs.run_jobs(run_folder, [(folder, args.work / folder.name, args) for folder in args.folders],
                            args.jobs)
    if args.results:
        records = jobs.merge_records(args.results, records, "folder")
    text = markdown(records)
    if args.markdown:
        atomic_write(args.markdown, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
