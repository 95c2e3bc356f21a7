"""Gradian side by side with the peer attribution libraries: the same (Q, N) score job, same model, same rows.

Each tool runs in its own process on the same random-weight Llama + LoRA (all-linear, r=8, trained-like
lora_B) from `gradient_speed.py`, the same N training rows and Q query rows, and is timed END TO END from
a built model to a (Q, N) matrix of training rows against queries on the LoRA weights only:

- gradian         extract_train_features + query_features (naive: ∇log p(answer)) + score, identity; the budget
                  shared over the LoRA matrices by gradient energy on 64 sampled rows, as `attribute` shares it
- gradian-size    the same, the budget shared equally (--proj-budget size)
- kronfluence     EK-FAC: fit_all_factors (covariances, eigendecomposition, eigenvalue correction)
                  + compute_pairwise_scores, tracked modules = the LoRA A/B linears
- traker          TRAKer featurize + finalize_features + score + finalize_scores, output f = log p(answer)
- dattri-trak     TRAKAttributor cache + attribute
- dattri-tracin   TracInAttributor, final checkpoint only, projected like the others and exact
- dattri-logra    LoGraAttributor (hooks on the LoRA linears, Kronecker projection, eFIM Hessian)

Projection: Gradian's default budget (8192 floats), or no projection when the whole LoRA gradient is
smaller; peers get the same dimension where their API allows it (LoGra: a perfect square per linear).
Rows reach every peer sorted by length in batches of 16, as Gradian batches them. The sanity column is
the mean over queries of the Spearman correlation with Gradian's exact (unprojected) identity scores.

    python -m benchmarks.speed.peer_speed --model tiny
    python -m benchmarks.speed.peer_speed --model smollm2-135m --train 32 --queries 4
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import torch
from scipy.stats import spearmanr
from torch import nn
from torch.utils.data import DataLoader

from benchmarks import module_child
from benchmarks.speed.gradient_speed import SHAPES, build, make_rows
from gradian.data.render import Rendered
from gradian.gradients.batches import collate
from gradian.gradients.energy import share_budget
from gradian.gradients.extract import GradientSettings, extract_train_features, summed_nll
from gradian.gradients.hooks import lora_matrices
from gradian.scores.queries import QueryPair, query_features
from gradian.scores.scoring import score_features
from gradian.settings import AttributeSettings

BATCH = 16
DEFAULT_BUDGET = next(f.default for f in dataclasses.fields(AttributeSettings) if f.name == "proj_budget")
TOOLS = (
    "gradian",
    "gradian-size",
    "kronfluence",
    "traker",
    "dattri-trak",
    "dattri-tracin",
    "dattri-tracin-exact",
    "dattri-logra",
)
VMAP_TOOLS = ("traker", "dattri-trak", "dattri-tracin", "dattri-tracin-exact")
LABELS = {
    "gradian": "Gradian (identity)",
    "gradian-size": "Gradian (identity), budget shared equally",
    "kronfluence": "kronfluence EK-FAC",
    "traker": "traker TRAK",
    "dattri-trak": "dattri TRAK",
    "dattri-tracin": "dattri TracIn",
    "dattri-tracin-exact": "dattri TracIn, unprojected",
    "dattri-logra": "dattri LoGra (eFIM)",
}


class Job(SimpleNamespace):
    """model, train rows, query rows, projection dim (None = exact), LoRA parameter names, length order."""


def make_job(name: str, n_train: int, n_queries: int) -> Job:
    model = build(name, "cpu", torch.float32, "all-linear")
    train, queries = make_rows(name, n_train, seed=0), make_rows(name, n_queries, seed=1)
    lora_size = sum(m.size for m in lora_matrices(model))
    proj = GradientSettings().proj_dim
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    order = sorted(range(n_train), key=lambda i: (-len(train[i].input_ids), i))  # Gradian's batching order
    return Job(
        model=model,
        train=train,
        queries=queries,
        proj=None if lora_size <= proj else proj,
        names=names,
        order=order,
        lora_size=lora_size,
    )


# ---------------------------------------------------------------------------------------------- Gradian
def run_gradian(job: Job, proj: int | None, budget: str = DEFAULT_BUDGET) -> np.ndarray:
    settings, sampled = share_budget(job.model, job.train, GradientSettings(proj_dim=proj, batch_size=BATCH), budget)
    pairs = [
        QueryPair(r.example_id, r.input_ids[: r.prompt_length], r.input_ids[r.prompt_length :]) for r in job.queries
    ]
    with tempfile.TemporaryDirectory() as store_dir:
        store = extract_train_features(job.model, job.train, store_dir, settings=settings, sampled=sampled)
        q = query_features(job.model, pairs, kind="naive", settings=settings)  # (Q, k), ∇log p, unit norm
        return score_features(store, q)  # (Q, N) = −q̂ᵀg_i = ∇NLL_q·∇NLL_i/‖∇NLL_q‖: the sign of a loss-gradient dot


# ------------------------------------------------------------------------------------------- data feeds
def padded(rows: list[Rendered], mask: bool) -> dict[str, torch.Tensor]:
    """Right-padded batch; without attention mask (vmap peers) right padding is exact for a causal LM."""
    batch = collate([(r.input_ids, r.labels) for r in rows], 0)
    keys = ("input_ids", "attention_mask", "labels") if mask else ("input_ids", "labels")
    return {k: batch[k] for k in keys}


def loader(rows: list[Rendered], order: list[int], mask: bool, as_tuple: bool) -> DataLoader:
    """Rows in `order`, BATCH per batch, each batch padded to its longest row."""

    def collate_fn(items: list[Rendered]):
        batch = padded(items, mask)
        return (batch["input_ids"], batch["labels"]) if as_tuple else batch

    return DataLoader([rows[i] for i in order], batch_size=BATCH, shuffle=False, collate_fn=collate_fn)


def unsort(scores: np.ndarray, order: list[int]) -> np.ndarray:
    """(Q, N) scores whose columns follow `order` → columns in row order."""
    out = np.empty_like(scores)
    out[:, order] = scores
    return out


def example_nll(model: nn.Module, params: dict, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed NLL of one unbatched right-padded example (T,), functional in `params` (vmap-able)."""
    logits = torch.func.functional_call(model, params, (ids.unsqueeze(0),), {"use_cache": False}).logits
    return summed_nll(logits, labels.unsqueeze(0))


