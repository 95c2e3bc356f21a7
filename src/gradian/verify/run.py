"""`verify`: retrain with the run's own recipe without the named rows (or with the named fix) and measure again.

A thin facade over the stages (the CLI calls `verify(settings, say=..., bar=...)`): read the report and the
recipe, plan the retrains, train each (resumable) in `DIR/verify/`, measure each on the report's eval prompts,
write `DIR/verification.json` and the report's verification section.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from gradian.capabilities import get_capability
from gradian.data.adapter_base import ADAPTER_WEIGHTS
from gradian.data.base_model import BaseModelRef, load_tokenizer, resolve_base_model
from gradian.data.examples import read_dataset
from gradian.data.run_folder import read_run
from gradian.errors import InputError, reason
from gradian.guard import inputs, refuse_overwrite
from gradian.lock import LOCK_NAME, output_lock
from gradian.regression.loading import pick_device_dtype, read_adapter_config
from gradian.report.rows import EXAMPLES_FILE, read_examples, schema_validator
from gradian.report.schema import SCHEMA_VERSION
from gradian.schemas import schema_problem
from gradian.space import allocated, require_space
from gradian.verify.measure import measure_adapter, read_original
from gradian.verify.pages import HTML, MARKDOWN, write_pages
from gradian.verify.plan import plan
from gradian.verify.recipe import read_recipe, with_report_evidence
from gradian.verify.retrain import retrain
from gradian.verify.settings import VerifySettings
from gradian.verify.verification import FILE, summarize, write_verification

Say = Callable[[str], None]
Bar = Callable[[Iterable, str], Iterable]
RETRAINS = "verify"  # DIR/verify/: one folder per retrain
INPUTS = ("dataset", "base_model", "adapter", "run", "config", "eval_dataset", "capability")  # report.json's settings
WRITES = (LOCK_NAME, f"{RETRAINS}/", FILE, HTML, MARKDOWN, "report.json", "report.md", "report.html")  # into DIR


def verify(settings: VerifySettings, *, say: Say | None = None, bar: Bar | None = None) -> dict[str, Any]:
    """Run every retrain of the plan and return verification.json as a dict."""
    folder = Path(settings.report)
    if not (folder / "report.json").is_file():
        raise InputError("holds no report.json; run `gradian attribute --out` into it first.", folder)
    report = _read_report(folder)
    refusal = serving_refusal(report)  # before the lock, the plan or any retrain
    if refusal:
        raise InputError(refusal, folder / "report.json")
    used = report.get("settings") or {}
    refuse_overwrite(folder, WRITES, inputs(dataset=used.get("dataset"), base_model=used.get("base_model"),
                                            adapter=used.get("adapter"), run=used.get("run"), config=used.get("config"),
                                            eval_dataset=used.get("eval_dataset"), capability=used.get("capability")),
                     remedy="rerun `gradian attribute` with an --out folder apart from its inputs and verify that one")
    with output_lock(folder):
        return _verify(settings, folder, say or (lambda _: None), bar)


def _verify(settings: VerifySettings, folder: Path, say: Say, bar: Bar | None) -> dict[str, Any]:
    report = read_report(folder)
    rows = read_examples(folder) if (folder / EXAMPLES_FILE).exists() else report.get("examples", [])
    used = report.get("settings") or {}
    base = _base(used)
    run = read_run(used.get("run") or used.get("adapter"), used.get("config"))
    adapter = used.get("adapter") or (str(run.adapter_dir) if run.adapter_dir else None)
    recipe, evidence = with_report_evidence(read_recipe(run, read_adapter_config(Path(adapter)) if adapter else None),
                                            report)
    for name, value in recipe.defaults.items():
        say(f"recipe: the run does not record {name}; using the default, {value!r}")
    if recipe.unmapped:
        say(f"recipe: not applied (no TRL equivalent): {', '.join(recipe.unmapped)}")
    if evidence:
        say(evidence)
    elif recipe.eos_after_truncation:
        say("recipe: add_eos_token: the retrains tokenize the rows as the run did, EOS appended after the cut")
    device = str(pick_device_dtype(settings.device, None)[0])
    capability = get_capability(used.get("capability", "json_formatting"))
    original = read_original(folder, capability)
    examples = read_dataset(used["dataset"])
    cleaned_file = folder / "train.cleaned.jsonl"
    cleaned = read_dataset(cleaned_file) if cleaned_file.is_file() and report["verdict"].get("culprit_ids") else None
    seed = int(used.get("seed", 0))
    order = run.record.order if run.record is not None else None
    if order is not None:
        say(f"verify: replaying the order of {len(order)} optimizer steps recorded in gradian_run.json")
    todo = plan({**report, "examples": rows}, recipe, examples, cleaned, load_tokenizer(base),
                controls=settings.controls, dropped_controls=settings.dropped_controls, groups=settings.groups,
                seed=seed, curve=settings.curve, report_dir=folder / EXAMPLES_FILE, order=order)
    if todo.scheme_note:
        say(f"verify: {todo.scheme_note}")
    if todo.primary is None and todo.fix_note:
        say(f"verify: {todo.fix_note}")
    scores, markers = {}, {}
    root = folder / RETRAINS
    require_space(folder, retrains_bytes(adapter, len(todo.jobs)), f"verify's {len(todo.jobs)} retrains",
                  present=allocated(root))
    for number, (_, job) in enumerate(todo.jobs, start=1):
        weight = f", {len(job.zero_ids)} at zero weight" if job.zero_ids else ""
        say(f"verify {number}/{len(todo.jobs)}: {job.name} ({len(job.rows)} rows{weight}, seed {job.seed})")
        path, markers[job.name] = retrain(job, recipe, base, root, device=device, max_steps=settings.max_steps,
                                          steps=_steps(bar, f"training {job.name}"))
        ticks = bar(range(len(original.ids)), f"measuring {job.name}") if bar is not None else None
        scores[job.name] = measure_adapter(path, base, original, capability, device=device,
                                           batch_size=settings.batch_size, progress=_ticker(ticks))
        getattr(ticks, "close", lambda: None)()
    verification = summarize(todo, original, scores, markers, recipe, report, seed=seed, device=device,
                             max_steps=settings.max_steps, original_train_s=_train_runtime(run.log_history))
    write_verification(folder, verification, report)
    write_pages(folder, verification)
    return verification


def read_report(folder: Path) -> dict[str, Any]:
    """report.json, checked against the report schema before any field is used (a hand-edited verdict is one
    sentence, not a crash halfway through the retrains)."""
    report = _read_report(folder)
    problem = schema_problem(schema_validator(), report)
    if problem:
        raise InputError(f"does not match the report schema ({problem}); it was edited or damaged: rerun `gradian "
                         "attribute` with the same --out to write it again, then verify.", folder / "report.json")
    return report


def serving_refusal(report: dict[str, Any]) -> str | None:
    """Why verify retrains nothing for a `serving` verdict (the drop happens after training, so no retrain without
    rows can move it), with the report's serving fix; None for any other verdict."""
    verdict = report.get("verdict")
    if not isinstance(verdict, dict) or verdict.get("kind") != "serving":
        return None
    fix = verdict.get("next_action")
    fix = f": {fix.strip().rstrip('.')}" if isinstance(fix, str) and fix.strip() else " (report.md's next action)"
    return ("has the verdict `serving`: the drop happens in the serving path, not in training, so removing training "
            f"rows cannot move it; apply the report's serving fix instead and measure the served answers again{fix}.")


