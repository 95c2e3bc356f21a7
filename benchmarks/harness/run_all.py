"""BENCHMARKS.md's catalog part: culprit recovery, verdicts and refusals on the scenario world, then speed ratios.

For every scenario × seed: build it (cached under --root), run `gradian attribute` with its defaults (the
verdict, the report), then score the same failing eval rows with every method variant on the same
generations and features:

- query kinds: naive, contrastive (full sequence), contrastive-first (first divergent token), repaired
  (minimal-edit y⁺, full), repaired-first, departure, departure-first; each with the identity preconditioner
  on unit-normalised training gradients; naive, contrastive and the default query also with adam, with raw
  (un-normalised) gradients and with TracIn-CP over the run's checkpoints; the default query also with
  gauss-newton, kfac and ekfac at three dampings; naive, contrastive and the default query with 32 and 128
  floats per row;
- baselines: TF-IDF text similarity to the failing eval rows, random order, and the category oracle.

Then the speed benchmarks (each a script of its own) run as subprocesses and their tables are pasted in.
Every figure comes from this run; nothing is typed in.

    python -m benchmarks.harness.run_all [--seeds 0 1 2] [--scenarios ...] [--skip-speed]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import re
import subprocess
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.feature_extraction.text import TfidfVectorizer

from benchmarks import module_child
from benchmarks.harness import page
from gradian import __version__, attribute
from gradian.audit import diagnose
from gradian.capabilities import get_capability
from gradian.curvature import adam, make_preconditioner
from gradian.curvature.factors import fit_factors
from gradian.gradients.energy import share_budget
from gradian.gradients.extract import GradientSettings, extract_train_features, make_projector
from gradian.regression.loading import load_models
from gradian.regression.measure import measure_regression
from gradian.report.rows import read_examples
from gradian.scenarios import SCENARIOS, build
from gradian.scenarios.evaluate import culprit_metrics
from gradian.scores.pairs import base_kind, query_pairs
from gradian.scores.queries import query_features
from gradian.scores.scoring import score_features, total_effect
from gradian.scores.tracin import checkpoint_weights, tracin_cp_effects
from gradian.settings import PROJ_BUDGETS, AttributeSettings

BENCHMARKS = Path(__file__).resolve().parents[1]

CAUSE_CHECKS = {"pad-eos": "pad_eos_masking", "no-eos": "missing_eos", "prompt-loss": "prompt_loss",
                "eval-overlap": "train_eval_overlap"}
DAMPINGS = (0.1, 1.0, 10.0)
SMALL_PROJ_DIMS = (32, 128)  # feature budgets far below the default 8192
QUERIES = ("naive", "contrastive", "contrastive-first", "repaired", "repaired-first", "departure", "departure-first")


def built(root: Path, name: str, seed: int) -> tuple[Path, float | None]:
    """The scenario folder and the seconds its build took (kept beside it, so a cached build still reports it)."""
    folder = root / f"{name}-seed{seed}"
    timing = root / f"{name}-seed{seed}.build-seconds"
    if (folder / "truth.json").exists() and (folder / "measured.json").exists():
        return folder, float(timing.read_text()) if timing.exists() else None
    start = time.perf_counter()
    build(name, folder, seed, cache_dir=root / "cache")
    seconds = time.perf_counter() - start
    timing.write_text(f"{seconds:.1f}\n")
    return folder, seconds


def settings_for(folder: Path, out: Path, **options) -> AttributeSettings:
    return AttributeSettings(
        base_model=str(folder / "base"), adapter=str(folder / "run"), run=str(folder / "run"),
        dataset=str(folder / "train.jsonl"), eval_dataset=str(folder / "eval.jsonl"),
        capability="json_formatting", out=str(out), **options,
    )


def prepared(settings: AttributeSettings):
    """The default run's audit, model, generations and training features, reused from its `out` folder."""
    audit = diagnose(settings.dataset, base_model=settings.base_model, eval_dataset=settings.eval_dataset,
                     run=settings.run)
    model, tokenizer = load_models(audit.base_ref, settings.adapter, device="cpu")
    capability = get_capability(settings.capability)
    regression = measure_regression(model, tokenizer, audit.eval_examples, capability, audit.setup, settings.out,
                                    batch_size=settings.batch_size)
    gradient = GradientSettings(proj_dim=settings.proj_dim or GradientSettings().proj_dim, seed=settings.seed,
                                batch_size=settings.batch_size)
    gradient, sampled = share_budget(model, audit.rendered, gradient, settings.proj_budget,  # as `attribute` shares
                                     cache=Path(settings.out) / "projection-shares.json")  # it: its store is reused
    store = extract_train_features(model, audit.rendered, Path(settings.out) / "gradients", settings=gradient,
                                   sampled=sampled)
    return audit, model, tokenizer, capability, regression, gradient, store


