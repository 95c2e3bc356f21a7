"""Scale: wall time and peak memory of each stage at N = 10⁴, 10⁵ (and 10⁶) rows, and 2 processes vs 1.

On the tiny model (hidden 32, 2 layers, LoRA r=4 on q/v, projection 256 floats in fp16) with synthetic rows of
24 tokens, each N runs in a process of its own (`--child`), so its peaks are its own:

- extract: per-example LoRA gradients of every row into the feature store (`extract_train_features`);
- score: 16 seeded queries against every row, streamed into a memory-mapped scores.npy (`scores.scoring`);
- cluster: the clustering space and k-means fitted on a 20 000-row sample, every row assigned in chunks;
- summary: harm shares and their bootstrap CI over queries, per cluster (`clusters.summary`);
- report: the verdict, report.json, examples.jsonl, report.md and report.html.

`--synthetic` skips extraction and writes a store of seeded random features instead (memory-mapped, like a real
one), for the N whose extraction would not fit the time budget. Memory is sampled every 20 ms from
/proc/self/status: `rss` (VmRSS: heap plus the mapped files' resident pages, which the kernel can drop) and
`anon` (RssAnon: the heap alone, what must fit in RAM). `rows` is the anon memory the inputs hold before the
stages run: the training rows and their rendering as columns (`data.columns`, as the audit hands them on), whose
own size (`rows_bytes`, from the arrays' nbytes) is reported beside it.

    python -m benchmarks.speed.scale --sizes 10000 100000 --synthetic-sizes 1000000 --two-processes 10000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "scale.json"
TOPICS = {"invoice": "invoice currency amount total", "shipping": "shipping package address delivery",
          "refund": "refund order payment card", "account": "account email password login"}
WORDS = sorted({w for words in TOPICS.values() for w in words.split()} | set("please my the is late help".split()))
TOKENS, PROJ_DIM, QUERIES = 24, 256, 16


def memory() -> tuple[int, int]:
    """(VmRSS, RssAnon) of this process in bytes."""
    values = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "RssAnon"):
            values[key] = int(rest.split()[0]) * 1024
    return values["VmRSS"], values["RssAnon"]


class Meter:
    """Wall time and peak memory of named stages (a sampling thread; the peaks are reset per stage)."""

    def __init__(self) -> None:
        self.stages: dict[str, dict[str, float]] = {}
        self.peak = [0, 0]
        self.running = True
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while self.running:
            rss, anon = memory()
            self.peak = [max(self.peak[0], rss), max(self.peak[1], anon)]
            time.sleep(0.02)

    @contextmanager
    def stage(self, name: str):
        self.peak = list(memory())
        start = time.perf_counter()
        yield
        seconds = time.perf_counter() - start
        rss, anon = memory()
        self.stages[name] = {"seconds": seconds, "peak_rss": max(self.peak[0], rss),
                             "peak_anon": max(self.peak[1], anon)}


def tiny_lora_model():
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from gradian.scenarios.tokenizer import build_tokenizer

    tokenizer = build_tokenizer(WORDS)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
    model = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                                init_lora_weights=False))
    return model, tokenizer


def synthetic_rows(n: int, vocab: int, seed: int = 0):
    """(examples, rendered) as columns (`data.columns`): prompt/completion rows of four topics and their token rows
    (24 tokens each), built a batch at a time, so no list of n row objects is ever held."""
    from gradian.data.columns import ExampleColumns
    from gradian.data.examples import Example
    from gradian.data.render import IGNORE, Rendered
    from gradian.data.rendered_columns import RenderedColumns

    rng = np.random.default_rng(seed)
    names = sorted(TOPICS)
    topic = rng.integers(0, len(names), n)
    tokens = rng.integers(4, vocab, size=(n, TOKENS))

    def examples():
        for i in range(n):
            words = TOPICS[names[topic[i]]]
            yield Example(f"r{i}", i + 1, {"prompt": f"please help my {words} {i % 97}",
                                           "completion": f'{{"intent": "{names[topic[i]]}", "n": {i}}}'})

    def rendered():
        for i in range(n):
            ids = tokens[i].tolist()
            yield Rendered(f"r{i}", ids, [IGNORE] * 8 + ids[8:], TOKENS, 8)

    columns = ExampleColumns.from_examples(examples())
    return columns, RenderedColumns.from_rendered(rendered(), ids=columns.ids)  # one id column for both


def synthetic_store(root: Path, n: int, settings) -> None:
    """A store of seeded random features, written file by file as extraction writes them."""
    from gradian.gradients.store import ShardWriter, n_files

    meta = {"version": 1, "layout": 2, "gradient": settings.to_dict(), "projection": {"dim": PROJ_DIM},
            "scale": "identity", "n_rows": n, "synthetic": True}
    writer = ShardWriter(root, meta, [f"r{i}" for i in range(n)], 0, 1, PROJ_DIM)
    rng = np.random.default_rng(1)
    for index in range(n_files(n, settings.shard_rows)):
        file = writer.files[index]
        block = rng.normal(size=(file.stop - file.start, PROJ_DIM)).astype(np.float16)
        writer.write(list(range(file.start, file.stop)), block)


def child(n: int, synthetic: bool, out: Path) -> dict:
    from gradian.clusters.cluster import fit_clusters
    from gradian.clusters.naming import name_clusters
    from gradian.clusters.summary import summarize_clusters
    from gradian.gradients.extract import GradientSettings, extract_train_features
    from gradian.gradients.store import FeatureStore
    from gradian.report.rows import ExampleRows
    from gradian.report.schema import Attribution, build_report
    from gradian.report.writers import write_report
    from gradian.scores.scoring import effects_file, publish, score_features, total_effect
    from gradian.verdict import decide

    torch.set_num_threads(1)
    meter = Meter()
    model, tokenizer = tiny_lora_model()
    start_rss, start_anon = memory()
    examples, rendered = synthetic_rows(n, len(tokenizer))
    rows_anon = memory()[1] - start_anon
    settings = GradientSettings(proj_dim=PROJ_DIM, batch_size=32, store_dtype="float16", seed=0)
    if synthetic:
        with meter.stage("store (synthetic)"):
            synthetic_store(out / "gradients", n, settings)
    else:
        with meter.stage("extract"):
            extract_train_features(model, rendered, out / "gradients", settings=settings)
    store = FeatureStore(out / "gradients")
    queries = np.random.default_rng(2).normal(size=(QUERIES, store.dim))
    with meter.stage("score"):
        effects = effects_file(out / "scores.npy", QUERIES, n)
        score_features(store, queries, unit_norm_train=True, out=effects)
        effects = publish(effects, out / "scores.npy")
    texts = examples.texts()  # two string columns
    with meter.stage("cluster"):
        fitted = fit_clusters(texts, store, seed=0)
        sample = fitted.embedding.sample
        names = name_clusters([texts[i] for i in sample], fitted.labels[sample])
    ids = examples.ids  # a string column
    with meter.stage("summary"):
        summaries = summarize_clusters(ids, fitted.labels, effects, names, [], seed=0)
    regression = dict(capability="json_formatting", base_rate=0.95, finetuned_rate=0.6, delta=-0.35, ci_low=-0.45,
                      ci_high=-0.25, p_value=1e-6, n=80, significant=True)
    with meter.stage("report"):
        effect = total_effect(effects)
        verdict = decide(regression, [], summaries, effect, list(ids))  # decide takes a list of ids
        report = build_report(regression, verdict, [], examples,
                              attribution=Attribution(effects, fitted.labels, summaries, fitted.embedding))
        write_report(out / "report", report, examples, ExampleRows.of(ids, effect, fitted.labels, [],
                                                                      verdict.culprit_ids))
    meter.running = False
    return {"n": n, "synthetic": synthetic, "start_rss": start_rss, "rows_anon": rows_anon,
            "rows_bytes": examples.nbytes + rendered.nbytes,
            "store_bytes": sum(p.stat().st_size for p in (out / "gradients").glob("shard-*.npy")),
            "report_json_bytes": (out / "report" / "report.json").stat().st_size, "stages": meter.stages,
            "tokens_per_row": TOKENS, "proj_dim": PROJ_DIM, "queries": QUERIES}


def extract_only(n: int, out: Path) -> float:
    """Seconds of `extract_train_features` over n rows in this process, its shard under torchrun."""
    from gradian.gradients.distributed import join, leave
    from gradian.gradients.extract import GradientSettings, extract_train_features

    torch.set_num_threads(1)
    ranks = join()
    model, tokenizer = tiny_lora_model()
    _, rendered = synthetic_rows(n, len(tokenizer))
    settings = GradientSettings(proj_dim=PROJ_DIM, batch_size=32, store_dtype="float16", seed=0,
                                shard_rows=max(1, n // 8))
    ranks.barrier()
    start = time.perf_counter()
    extract_train_features(model, rendered, out, settings=settings, shard=ranks.shard)
    ranks.barrier()
    seconds = time.perf_counter() - start
    if ranks.is_main:
        (out / "seconds.json").write_text(json.dumps({"seconds": seconds, "world": ranks.world}))
    leave(ranks)
    return seconds


def run_child(args: list[str]) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-4000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def two_processes(n: int, tmp: Path) -> dict:
    """Extraction of the same n rows by 1 process and by 2 under torchrun (one thread each)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    seconds = {}
    for world in (1, 2):
        out = tmp / f"two-{world}"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
                   __file__, "--extract-only", str(n), "--out", str(out)]
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(done.stderr[-4000:])
        seconds[world] = json.loads((out / "seconds.json").read_text())["seconds"]
    same = all((tmp / "two-1" / p.name).read_bytes() == p.read_bytes() for p in (tmp / "two-2").glob("shard-*"))
    return {"n": n, "one": seconds[1], "two": seconds[2], "ratio": seconds[1] / seconds[2], "same_bytes": same}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000])
    parser.add_argument("--synthetic-sizes", type=int, nargs="*", default=[1_000_000])
    parser.add_argument("--two-processes", type=int, default=10_000)
    parser.add_argument("--child", type=int)
    parser.add_argument("--synthetic", action="store_true")
    parser.add_argument("--extract-only", type=int)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.synthetic, args.out)))
        return
    if args.extract_only:
        extract_only(args.extract_only, args.out)
        return
    results: dict = {"runs": [], "machine": f"{os.cpu_count()} CPU cores (shared), torch {torch.__version__}"}
    with tempfile.TemporaryDirectory() as tmp:
        for n, synthetic in [(n, False) for n in args.sizes] + [(n, True) for n in args.synthetic_sizes]:
            out = Path(tmp) / f"n{n}-{synthetic}"
            run = run_child(["--child", str(n), "--out", str(out)] + (["--synthetic"] if synthetic else []))
            results["runs"].append(run)
            print(json.dumps(run), flush=True)
        if args.two_processes:
            results["two_processes"] = two_processes(args.two_processes, Path(tmp))
            print(json.dumps(results["two_processes"]), flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1))
    print(markdown(results))


