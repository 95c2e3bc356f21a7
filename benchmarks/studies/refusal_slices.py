"""A refusal's look inside the eval, on every refused suite run: which eval category would a refusal name?

For each run the suite refused (`report.json` of `suite_verdicts.py --work`, its `regression` not significant), the
kept answers' scores (`generations.jsonl`) are grouped by the eval rows' `category` and `regression.slices.worse_slice`
is asked what the refusal adds. Every refused run is read, clean ones included, so a hint on a run with no planted
cause shows.

    python -m benchmarks.studies.refusal_slices --suite /work/suite/runs --work /work/verd4 --out R.json

Prints one line per named category and writes the records to `--out`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

from gradian.regression.slices import worse_slice


def refused(work: Path, suite: Path) -> dict | None:
    """The refused run's record: its truth's kind, the whole eval's delta and the category a refusal names."""
    regression = json.loads((work / "report.json").read_text(encoding="utf-8"))["regression"]
    if regression.get("significant"):
        return None
    rows = [json.loads(line) for line in (work / "generations.jsonl").read_text(encoding="utf-8").splitlines()]
    evals = {r["id"]: r for r in map(json.loads, (suite / work.name / "eval.jsonl").read_text().splitlines())}
    scores = [SimpleNamespace(id=r["id"], base_score=r["base_score"], finetuned_score=r["finetuned_score"])
              for r in rows]
    fell = worse_slice(scores, [SimpleNamespace(raw=evals[r["id"]]) for r in rows],
                       binary=bool(regression.get("binary", True)))
    truth = json.loads((suite / work.name / "truth.json").read_text(encoding="utf-8"))
    return {"run": work.name, "split": truth.get("split"), "kind": truth.get("kind"),
            "planted": bool(truth.get("culprit_ids")), "delta": regression["delta"],
            "slice": None if fell is None else {k: v for k, v in fell.items() if k != "ids"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", type=Path, required=True, help="the suite's run folders (truth.json, eval.jsonl)")
    parser.add_argument("--work", type=Path, nargs="+", required=True, help="suite_verdicts.py's --work folders")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    records = []
    for work in args.work:
        for report in sorted(work.glob("*/report.json")):
            record = refused(report.parent, args.suite)
            if record is None:
                continue
            records.append(record)
            if record["slice"]:
                fell = record["slice"]
                print(record["run"], record["kind"], fell["value"], fell["n_broken"], fell["n_fixed"], fell["p_holm"])
    named = sum(r["slice"] is not None for r in records)
    print(f"{len(records)} refused runs, {named} with a category named")
    args.out.write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