def _read_report(folder: Path) -> dict[str, Any]:
    """report.json read far enough to know its settings (what the overwrite guard needs)."""
    path = folder / "report.json"
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as error:
        raise InputError(f"is not a readable report ({reason(error)}); rerun `gradian attribute`.", path) from None
    settings = report.get("settings") if isinstance(report, dict) else None
    if not isinstance(report, dict) or "verdict" not in report or not isinstance(settings, dict) \
            or not settings.get("dataset"):
        raise InputError("is not a Gradian report (no verdict or settings); rerun `gradian attribute`.", path)
    edited = [name for name in INPUTS if not isinstance(settings.get(name), (str, type(None)))]
    if edited:
        raise InputError(f"names its {edited[0]} with a {type(settings[edited[0]]).__name__}, not a path; it was edited: "
                         "rerun `gradian attribute` to write it again.", path)
    seed = settings.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InputError(f"has the seed {seed!r}, not a whole number; it was edited: rerun `gradian attribute` to "
                         "write it again.", path)
    if report.get("schema_version") != SCHEMA_VERSION:  # its report.md/html could not be written again
        raise InputError(f"was written with report schema {report.get('schema_version')}, this Gradian writes "
                         f"{SCHEMA_VERSION}; rerun `gradian attribute` with the same --out (its cached stages are "
                         "reused), then verify.", path)
    return report


def retrains_bytes(adapter: str | None, retrains: int) -> int:
    """What `retrains` retrained adapters write: each about the size of the run's adapter weights."""
    weights = [Path(adapter) / name for name in ADAPTER_WEIGHTS] if adapter else []
    size = next((path.stat().st_size for path in weights if path.is_file()), 0)
    return size * retrains


def _base(used: dict[str, Any]) -> BaseModelRef:
    spec = used.get("base_model")
    if not spec:
        raise InputError("the report names no base model, so Gradian cannot retrain the run faithfully.")
    try:
        return resolve_base_model(spec)
    except InputError as error:
        raise InputError(f"the run's base model is missing ({error.message}), so Gradian cannot retrain it.",
                         error.path) from None


def _train_runtime(log: list[dict[str, Any]]) -> float | None:
    times = [row["train_runtime"] for row in log if isinstance(row.get("train_runtime"), (int, float))]
    return float(times[-1]) if times else None


def _steps(bar: Bar | None, label: str) -> Callable[[int, int], None] | None:
    """A step callback that draws `bar(range(total), label)` and advances it to each step reported."""
    if bar is None:
        return None
    state: dict[str, Any] = {"ticks": None, "done": 0}

    def advance(done: int, total: int) -> None:
        if state["ticks"] is None:
            state["ticks"] = iter(bar(range(total), label))
        for _ in range(done - state["done"]):
            next(state["ticks"], None)
        state["done"] = done
        if done >= total:
            next(state["ticks"], None)  # past the last item: the bar closes

    return advance


def _ticker(ticks: Iterable | None) -> Callable[[int], Any] | None:
    if ticks is None:
        return None
    steps = iter(ticks)

    def advance(n: int = 1) -> None:
        for _ in range(n):
            next(steps, None)

    return advance
