"""The verdict `gradian attribute` gives, with its defaults, on every built run of the scenario suite.

    python -m benchmarks.harness.suite_verdicts RUNS_DIR --work DIR [--markdown OUT.md] [--jobs N] [--adapter-scale S]

`--adapter-scale S` runs `attribute --adapter-scale S` instead of its default (the verdicts under another point).

RUNS_DIR holds the folders `benchmarks/harness/suite_build.py` wrote. The expected verdict follows the family's kind and
what its build measured (`attribute`'s own paired test decides whether there is a regression to explain):

- a planted cause that left a significant regression: `data-cluster`, naming its rows (right when at least 90% of
  the named rows are planted and at least half the planted rows are named); one that left none: `no-regression`;
- a setup fault with a regression: `setup`; without one: `no-regression`;
- clean data: `no-regression`, or, when the fine-tune regressed anyway (a recipe that learned its purpose badly),
  `diffuse` — any named rows or setup fault would be wrong there.

Resumable: a run whose report.json exists in DIR is read again, not recomputed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.harness import jobs

RIGHT_PRECISION, RIGHT_RECALL = 0.9, 0.5  # a data-cluster verdict is right when it names mostly planted rows, enough


def expected(kind: str, significant: bool) -> str:
    if not significant:
        return "no-regression"
    return {"data-cluster": "data-cluster", "setup": "setup"}.get(kind, "diffuse")


def verdict_of(folder: Path, out: Path, adapter_scale: float | None = None) -> dict[str, Any]:
    """The verdict on the run in `folder`, from the report in `out` (`attribute` with its defaults, or at
    `adapter_scale`, writes it there when there is none)."""
    from gradian import attribute
    from gradian.scenarios import attribute_settings

    truth = json.loads((folder / "truth.json").read_text())
    if not (out / "report.json").exists():
        attribute(attribute_settings(folder, out, **({"adapter_scale": adapter_scale} if adapter_scale is not None
                                                     else {})))
    report = json.loads((out / "report.json").read_text())
    significant = bool(report["regression"].get("significant")) and report["regression"].get("delta", 0) < 0
    named, planted = set(report["verdict"]["culprit_ids"]), set(truth["culprit_ids"])
    want = expected(truth["kind"], significant)
    precision = len(named & planted) / len(named) if named else None
    recall = len(named & planted) / len(planted) if planted and want == "data-cluster" else None
    right = report["verdict"]["kind"] == want and (want != "data-cluster" or (
        (precision or 0.0) >= RIGHT_PRECISION and (recall or 0.0) >= RIGHT_RECALL))
    return {
        "family": truth.get("family", truth["scenario"]), "split": truth.get("split", "unsplit"), "seed": truth["seed"],
        "kind": truth["kind"], "delta": report["regression"].get("delta"), "significant": significant,
        "expected": want, "verdict": report["verdict"]["kind"], "right": right,
        "named": len(named), "precision": precision, "recall": recall, "culprit_ids": sorted(named),
        "next_action": report["verdict"].get("next_action", ""),
        "symptom": (report.get("symptoms") or {}).get("dominant"),
        "rule": report["verdict"]["evidence"].get("culprit_rule") or report["verdict"]["evidence"].get("group"),
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = []
    for split in ("dev", "test"):
        picked = [r for r in rows if r["split"] == split]
        if not picked:
            continue
        right = sum(r["right"] for r in picked)
        lines += [f"**{split}**: {right} of {len(picked)} verdicts right.", "",
                  "| family | seed | kind | Δ capability | expected | verdict | named rows | precision | recall | "
                  "dominant symptom |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in picked:
            mark = "" if r["right"] else " ✗"
            lines.append(f"| {r['family']} | {r['seed']} | {r['kind']} | {_num(r['delta'])} | {r['expected']} | "
                         f"{r['verdict']}{mark} | {r['named']} | {_num(r['precision'])} | {_num(r['recall'])} | "
                         f"{r['symptom'] or '–'} |")
        lines.append("")
    return "\n".join(lines)


def _num(value: Any) -> str:
    return "–" if value is None else f"{value:+.3f}" if isinstance(value, float) and value < 0 else \
        f"{value:.3f}" if isinstance(value, float) else str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--only", nargs="*", help="folder names to run (default: every folder)")
    parser.add_argument("--jobs", type=int, default=jobs.default_jobs(), help="runs at once (default: CPUs)")
    parser.add_argument("--adapter-scale", type=float, default=None, help="attribute's --adapter-scale")
    args = parser.parse_args()
    folders = [p for p in sorted(args.runs.iterdir()) if (p / "measured.json").exists()
               and (not args.only or p.name in args.only)]
    rows = jobs.run_jobs(verdict_of, [(folder, args.work / folder.name, args.adapter_scale) for folder in folders],
                         args.jobs,
                         lambda row: print(json.dumps(row), flush=True))
    (args.work / "verdicts.json").write_text(json.dumps(rows, indent=1) + "\n")
    text = markdown(rows)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