def markdown(results: dict) -> str:
    mb = 1 << 20
    lines = ["| N | store | stage | seconds | s per 10⁴ rows | peak RSS MB | peak anon MB |", "|---|---|---|---|---|---|---|"]
    for run in results["runs"]:
        for name, stage in run["stages"].items():
            lines.append(f"| {run['n']:,} | {'synthetic' if run['synthetic'] else 'extracted'} | {name} | "
                         f"{stage['seconds']:.1f} | {stage['seconds'] / run['n'] * 1e4:.2f} | "
                         f"{stage['peak_rss'] / mb:.0f} | {stage['peak_anon'] / mb:.0f} |")
    lines.append("")
    lines.append("| N | rows' anon MB | rows' arrays MB (bytes a row) | store MB | report.json KB |")
    lines.append("|---|---|---|---|---|")
    for run in results["runs"]:
        lines.append(f"| {run['n']:,} | {run['rows_anon'] / mb:.0f} | {run['rows_bytes'] / mb:.0f} "
                     f"({run['rows_bytes'] / run['n']:.0f}) | {run['store_bytes'] / mb:.0f} | "
                     f"{run['report_json_bytes'] / 1024:.0f} |")
    peaks = {run["n"]: [max(stage[key] for stage in run["stages"].values()) for key in ("peak_rss", "peak_anon")]
             for run in results["runs"]}
    low, high = min(peaks), max(peaks)
    lines += ["", f"Peak over the stages, {high:,} rows vs {low:,}: RSS {peaks[high][0] / mb:.0f} / "
                  f"{peaks[low][0] / mb:.0f} MB = {peaks[high][0] / peaks[low][0]:.2f}x, anon "
                  f"{peaks[high][1] / mb:.0f} / {peaks[low][1] / mb:.0f} MB = {peaks[high][1] / peaks[low][1]:.2f}x."]
    two = results.get("two_processes")
    if two:
        lines += ["", f"Extraction of {two['n']:,} rows: 1 process {two['one']:.1f} s, 2 processes (torchrun, gloo) "
                      f"{two['two']:.1f} s: {two['ratio']:.2f}x; the same store bytes: {two['same_bytes']}."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