def variants(settings: AttributeSettings) -> dict[str, np.ndarray]:
    """(N,) effect per training row for every method variant, on the default run's generations and features."""
    audit, model, tokenizer, capability, regression, gradient, store = prepared(settings)
    adam_store = None
    if audit.run is not None and audit.run.optimizer_path is not None:
        adam_store = extract_train_features(model, audit.rendered, Path(settings.out) / "gradients-adam",
                                            settings=gradient, scale=adam(audit.run.optimizer_path, model))
    effects: dict[str, np.ndarray] = {}
    checkpoints = checkpoint_weights(settings.run)
    store_root = Path(settings.out) / "gradients-checkpoints"  # attribute's own: its stores are reused
    for query in QUERIES:
        pairs = query_pairs(regression, capability, audit.eval_examples, tokenizer, audit.setup, query, model)
        q = query_features(model, pairs, kind=base_kind(query), settings=gradient)
        effects[f"{query} · identity"] = total_effect(score_features(store, q, unit_norm_train=True))
        if query in (settings.query, "naive", "contrastive"):  # the contrast against the naive query, every way
            effects[f"{query} · identity, raw gradients"] = total_effect(score_features(store, q, unit_norm_train=False))
            if adam_store is not None:
                effects[f"{query} · adam"] = total_effect(score_features(adam_store, q, unit_norm_train=True))
                effects[f"{query} · adam, raw gradients"] = total_effect(score_features(adam_store, q, unit_norm_train=False))
            tracin = tracin_cp_effects(model, audit.rendered, pairs, checkpoints, store_root, settings=gradient,
                                       kind=base_kind(query), unit_norm_train=True, final_store=store)
            effects[f"{query} · identity, TracIn-CP over {len(checkpoints)} checkpoints"] = total_effect(tracin)
        if query == settings.query:
            effects.update(curvature_variants(model, audit.rendered, gradient, store, q, query))
    for dim in SMALL_PROJ_DIMS:  # noisier features: does any query kind hold up better than naive?
        small = dataclasses.replace(gradient, proj_dim=dim)  # shared as the default shares its budget
        small_store = extract_train_features(model, audit.rendered, Path(settings.out) / f"gradients-{dim}",
                                             settings=small)
        for query in ("naive", "contrastive", settings.query):
            pairs = query_pairs(regression, capability, audit.eval_examples, tokenizer, audit.setup, query, model)
            q = query_features(model, pairs, kind=base_kind(query), settings=small)
            effects[f"{query} · identity, {dim} floats"] = total_effect(score_features(small_store, q, unit_norm_train=True))
    effects.update(other_budget(settings, model, tokenizer, audit, capability, regression, gradient,
                                ("naive", "contrastive", settings.query)))
    effects["text similarity (TF-IDF)"] = -text_similarity(audit.examples, regression)
    return effects


def other_budget(settings, model, tokenizer, audit, capability, regression, gradient, queries) -> dict[str, np.ndarray]:
    """The same queries with the projection budget shared the other way than the default's (`--proj-budget`)."""
    other = next(budget for budget in PROJ_BUDGETS if budget != settings.proj_budget)
    shared, sampled = share_budget(model, audit.rendered, gradient, other)
    store = extract_train_features(model, audit.rendered, Path(settings.out) / f"gradients-{other}", settings=shared,
                                   sampled=sampled)
    checkpoints = checkpoint_weights(settings.run)
    effects = {}
    for query in queries:
        pairs = query_pairs(regression, capability, audit.eval_examples, tokenizer, audit.setup, query, model)
        q = query_features(model, pairs, kind=base_kind(query), settings=shared)
        effects[f"{query} · identity, shares by {other}"] = total_effect(score_features(store, q, unit_norm_train=True))
        if checkpoints:
            tracin = tracin_cp_effects(model, audit.rendered, pairs, checkpoints,
                                       Path(settings.out) / f"gradients-checkpoints-{other}", settings=shared,
                                       kind=base_kind(query), unit_norm_train=True, final_store=store)
            effects[f"{query} · identity, TracIn-CP over {len(checkpoints)} checkpoints, shares by {other}"] = (
                total_effect(tracin))
    return effects


