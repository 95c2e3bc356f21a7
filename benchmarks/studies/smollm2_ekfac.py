"""EK-FAC on the real-model suite: does the preconditioner that leads the tiny suite's LDS find SmolLM2's culprits?

On the tiny suite's counterfactual benchmark EK-FAC's LDS is above the default's on three of four runs
(`benchmarks/harness/counterfactual.py`). SmolLM2 retrains are too slow on these CPUs for an LDS, so this study asks
the cheaper question on every ranked SmolLM2 run (both halves): `gradian attribute --preconditioner ekfac --rank
gradient` (its row harm is then the summed effect) against the default and the identity preconditioner with the
same summed harm, culprit AUPRC against the planted rows, beside the category oracle and random. The default's
generations and projection shares are copied in, so EK-FAC's run costs its factors and its scoring.

    python -m benchmarks.studies.smollm2_ekfac [--suite ~/.cache/gradian/smollm2-suite]

Writes benchmarks/results/smollm2_ekfac.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np

from gradian import attribute
from gradian.report.rows import read_examples
from gradian.scenarios import attribute_settings
from gradian.scenarios.evaluate import auprc, planted

RESULTS = Path(__file__).resolve().parents[1] / "results"
HALVES = ("smollm2_quality.json", "smollm2_quality_test.json")  # the ranked runs' records, written by smollm2_suite
REUSED = ("generations.jsonl", "generations.settings.json", "projection-shares.json")
COLUMNS = {"default": "gradient (default)", "identity, summed harm": "gradient · naive · raw · final",
           "category oracle": "category oracle", "random": "random"}


def ekfac_run(folder: Path, quality: Path) -> tuple[np.ndarray, list[str], float | None]:
    """(N,) EK-FAC effect per row (report order), the rows' ids, and attribute's wall seconds (generation reused;
    None when its report was there)."""
    out = quality / "ekfac"
    out.mkdir(parents=True, exist_ok=True)
    for name in REUSED:
        if (quality / "attribute" / name).is_file() and not (out / name).is_file():
            shutil.copy2(quality / "attribute" / name, out / name)
    seconds = None  # a report already there was timed when it was made
    if not (out / "report.json").is_file():
        start = time.perf_counter()
        attribute(attribute_settings(folder, out, preconditioner="ekfac", rank="gradient"))
        seconds = time.perf_counter() - start
    rows = read_examples(out)
    return np.array([row.get("effect") or 0.0 for row in rows]), [row["id"] for row in rows], seconds


def measure(record: dict, suite: Path) -> dict:
    folder = Path(record["folder"])
    truth = json.loads((folder / "truth.json").read_text())
    effect, ids, seconds = ekfac_run(folder, suite / "quality" / folder.name)
    planted_rows = planted(ids, truth)
    out = {"run": folder.name, "split": record["split"], "n_culprits": int(planted_rows.sum()),
           "EK-FAC": auprc(-effect, planted_rows), "EK-FAC seconds": seconds, "epoch_seconds": record["epoch_seconds"]}
    out.update({name: record["methods"][key]["auprc"] for name, key in COLUMNS.items()})
    return out


def table(rows: list[dict]) -> str:
    names = ["EK-FAC", *COLUMNS]
    lines = ["| run | split | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    lines += [f"| {r['run']} | {r['split']} | " + " | ".join(f"{r[n]:.3f}" for n in names) + " |" for r in rows]
    for split in ("dev", "test"):
        part = [r for r in rows if r["split"] == split]
        if part:
            lines.append(f"| **{split} mean** | | " + " | ".join(f"{np.mean([r[n] for r in part]):.3f}"
                                                            for n in names) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", type=Path, default=Path.home() / ".cache" / "gradian" / "smollm2-suite")
    args = parser.parse_args(argv)
    records = [r for half in HALVES for r in json.loads((RESULTS / half).read_text()) if r["methods"]]
    rows = []
    for record in records:
        rows.append(measure(record, args.suite))
        print(json.dumps(rows[-1]), flush=True)
    (RESULTS / "smollm2_ekfac.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