# ---------------------------------------------------------------------------------------------- kronfluence
def run_kronfluence(job: Job, out_dir: str) -> np.ndarray:
    from kronfluence.analyzer import Analyzer, prepare_model
    from kronfluence.arguments import FactorArguments, ScoreArguments
    from kronfluence.task import Task
    from kronfluence.utils.dataset import DataLoaderKwargs

    modules = [n for n, m in job.model.named_modules() if isinstance(m, nn.Linear) and ".lora_" in n]

    class LoraLM(Task):
        def compute_train_loss(self, batch, model, sample=False):  # kronfluence's wikitext example, summed NLL
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            if not sample:
                return summed_nll(logits, batch["labels"])
            flat = logits[:, :-1].reshape(-1, logits.shape[-1])
            with torch.no_grad():  # true Fisher: labels sampled from the model where the row has loss
                sampled = torch.multinomial(torch.softmax(flat, -1), 1).flatten()
                sampled[batch["labels"][:, 1:].reshape(-1) == -100] = -100
            return nn.functional.cross_entropy(flat, sampled, ignore_index=-100, reduction="sum")

        def compute_measurement(self, batch, model):
            return self.compute_train_loss(batch, model)

        def get_influence_tracked_modules(self):
            return modules

        def get_attention_mask(self, batch):
            return batch["attention_mask"]

    task = LoraLM()
    model = prepare_model(job.model, task)
    analyzer = Analyzer("peer", model, task, cpu=True, disable_tqdm=True, output_dir=out_dir)
    kwargs = DataLoaderKwargs(collate_fn=lambda rows: padded(rows, mask=True), num_workers=0)
    train = [job.train[i] for i in job.order]
    analyzer.fit_all_factors(
        "ekfac",
        dataset=train,
        per_device_batch_size=BATCH,
        dataloader_kwargs=kwargs,
        factor_args=FactorArguments(strategy="ekfac"),
        overwrite_output_dir=True,
    )
    analyzer.compute_pairwise_scores(
        "scores",
        "ekfac",
        query_dataset=job.queries,
        train_dataset=train,
        per_device_query_batch_size=len(job.queries),
        per_device_train_batch_size=BATCH,
        dataloader_kwargs=kwargs,
        score_args=ScoreArguments(),
        overwrite_output_dir=True,
    )
    return unsort(analyzer.load_pairwise_scores("scores")["all_modules"].double().numpy(), job.order)