def curvature_variants(model, rendered, gradient, store, q, query) -> dict[str, np.ndarray]:
    """Gauss-Newton, K-FAC and EK-FAC at each damping of DAMPINGS (relative to the mean eigenvalue)."""
    projector = make_projector(model, gradient)
    factors = fit_factors(model, rendered, projector, gradient)
    effects = {}
    for name in ("gauss-newton", "kfac", "ekfac"):
        for damping in DAMPINGS:
            pre = make_preconditioner(name, factors=factors, projector=projector, damping=damping)
            effects[f"{query} · {name}, damping {damping:g}"] = total_effect(
                score_features(store, q, preconditioner=pre, unit_norm_train=True))
    return effects


def text_similarity(examples, regression) -> np.ndarray:
    """Max TF-IDF cosine of each training row to the failing eval rows (prompt + failing output)."""
    failing = [row.prompt + " " + row.finetuned.text for row in regression.failures()]
    vectorizer = TfidfVectorizer(token_pattern=r"[A-Za-z]+").fit([e.text for e in examples] + failing)
    train, queries = vectorizer.transform([e.text for e in examples]), vectorizer.transform(failing)
    return (train @ queries.T).max(axis=1).toarray().ravel()


def expected_verdict(folder: Path, truth: dict) -> str:
    """The truth's kind; a fault that measured no regression must be refused (the audit still finds setup faults)."""
    drops = json.loads((folder / "measured.json").read_text())["drop_points"]
    if truth["kind"] in ("setup", "diffuse") and drops["overall"] < 5:
        return "no-regression"
    return truth["kind"]


def cause_found(report: dict, truth: dict) -> bool | None:
    """For setup scenarios: the audit reports the planted fault (warning or critical)."""
    check = CAUSE_CHECKS.get(truth.get("structural_cause") or "")
    if check is None:
        return None
    return any(f["check"] == check and f["severity"] != "info" for f in report["findings"])


def planted_cluster_first(report: dict, truth: dict) -> bool:
    """The most harmful cluster is the one holding most of the planted culprits."""
    if not report["clusters"]:
        return False
    culprits = set(truth["culprit_ids"])
    members: dict[int, set[str]] = {}
    for row in report["examples"]:
        members.setdefault(row["cluster"], set()).add(row["id"])
    holder = max(report["clusters"], key=lambda c: len(culprits & members.get(c["id"], set())))
    return holder["id"] == report["clusters"][0]["id"]


def run_scenarios(args) -> tuple[list[dict], list[dict]]:
    verdict_rows, method_rows = [], []
    for name in args.scenarios:
        for seed in args.seeds:
            folder, build_seconds = built(args.root, name, seed)
            truth = json.loads((folder / "truth.json").read_text())
            out = args.root / "reports" / f"{name}-seed{seed}"
            start = time.perf_counter()
            report = {**attribute(settings_for(folder, out)).report, "examples": read_examples(out)}
            row = {"scenario": name, "seed": seed, "expected": expected_verdict(folder, truth),
                   "verdict": report["verdict"]["kind"], "cause_found": cause_found(report, truth),
                   "build_s": build_seconds, "attribute_s": time.perf_counter() - start,
                   "delta": report["regression"].get("delta"), "significant": report["regression"]["significant"]}
            print(json.dumps(row), flush=True)
            verdict_rows.append(row)
            if not truth["culprit_ids"] or not report["clusters"]:
                continue  # nothing was attributed (no culprits planted, or no regression to explain)
            ids = [r["id"] for r in report["examples"]]
            effects = variants(settings_for(folder, out)) if report["examples"] and report["clusters"] else {}
            default_effect = np.array([r["effect"] if r["effect"] is not None else 0.0 for r in report["examples"]])
            rng = np.random.default_rng(seed)
            tracin = " · TracIn-CP" if (report["run"].get("tracin_cp") or {}).get("checkpoints") else ""
            effects = {f"default ({report['settings']['query']} · {report['settings']['preconditioner']}{tracin})":
                       default_effect, **effects, "random": rng.standard_normal(len(ids))}
            for method, effect in effects.items():
                metrics = culprit_metrics(effect, ids, truth, seed)
                method_rows.append({"scenario": name, "seed": seed, "method": method, **metrics,
                                    "cluster_first": planted_cluster_first(report, truth)
                                    if method.startswith("default") else None})
            print(json.dumps(method_rows[-len(effects)]), flush=True)  # the default's metrics
    return verdict_rows, method_rows


