"""`gradian verify --groups 3` on every data-cause run of the scenario suite, with the planted rows as a truth check.

For each run folder `benchmarks/harness/suite_quality.py` left in WORK (`WORK/<family>-seed<n>/attribute`): `attribute` again
with the same settings (its cached stages are reused; the report is rewritten with this Gradian's schema), then
`verify --groups G`, then one more retrain without the *planted* culprit rows. That last retrain asks whether the
family's ground truth is the cause of its regression: where removing the planted rows recovers nothing, the
regression has another cause and no ranking can be scored against the planted rows alone.

    python -m benchmarks.harness.suite_verify /work/scen/quality/*-seed0 [--groups 3] [--jobs N] [--results FILE]
        [--markdown FILE]

Resumable: every retrain is cached in its run's `attribute/verify/` folder.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import jobs
from gradian import attribute
from gradian.capabilities import get_capability
from gradian.data.examples import read_dataset
from gradian.report.wording import pct
from gradian.scenarios.base import one_thread
from gradian.settings import AttributeSettings
from gradian.verify import VerifySettings, verify
from gradian.verify.measure import measure_adapter, read_original, recovery
from gradian.verify.recipe import read_recipe
from gradian.verify.retrain import Retrain, retrain
from gradian.verify.verification import answers_moved

PLANTED = "without-planted"
CAUSAL = 0.8  # the planted rows are the regression's cause where removing them recovers this much


def report_retrain(out: Path, name: str, rows: list[Any] | None = None, zero_ids: frozenset[str] = frozenset()
                   ) -> dict[str, Any]:
    """Retrain the run of the report in `out` with its own recipe and seed (`rows` in place of its dataset, `zero_ids`
    at zero weight) into `out/verify/<name>`, and measure its recovery on the report's eval prompts."""
    from gradian.data.base_model import resolve_base_model
    from gradian.data.run_folder import read_run
    from gradian.regression.loading import read_adapter_config

    used = json.loads((out / "report.json").read_text())["settings"]
    base, run = resolve_base_model(used["base_model"]), read_run(used["run"], used.get("config"))
    recipe = read_recipe(run, read_adapter_config(Path(used["adapter"])))
    rows = read_dataset(used["dataset"]) if rows is None else rows
    folder, marker = retrain(Retrain(name, rows, recipe.seed, zero_ids=zero_ids), recipe, base, out / "verify",
                             device="cpu")
    capability = get_capability(used.get("capability", "json_formatting"))
    original = read_original(out, capability)
    after = measure_adapter(folder, base, original, capability, device="cpu")
    got = recovery(after, original)
    return {"removed": len(zero_ids), "recovery": got.value, "recovery_ci": list(got.ci) if got.ci else None,
            "answers": answers_moved(after, original), "wall_s": marker["wall_s"], "reused": marker["reused"]}


def planted_recovery(out: Path, truth: dict[str, Any]) -> dict[str, Any]:
    """Retrain without the planted culprit rows (zero weight, the run's own recipe and seed) and measure its recovery."""
    return report_retrain(out, PLANTED, zero_ids=frozenset(truth["culprit_ids"]))


def run_record(work: Path, groups: int) -> dict[str, Any]:
    ingredients = json.loads((work / "ingredients.json").read_text())
    folder = Path(ingredients["folder"])
    truth = json.loads((folder / "truth.json").read_text())
    out = work / "attribute"
    report = attribute(AttributeSettings(
        base_model=str(folder / "base"), adapter=str(folder / "run"), run=str(folder / "run"),
        dataset=str(folder / "train.jsonl"), eval_dataset=str(folder / "eval.jsonl"),
        capability=truth.get("capability", "json_formatting"), out=str(out), rank="combined")).report
    named = set(report["verdict"].get("culprit_ids") or [])
    planted = set(truth["culprit_ids"])
    v = verify(VerifySettings(report=str(out), groups=groups, device="cpu"))
    best = min(v["groups"], key=lambda g: g["recovery_rank"]) if v["groups"] else None
    return {
        "family": truth.get("family"), "split": truth.get("split"), "seed": truth["seed"], "work": str(work),
        "verdict": v["verdict"], "named": len(named),
        "named_planted": len(named & planted), "planted": len(planted),
        "verification": {k: v[k] for k in ("removed", "recovery", "recovery_ci", "random_recovery",
                                            "random_recovery_ci", "seed_noise", "status", "primary",
                                            "original_train_s", "retrain_s", "scheme", "dropped", "topic",
                                            "tests")},
        "retrains": [{k: r[k] for k in ("name", "kind", "rows", "recovery", "wall_s", "reused")}
                     for r in v["retrains"]],
        "groups": v["groups"], "top_group_recovers_most": None if best is None else best["harm_rank"] == 1,
        "planted_removal": planted_recovery(out, truth),
    }


