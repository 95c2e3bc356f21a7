"""A refusal's stricter capability, on every suite run: would a user who chose `json_formatting` be pointed at the
drop the run's own capability sees?

For each run folder's kept answers (`generations.jsonl` from `suite_verdicts.py --work`), the answers are scored on
`json_formatting`; where that is refused, `regression.stricter.stricter_drop` is asked what the refusal would add.
Every run is read, null families included, so a hint on a run with no planted cause would show.

    python -m benchmarks.studies.stricter_hint --suite /work/suite/runs --work /work/verd4 --out R.json

Prints one line per run and writes the records to `--out`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

from gradian.capabilities import get_capability
from gradian.regression.statistics import compare
from gradian.regression.stricter import stricter_drop


def hint(generations: Path) -> dict:
    """The run's answers on json_formatting and, where that is refused, the stricter capability's drop."""
    rows = [json.loads(line) for line in generations.read_text(encoding="utf-8").splitlines()]
    answers = [SimpleNamespace(reference=r["reference"], base=SimpleNamespace(text=r["base_output"]),
                               finetuned=SimpleNamespace(text=r["finetuned_output"])) for r in rows]
    lenient = get_capability("json_formatting")
    summary = compare([lenient.score(a.base.text, a.reference) for a in answers],
                      [lenient.score(a.finetuned.text, a.reference) for a in answers], binary=True)
    return {"json_formatting_significant": summary.significant, "json_formatting_delta": summary.delta,
            "stricter": None if summary.significant else stricter_drop(answers, lenient)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", type=Path, required=True, help="the suite's run folders (truth.json each)")
    parser.add_argument("--work", type=Path, required=True, help="suite_verdicts.py's --work (generations.jsonl)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    records = []
    for generations in sorted(args.work.glob("*/generations.jsonl")):
        run = generations.parent.name
        truth = json.loads((args.suite / run / "truth.json").read_text(encoding="utf-8"))
        record = {"run": run, "split": truth.get("split"), "kind": truth.get("kind"),
                  "capability": truth.get("capability", "json_formatting"), **hint(generations)}
        records.append(record)
        moved = record["stricter"]
        print(run, record["capability"], "json_formatting significant" if record["json_formatting_significant"]
              else f"refused; hint: {moved and moved['capability']}")
    args.out.write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