def speed_tables(skip: bool) -> list[str]:
    if skip:
        return ["(speed benchmarks skipped in this run: `--skip-speed`)"]
    commands = [
        ("Per-example gradients", ["gradient_speed", "--models", "tiny", "smollm2-135m"]),
        ("Generation: batched vs batch-1", ["generation_speed", "--models", "tiny", "smollm2-135m"]),
        ("diagnose at 100k rows", ["diagnose_speed", "--rows", "100000"]),
        ("Beside the peer libraries", ["peer_speed", "--model", "tiny", "--repeats", "2"]),
        ("Beside the peer libraries, SmolLM2 shape",
         ["peer_speed", "--model", "smollm2-135m", "--train", "32", "--queries", "4", "--timeout", "600"]),
        ("Beside the fastest peer, SmolLM2 shape, 128 rows (past the 64 rows the energy pass samples)",
         ["peer_speed", "--model", "smollm2-135m", "--train", "128", "--queries", "4", "--tools", "gradian",
          "gradian-size", "dattri-logra"]),
    ]
    parts = []
    for title, command in commands:
        argv, env = module_child(f"benchmarks.speed.{command[0]}", *command[1:])
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=3600)
        table = done.stdout.strip() if done.returncode == 0 else f"(failed: {done.stderr.strip()[-400:]})"
        parts += [f"### {title}", "", f"`python -m benchmarks.speed.{' '.join(command)}`", "", table, ""]
        parts += [GRADIENT_SPEED_WHY, ""] if command[0] == "gradient_speed" else []
    return parts


GRADIENT_SPEED_WHY = """\
The plain step is the floor: one forward and backward that sums each LoRA weight's gradient over the batch, its
gradients dropped by parameter as an optimizer drops them. Extraction does the same forward and backward and
adds, per LoRA matrix and batch, a forward hook, a hook on the output's gradient and one batched product
(B, out, T)·(B, T, in) in place of the summed one, then the projection and the store's write. On the tiny model
(28 matrices of 8×32, 512 rows in 32 batches) those calls cost about as much as their arithmetic, so the ratio
measures per-call overhead; on the SmolLM2 shape (420 matrices, 576 to 1536 wide) they are small beside it.
The tiny model's ratio is also the noisiest: four runs one after another on this shared 2-core machine (best
of 9 interleaved timings each) gave 0.81 and 0.88 with the code before the faster rows hash, 0.90 and 0.81 after."""


def provenance(args) -> str:
    """Which run each part of the page comes from."""
    scenarios = "the last full run's (`results.json`, read back)" if args.from_results else "this run's"
    speed = "the last speed run's (`speed.md`)" if args.skip_speed else "this run's"
    if scenarios == speed:
        return "Every figure comes from that run."
    return f"Scenario and recovery tables: {scenarios}; speed tables: {speed}."