# ---------------------------------------------------------------------------------------------- traker
def run_traker(job: Job, out_dir: str, lambda_reg: float) -> np.ndarray:
    from trak import TRAKer
    from trak.gradient_computers import FunctionalGradientComputer
    from trak.modelout_functions import AbstractModelOutput
    from trak.projectors import BasicProjector, NoOpProjector, ProjectionType

    class LogLikelihood(AbstractModelOutput):
        """f(z) = log p(answer | prompt) = −summed NLL; out-to-loss weight 1 (no classification margin)."""

        def __init__(self) -> None:
            super().__init__()

        def get_output(self, model, weights, buffers, ids, labels):
            return -example_nll(model, {**weights, **buffers}, ids, labels)

        def get_out_to_loss_grad(self, model, weights, buffers, batch):
            return torch.ones(batch[0].shape[0], 1)

    class LoraOnly(FunctionalGradientComputer):
        """traker's grad_wrt drops the frozen weights' gradients AFTER computing them; differentiate LoRA only."""

        def load_model_params(self, model):
            self.func_weights = {n: p for n, p in model.named_parameters() if p.requires_grad}
            self.func_buffers = dict(model.named_buffers())

    size = job.lora_size
    projector = (
        NoOpProjector(size, 0, 0, ProjectionType.normal, "cpu")
        if job.proj is None
        else BasicProjector(size, job.proj, 0, ProjectionType.normal, "cpu", dtype=torch.float32)
    )
    traker = TRAKer(
        model=job.model,
        task=LogLikelihood(),
        train_set_size=len(job.train),
        save_dir=out_dir,
        device="cpu",
        gradient_computer=LoraOnly,
        projector=projector,
        use_half_precision=False,
        grad_wrt=job.names,
        lambda_reg=lambda_reg,
        logging_level=40,
    )
    traker.load_checkpoint(job.model.state_dict(), model_id=0)
    for batch in loader(job.train, job.order, mask=False, as_tuple=True):
        traker.featurize(batch=batch, num_samples=batch[0].shape[0])
    traker.finalize_features()
    traker.start_scoring_checkpoint("q", job.model.state_dict(), model_id=0, num_targets=len(job.queries))
    for batch in loader(job.queries, list(range(len(job.queries))), mask=False, as_tuple=True):
        traker.score(batch=batch, num_samples=batch[0].shape[0])
    return unsort(np.asarray(traker.finalize_scores(exp_name="q"), dtype=np.float64).T, job.order)


# ---------------------------------------------------------------------------------------------- dattri
def dattri_task(job: Job):
    from dattri.task import AttributionTask

    def loss(params, data):  # one example (vmapped by dattri): summed NLL
        return example_nll(job.model, params, *data)

    return AttributionTask(loss_func=loss, model=job.model, checkpoints=job.model.state_dict())


def projector_kwargs(job: Job) -> dict:
    kind = "identity" if job.proj is None else "normal"
    return {
        "proj_dim": job.proj or job.lora_size,
        "proj_max_batch_size": BATCH,
        "proj_seed": 0,
        "device": "cpu",
        "proj_type": kind,
    }


def run_dattri_trak(job: Job, lambda_reg: float) -> np.ndarray:
    from dattri.algorithm.trak import TRAKAttributor

    def p_correct(params, data):  # TRAK's Q = 1 − p: p = p(answer | prompt) of one example
        return torch.exp(-example_nll(job.model, params, *data))

    attributor = TRAKAttributor(dattri_task(job), p_correct, projector_kwargs(job), regularization=lambda_reg)
    attributor.cache(loader(job.train, job.order, mask=False, as_tuple=True))
    scores = attributor.attribute(loader(job.queries, list(range(len(job.queries))), False, True))  # (N, Q)
    return unsort(scores.double().numpy().T, job.order)