def _ci(ci: Sequence[float] | None) -> str:
    return f"{pct(ci[0])} to {pct(ci[1])}" if ci else "n/a"


def markdown(records: list[dict[str, Any]]) -> str:
    lines = ["| family (split) | seed | verdict (named: planted) | removed | recovery (95% CI) | random recovery "
             "(95% CI) | same topic | rows dropped | seed noise | status | planted rows removed: recovery (95% CI) | "
             "top group recovers most | one retrain's s ÷ the run's training s |", "|" + "---|" * 13]
    for r in records:
        v, p = r["verification"], r["planted_removal"]
        walls = [x["wall_s"] for x in r["retrains"] if x["wall_s"]]  # as trained, also when reused since
        ratio = f"{sum(walls) / len(walls):.0f} / {v['original_train_s']:.0f}" if walls and v["original_train_s"] \
            else "–"
        top = {None: "n/a", True: "yes", False: "no"}[r["top_group_recovers_most"]]
        topic, dropped = v.get("topic") or {}, v.get("dropped") or {}
        lines.append(
            f"| {r['family']} ({r['split']}) | {r['seed']} | {r['verdict']} ({r['named']}: {r['named_planted']}) | "
            f"{v['removed']} | {pct(v['recovery'])} ({_ci(v['recovery_ci'])}) | {pct(v['random_recovery'])} "
            f"({_ci(v['random_recovery_ci'])}) | {pct(topic.get('recovery'))} | {pct(dropped.get('recovery'))} | "
            f"{pct(v['seed_noise'], signed=True)} | {v['status']} | "
            f"{pct(p['recovery'])} ({_ci(p['recovery_ci'])}) | {top} | {ratio} |")
    tested = [r for r in records if r["top_group_recovers_most"] is not None]
    lines.append("\n" + status_line(records))
    lines.append(f"\nThe group ranked most harmful is the one whose removal recovers most in "
                 f"{sum(r['top_group_recovers_most'] for r in tested)} of {len(tested)} runs.")
    return "\n".join(lines) + "\n"


def status_line(records: list[dict[str, Any]]) -> str:
    """How many runs verify decides, overall and where removing the planted rows recovers most of the regression."""
    def count(rs: list[dict[str, Any]]) -> str:
        tally = sorted(Counter(r["verification"]["status"] for r in rs).items())
        return ", ".join(f"{status} {n}" for status, n in tally) + f" (of {len(rs)})"
    causal = [r for r in records if (r["planted_removal"]["recovery"] or 0.0) >= CAUSAL]
    return (f"Status over every run: {count(records)}. Where removing the planted rows recovers ≥ {CAUSAL:.0%}: "
            f"{count(causal) if causal else 'no run'}.")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("works", nargs="+", type=Path, help="run folders benchmarks/harness/suite_quality.py left")
    parser.add_argument("--groups", type=int, default=3)
    parser.add_argument("--results", type=Path, default=Path("benchmarks/results/suite_verify.json"))
    parser.add_argument("--markdown", type=Path, default=Path("benchmarks/results/suite_verify.md"))
    parser.add_argument("--jobs", type=int, default=jobs.default_jobs(), help="runs at once (default: CPUs)")
    args = parser.parse_args(argv)
    records: list[dict[str, Any]] = []
    if args.results.exists():  # one file over several invocations of one suite: a rerun of a run replaces its record
        suites = {work.parent for work in args.works}  # another suite's records (another --out) are dropped
        records = [r for r in json.loads(args.results.read_text())
                   if Path(r["work"]).parent in suites and Path(r["work"]) not in set(args.works)]

    def done(record: dict[str, Any]) -> None:
        nonlocal records
        print(markdown([record]).splitlines()[2], flush=True)
        records = sorted([*records, record], key=lambda r: (r["split"], r["family"], r["seed"]))
        args.results.write_text(json.dumps(records, indent=2) + "\n")
        args.markdown.write_text(markdown(records))

    with one_thread():
        jobs.run_jobs(run_record, [(work, args.groups) for work in args.works], args.jobs, done)
    print(markdown(records))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