def markdown(verdicts: list[dict], methods: list[dict], speed: list[str], args) -> str:
    lines = [f"Regenerated by `python -m benchmarks.harness.run_all` (gradian {__version__}) on "
             f"{platform.platform()}, {platform.processor() or platform.machine()}, {torch.get_num_threads()} "
             f"torch threads, torch {torch.__version__}; seeds {args.seeds}. {provenance(args)}", ""]
    lines += ["## Verdicts", "", "Expected verdict: the scenario's kind; a fault that measured no regression at build "
              "time (prompt-loss, overlap) must be refused by `attribute`, and a setup fault must "
              "still be found by the audit.", "",
              "| scenario | seed | expected | verdict | correct | audit finds the setup fault | Δ capability | build s (base cached; timed when the folder was built) | "
              "attribute s (cached stages reused) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in verdicts:
        build_s = f"{r['build_s']:.0f}" if r["build_s"] is not None else "cached"
        lines.append(f"| {r['scenario']} | {r['seed']} | {r['expected']} | {r['verdict']} | "
                     f"{'yes' if r['verdict'] == r['expected'] else '**no**'} | "
                     f"{'—' if r['cause_found'] is None else ('yes' if r['cause_found'] else '**no**')} | "
                     f"{100 * (r['delta'] or 0):+.1f} pts | "
                     f"{build_s} | {r['attribute_s']:.0f} |")
    correct = sum(r["verdict"] == r["expected"] for r in verdicts)
    nulls = [r for r in verdicts if r["scenario"] == "null"]
    quiet = [r for r in verdicts if r["expected"] == "no-regression"]
    lines += ["", f"Verdict accuracy: {correct}/{len(verdicts)}. Refusal rate on null runs: "
              f"{sum(r['verdict'] == 'no-regression' for r in nulls)}/{len(nulls)}; on every run that measured no "
              f"regression: {sum(r['verdict'] == 'no-regression' for r in quiet)}/{len(quiet)}.", ""]
    lines += ["## Culprit recovery", "", "Mean over seeds; AUPRC with the planted culprits as positives, ranking by "
              "effect (most harmful first); P@k at k = number of culprits; separation = how far the culprits' median "
              "effect sits below the clean rows', in robust standard deviations of the clean rows (it still tells "
              "methods apart at AUPRC 1.0); helpful = share of culprits given a positive effect (ranked as helping); "
              "oracle = the affected category first, in random order.", "",
              "| scenario | method | AUPRC | P@k | separation | helpful | oracle AUPRC | random AUPRC |",
              "|---|---|---|---|---|---|---|---|"]
    attributed = {(r["scenario"], r["seed"]) for r in verdicts if r["expected"] == "data-cluster"}
    methods = [m for m in methods if (m["scenario"], m["seed"]) in attributed]
    for scenario in dict.fromkeys(m["scenario"] for m in methods):
        rows = [m for m in methods if m["scenario"] == scenario]
        for method in dict.fromkeys(m["method"] for m in rows):
            picked = [m for m in rows if m["method"] == method]
            mean = {k: np.mean([m.get(k, np.nan) for m in picked]) for k in (
                "auprc", "precision_at_k", "separation", "culprits_helpful", "oracle_auprc", "random_auprc")}
            lines.append(f"| {scenario} | {method} | {mean['auprc']:.3f} | {mean['precision_at_k']:.3f} | "
                         f"{mean['separation']:.1f} | {mean['culprits_helpful']:.0%} | "
                         f"{mean['oracle_auprc']:.3f} | {mean['random_auprc']:.3f} |")
    firsts = [m["cluster_first"] for m in methods if m["cluster_first"] is not None]
    lines += ["", f"Planted cluster ranked first by `gradian attribute`: {sum(firsts)}/{len(firsts)} runs.", ""]
    lines += ["### Choosing the default", "", DEFAULT_WHY, ""]
    lines += ["### Contrastive against naive, run by run", "", CONTRAST_WHY, "", *contrast_table(methods), ""]
    anatomy = args.root / "query-anatomy.md"
    if anatomy.exists():  # written by benchmarks/studies/query_anatomy.py (needs the SmolLM2 folders: run on its own)
        lines += ["### Where the naive query's gradient comes from", "", ANATOMY_WHY, "", anatomy.read_text().strip(), ""]
    if not any(m["method"].startswith("default") and "TracIn-CP" in m["method"] for m in methods):
        lines += ["These tables come from a run made before the default moved to TracIn-CP: their `default` rows "
                  "are the final adapter alone (`--checkpoints off` now), and the verdicts above were decided on those "
                  "effects; the `TracIn-CP` rows are what `gradian attribute` does now.", ""]
    stories = [path for path in (args.root / "smollm2.md", args.root / "smollm2-summary.md") if path.exists()]
    if stories:  # written by benchmarks/studies/smollm2_story.py (slow on CPU: run on its own)
        lines += ["## The realistic model: SmolLM2-135M-Instruct", "",
                  "`python -m benchmarks.studies.build_smollm2 --out DIR [--summary]` then `python -m benchmarks.studies.smollm2_story "
                  "--folder DIR`: the truncated-cluster story on a real Llama with a BPE tokenizer and its own chat "
                  "template, attributed with the same defaults.", ""]
        for story in stories:
            text = story.read_text().strip()
            lines += [text, ""]
            if "TracIn-CP" not in text:
                lines += ["(Attributed before the default moved to TracIn-CP: the final adapter alone.)", ""]
    lines += ["## Speed", "", "Ratios measured in one run on this machine (shared and noisy: read the ratios, "
              "not the absolute rates).", "", *speed, *gpu_section()]
    lines += ["## Projection: shares by gradient energy or equal shares", "", FIDELITY_WHY, ""]
    per_checkpoint = args.root / "checkpoint-shares.md"
    if per_checkpoint.exists():  # written by benchmarks/studies/checkpoint_shares.py (needs a SmolLM2 folder: run on its own)
        lines += ["### TracIn-CP: the final adapter's shares or each checkpoint's own", "", CHECKPOINT_SHARES_WHY, "",
                  per_checkpoint.read_text().strip(), ""]
    return "\n".join(lines) + "\n"


CONTRAST_KINDS = ("naive", "contrastive", "repaired-first")


def contrast_table(methods: list[dict]) -> list[str]:
    """Per scenario and seed: each query kind's AUPRC (4 decimals) and separation, final adapter and TracIn-CP."""
    def pick(rows: list[dict], kind: str, tracin: bool) -> dict | None:
        name = re.compile(rf"{re.escape(kind)} · identity" + (r", TracIn-CP over \d+ checkpoints$" if tracin else "$"))
        return next((m for m in rows if name.match(m["method"])), None)

    lines = ["| scenario | seed | gradients of | " + " | ".join(f"{k} AUPRC" for k in CONTRAST_KINDS) + " | "
             + " | ".join(f"{k} separation" for k in CONTRAST_KINDS) + " |", "|" + "---|" * (3 + 2 * len(CONTRAST_KINDS))]
    tally = {tracin: {"better": 0, "tie": 0, "worse": 0, "separated": 0, "runs": 0} for tracin in (False, True)}
    for scenario, seed in dict.fromkeys((m["scenario"], m["seed"]) for m in methods):
        rows = [m for m in methods if (m["scenario"], m["seed"]) == (scenario, seed)]
        for tracin in (False, True):
            picked = [pick(rows, kind, tracin) for kind in CONTRAST_KINDS]
            if any(m is None for m in picked):
                continue
            lines.append(f"| {scenario} | {seed} | {'the checkpoints (TracIn-CP)' if tracin else 'the final adapter'} | "
                         + " | ".join(f"{m['auprc']:.4f}" for m in picked) + " | "
                         + " | ".join(f"{m['separation']:.1f}" for m in picked) + " |")
            naive, contrastive = picked[0], picked[1]
            count = tally[tracin]
            count["runs"] += 1
            count["separated"] += contrastive["separation"] > naive["separation"]
            count["better" if contrastive["auprc"] > naive["auprc"] else
                  "tie" if contrastive["auprc"] == naive["auprc"] else "worse"] += 1
    for tracin, count in tally.items():
        if count["runs"]:
            lines += ["", f"{'TracIn-CP' if tracin else 'Final adapter alone'}: the contrastive query's AUPRC is higher "
                      f"than the naive one's in {count['better']} of {count['runs']} runs, equal in {count['tie']}, "
                      f"lower in {count['worse']}; its separation is larger in {count['separated']} of {count['runs']}."]
    return lines


CONTRAST_WHY = """\
The culprit-recovery table averages over seeds and rounds to three decimals. Here each run on its own, for the
naive query, the full contrastive one and the default (repaired-first), all with the identity preconditioner on
unit-normalised training gradients: AUPRC to four decimals (1.0000 is every culprit above every clean row) and
the separation, which still orders methods that all reach AUPRC 1."""


DEFAULT_WHY = """\
`gradian attribute` uses what ranks the planted culprits best across the scenarios, the SmolLM2 stories below
included: the **repaired-first** query (the failing answer kept up to where it breaks, continued correctly;
the contrast taken at that one token), the identity preconditioner on unit-normalised training gradients, and
**TracIn-CP** over the run's checkpoints when it has them (`--checkpoints auto`; the final adapter alone
otherwise, or with `--checkpoints off`).

- **Why TracIn-CP: free text.** In the SmolLM2 summary variant (below) every answer carries a summary worded
  one of four ways per ticket. The training rows' gradients are then dominated by wording the model cannot
  predict, and the final model has already learned the culprits' early stop, so their gradient at that decision
  is small. Scored on the final adapter alone, every query kind falls below the category oracle and the verdict
  names the wrong rows. Summed over the checkpoints, the early ones (before the stop was learned) still carry the
  culprits' gradient, and the repaired-first query finds them. On the tiny world the final adapter alone is
  already at the ceiling and TracIn-CP stays there or within a few rows of it.
- **The contrast earns its place on free text, not on the tiny world.** On the summary variant the naive query
  ranks about half the culprits as helpful, with or without checkpoints, the failure the contrast exists for.
  On the tiny world every full-sequence query (naive, contrastive, repaired), with identity or Adam,
  unit-normalised or raw, ties at AUPRC 1.0, a ceiling: the planted rows are the only ones that teach the failing
  decision, and both queries point at it. Summed over the checkpoints, as the default does, the contrastive query
  ranks the culprits at least as well as the naive one in every run, better where the naive query lets clean
  rows into the top k, and sets them further apart from the clean rows (the run-by-run table below counts both).
  The anatomy table measures why the naive query does not go wrong on the final adapter: the model predicts the
  shared prefix almost surely, so those tokens add little to its gradient. With far fewer floats per row (the 32
  and 128 rows) all kinds degrade together.
- The reference-based first-token contrast (`contrastive-first`) and the base-model departure (`departure-first`)
  fall on seeds where the tiny model writes another order number than the reference before it breaks the
  format: their first divergent token is then a content token. The repair keeps the model's own content, so its
  first divergence is the format decision.
- **Why the projection is shared by gradient energy.** Most of a LoRA gradient's energy sits in a few matrices;
  equal shares spend most floats on the rest. On the SmolLM2 summary story the default's rows against their
  `shares by size` twins show what that costs when the culprits' signal is weak; on the tiny world and the plain
  SmolLM2 story both splits sit at or near the ceiling (the section at the end of this page).
- Curvature estimated from the training rows themselves counts the planted cluster's shared direction as
  curvature, and inverting it discounts exactly the direction the culprits push: Gauss-Newton (one dense
  inverse over all 8,192 floats) falls to or below random at low damping and recovers only partly at 10 × the
  mean eigenvalue. K-FAC and EK-FAC, factored per LoRA matrix, lose little on the tiny world (1.0 from a damping
  of 1) and help on the summary variant, but less than TracIn-CP; Gradian's dampings follow this sweep
  (Gauss-Newton 10, K-FAC and EK-FAC 1). Adam's 1/√v̂ neither helps nor hurts.
- TF-IDF text similarity is a strong baseline where culprits share words with the failing prompts, and weak
  where they do not.
"""

ANATOMY_WHY = """\
`python -m benchmarks.studies.query_anatomy --runs FOLDER:OUT ...`: the naive query ∇log p(y⁺|x) split at the first token
where the reference and the fine-tuned model's output part ways, into the shared prefix (which the contrast
cancels), that split token, and the reference's tail; each part's norm over the whole naive query's, mean over
the failing eval rows, and the cosine between the naive and the contrastive query. The larger the prefix part,
the more of the naive query asks about text the contrast removes: text the model cannot predict, like a summary
worded several ways. Where the culprits' own signal is weak, as in the summary variant, even a small turn of the
query moves the ranking (compare the naive and contrastive rows of that story)."""


FIDELITY_WHY = """\
The projected budget (8,192 floats by default) is shared over the LoRA matrices by each matrix's mean squared
gradient norm on 64 sampled training rows (`--proj-budget energy`, the default), the split that minimises the
variance of projected inner products; `--proj-budget size` shares it equally. On the SmolLM2 shape equal shares
give about 19 floats to each of 420 matrices, while the 10 largest hold 59% of the gradient energy. The peer
table on that shape (Speed, above) has both: `Gradian (identity)` shares by energy, `budget shared equally` does
not; its last column is how well each keeps the exact scores' ranking. Shares by energy take the exact gradients
of 64 sampled rows and extraction projects those instead of computing them again, so on both SmolLM2-shape jobs
the two splits take the same time. The sampled gradients are held until extraction has projected them: up to
1 GiB, 625 MB for 64 rows of the SmolLM2 shape; the tables' peak RSS columns show what that costs in the end.

Which split finds the culprits: the recovery tables have `shares by size` rows beside the default's, the same
queries on equal shares. On the tiny world (19,456 LoRA weights) the two are about even. The SmolLM2 summary
story decided the default: free text, culprits' signal weak, every projected float counts."""


CHECKPOINT_SHARES_WHY = """\
`gradian attribute` measures the energy shares once, on the final adapter, and projects every TracIn-CP
checkpoint's gradients and queries with them. `python -m benchmarks.studies.checkpoint_shares --folder DIR --out REPORT`
measures the alternative on the SmolLM2 summary story: each checkpoint projected with shares from its own
gradient energy (64 sampled rows per checkpoint), everything else as the default run. For the default query the
two are about even (AUPRC and separation move in opposite directions, by little), so `attribute` keeps measuring
the shares once, on the final adapter: one energy pass instead of one per checkpoint."""


def gpu_section() -> list[str]:
    """The GPU runs of the gradient benchmark and of the device checks, kept as they came back (not rerun here)."""
    results = BENCHMARKS / "results"
    table, machine, agreement = (results / name for name in ("gradient_speed_gpu.md", "gpu.txt", "gpu_agreement.txt"))
    if not table.exists():
        return []
    gpu, versions = (machine.read_text().splitlines() + ["", ""])[:2]
    checks = ["`python -m benchmarks.studies.device_agreement --device cuda`, on the same kind of machine:", "",
              agreement.read_text().strip(), ""] if agreement.exists() else []
    return ["### Per-example gradients on a GPU", "",
            f"`python -m benchmarks.speed.gradient_speed --models llama-1b smollm2-135m --device cuda --dtype bfloat16` on "
            f"{gpu} (torch, transformers, peft: {versions}); random weights from the configs, LoRA r=8 all-linear.",
            "", table.read_text().strip(), "", GPU_WHY, "", *checks]


GPU_WHY = """On the Llama-3.2-1B shape the GPU runs the same kernels for both up to a few percent (a profile: 1.34 s of
kernels in extraction, 1.31 s in the plain step); the rest is time the GPU waits on the host. The projection's
random factors are drawn on the CPU, so that every device projects alike, and move to the device in one copy
(one copy per LoRA matrix, 224 of them, had cost 0.91 against 0.93 in the same run). The SmolLM2 shape's 12
short rows keep the GPU idle most of the time either way (39 ms of kernels in a 0.4 s extraction): there the
ratio counts the per-matrix hook calls on the host, not arithmetic."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=SCENARIOS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--root", type=Path, default=Path("bench-out"))
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--output", type=Path, default=BENCHMARKS.parent / "BENCHMARKS.md")
    parser.add_argument("--extra", type=Path, nargs="*", default=[], help="markdown files appended (e.g. GPU runs)")
    parser.add_argument("--from-results", action="store_true", help="rewrite the page from --root/results.json")
    args = parser.parse_args()
    torch.set_num_threads(2)
    page.region(args.output, "run_all.py")  # before hours of work, not after
    if args.from_results:
        saved = json.loads((args.root / "results.json").read_text())
        verdicts, methods = saved["verdicts"], saved["methods"]
    else:
        verdicts, methods = run_scenarios(args)
        (args.root / "results.json").write_text(json.dumps({"verdicts": verdicts, "methods": methods}, indent=2))
    saved_speed = args.root / "speed.md"
    if args.skip_speed and saved_speed.exists():  # the tables of the last speed run, not rerun
        speed = ["(These tables come from the last run that measured speed, not necessarily the one above.)", "",
                 *saved_speed.read_text().splitlines()]
    else:
        speed = speed_tables(args.skip_speed)
        saved_speed.write_text("\n".join(speed))
    text = markdown(verdicts, methods, speed, args)
    for extra in args.extra:
        text += "\n" + extra.read_text()
    page.replace_region(args.output, "run_all.py", text)  # the suite's, verify's and scale's regions stay
    print(f"wrote the catalog's and speed's tables into {args.output}")


if __name__ == "__main__":
    main()