def run_dattri_tracin(job: Job, exact: bool) -> np.ndarray:
    from dattri.algorithm.tracin import TracInAttributor

    attributor = TracInAttributor(
        dattri_task(job), torch.tensor([1.0]), normalized_grad=False, projector_kwargs=projector_kwargs(job)
    )
    if exact or job.proj is None:
        attributor.projector_kwargs = None  # the constructor falls back to a 512-d projection when given None
    scores = attributor.attribute(
        loader(job.train, job.order, False, True), loader(job.queries, list(range(len(job.queries))), False, True)
    )  # (N, Q)
    return unsort(scores.double().numpy().T, job.order)


class LossModel(nn.Module):
    """dattri LoGra reads `.loss` of model(**batch) for queries: expose the summed NLL there."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, labels):
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask).logits
        return SimpleNamespace(loss=summed_nll(logits, labels))


def logra_dim(job: Job) -> int:
    """Per-linear perfect square closest to (at most) Gradian's budget shared over the LoRA linears."""
    budget = (job.proj or job.lora_size) // len(lora_matrices(job.model))  # one per lora_A / lora_B linear
    return max(1, math.isqrt(budget)) ** 2


def run_dattri_logra(job: Job, out_dir: str) -> np.ndarray:
    from dattri.algorithm.logra import LoGraAttributor
    from dattri.task import AttributionTask

    wrapped = LossModel(job.model)
    layers = [n for n, m in wrapped.named_modules() if isinstance(m, nn.Linear) and ".lora_" in n]
    task = AttributionTask(
        loss_func=lambda model, batch, device: model(**batch).loss, model=wrapped, checkpoints=wrapped.state_dict()
    )
    attributor = LoGraAttributor(
        task, layer_names=layers, hessian="eFIM", proj_dim=logra_dim(job), offload="cpu", cache_dir=out_dir
    )
    train = loader(job.train, job.order, mask=True, as_tuple=False)
    attributor.cache(train)
    scores = attributor.attribute(train, loader(job.queries, list(range(len(job.queries))), True, False))
    return unsort(scores.double().numpy().T, job.order)


# ---------------------------------------------------------------------------------------------- harness
def run_tool(tool: str, job: Job, out_dir: str, lambda_reg: float) -> np.ndarray:
    runners: dict[str, Callable[[], np.ndarray]] = {
        "reference": lambda: run_gradian(job, None),
        "gradian": lambda: run_gradian(job, job.proj),
        "gradian-size": lambda: run_gradian(job, job.proj, budget="size"),
        "kronfluence": lambda: run_kronfluence(job, out_dir),
        "traker": lambda: run_traker(job, out_dir, lambda_reg),
        "dattri-trak": lambda: run_dattri_trak(job, lambda_reg),
        "dattri-tracin": lambda: run_dattri_tracin(job, exact=False),
        "dattri-tracin-exact": lambda: run_dattri_tracin(job, exact=True),
        "dattri-logra": lambda: run_dattri_logra(job, out_dir),
    }
    return runners[tool]()


def child(tool: str, name: str, n_train: int, n_queries: int, threads: int, lambda_reg: float) -> None:
    """Build the job, time the tool end to end, print one JSON line (seconds, peak RSS, scores)."""
    torch.set_num_threads(threads)
    job = make_job(name, n_train, n_queries)
    if tool in VMAP_TOOLS:  # torch.vmap has no batching rule for CPU SDPA and loops: eager is faster for them
        job.model.set_attn_implementation("eager")
    extra = {"proj": job.proj, "lora_size": job.lora_size, "logra_dim": logra_dim(job)}
    with tempfile.TemporaryDirectory() as out_dir:
        start = time.perf_counter()
        scores = run_tool(tool, job, out_dir, lambda_reg)
        seconds = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "peak_rss_mb": rss, "scores": scores.tolist(), **extra}))


def spawn(tool: str, args: argparse.Namespace) -> dict:
    threads = {"OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    cmd, env = module_child("benchmarks.speed.peer_speed", "--child", tool, args.model, str(args.train),
                            str(args.queries), str(args.threads), str(args.lambda_reg), env={**os.environ, **threads})
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"tool": tool, "timeout": args.timeout}
    if out.returncode < 0:  # SIGKILL here is most often the kernel's out-of-memory killer: see peak RSS of others
        return {"tool": tool, "error": f"killed by signal {-out.returncode}"}
    if out.returncode != 0:
        lines = [line for line in out.stderr.strip().splitlines() if line.strip() and "%|" not in line]  # no bars
        return {"tool": tool, "error": lines[-1] if lines else f"exit {out.returncode}"}
    return {"tool": tool, **json.loads(out.stdout.strip().splitlines()[-1])}


def mean_spearman(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean([spearmanr(x, y).statistic for x, y in zip(a, b, strict=True)]))


def table(results: list[dict], reference: np.ndarray, header: str, tokens: int) -> str:
    gradian = next(r for r in results if r["tool"] == "gradian")
    lines = [
        header,
        "",
        "| tool | seconds | train tok/s | Gradian is × faster | peak RSS MB | Spearman vs exact |",
        "|" + "---|" * 6,
    ]
    for r in results:
        if "timeout" in r:  # stopped: the ratio is a lower bound
            lines.append(
                f"| {LABELS[r['tool']]} | > {r['timeout']} | | > {r['timeout'] / gradian['seconds']:.0f} | | |"
            )
            continue
        if "error" in r:
            lines.append(f"| {LABELS[r['tool']]} | failed: {r['error'][:100]} | | | | |")
            continue
        rho = mean_spearman(np.asarray(r["scores"]), reference)
        lines.append(
            f"| {LABELS[r['tool']]} | {r['seconds']:.1f} | {tokens / r['seconds']:.0f} | "
            f"{r['seconds'] / gradian['seconds']:.1f} | {r['peak_rss_mb']:.0f} | {rho:.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        tool, name, n, q, threads, lam = sys.argv[2:8]
        child(tool, name, int(n), int(q), int(threads), float(lam))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", choices=list(SHAPES))
    parser.add_argument("--train", type=int, default=64, help="N training rows")
    parser.add_argument("--queries", type=int, default=8, help="Q query rows")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tools", nargs="+", default=list(TOOLS), choices=TOOLS)
    parser.add_argument("--lambda-reg", type=float, default=1e-3, help="TRAK's ridge on ΦᵀΦ (both TRAKs)")
    parser.add_argument("--repeats", type=int, default=1, help="best of this many interleaved runs per tool")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds allowed per tool")
    parser.add_argument("--json", help="also write the results (without score matrices) as JSON here")
    args = parser.parse_args()
    tools = ["gradian", *[t for t in args.tools if t != "gradian"]]
    reference = np.asarray(spawn("reference", args)["scores"])
    results = [spawn(tool, args) for tool in tools]
    for _ in range(args.repeats - 1):  # interleaved reruns, best time kept: load on a shared machine hits all alike
        for result, again in zip(results, [spawn(r["tool"], args) for r in results], strict=True):
            if "seconds" in again and again["seconds"] < result.get("seconds", math.inf):
                result.update(again)
    rows = make_rows(args.model, args.train, seed=0)
    tokens = sum(len(r.input_ids) for r in rows)
    first = next(r for r in results if "seconds" in r)
    header = (
        f"**{args.model}**, LoRA all-linear r=8 ({first['lora_size']} weights), N={args.train} train rows "
        f"({tokens} tokens), Q={args.queries} queries, projection {first['proj'] or 'none (exact)'} "
        f"(LoGra {first['logra_dim']} per linear), torch {args.threads} threads, CPU"
    )
    print(table(results, reference, header, tokens))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump([{k: v for k, v in r.items() if k != "scores"} for r in results], handle, indent=2)


if __name__ == "__main__":
    main()
