"""One-off studies on a built scenario or SmolLM2 folder, each printing or writing a markdown section."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def each_run(run_record: Callable[[Path, Path], dict | None], folders: Sequence[Path], work: Path,
             results: Path) -> list[dict]:
    """`run_record(folder, work / folder.name)` of each run folder, each record printed as one JSON line and all of
    them written to `results` as they come; a run that gives None (refused by the gate: nothing ranked) is left out."""
    records = []
    for folder in folders:
        record = run_record(folder, work / folder.name)
        if record is not None:
            records.append(record)
            print(json.dumps(record), flush=True)
            results.write_text(json.dumps(records, indent=1) + "\n")
    return records


def ranked_run(folder: Path, work: Path) -> tuple[Any, dict, Any] | None:
    """(the run `suite_quality.py` ranks, its truth.json, (N,) which rows are planted) for a study of the default's
    gradients; `gradian attribute` runs into `work/attribute` first where `suite_quality.py` has not. None where
    nothing was ranked (refused by the gate, or nothing planted)."""
    from benchmarks.harness import suite_quality
    from gradian import attribute
    from gradian.scenarios.evaluate import planted

    settings = suite_quality._settings(folder, work)
    if not (Path(settings.out) / "report.json").exists():
        attribute(settings)
    report = json.loads((Path(settings.out) / "report.json").read_text())
    truth = json.loads((folder / "truth.json").read_text())
    if not (truth["culprit_ids"] and report["clusters"]):
        return None
    run = suite_quality._GradientRun(settings, work, suite_quality.Clock())
    return run, truth, planted([r.example_id for r in run.audit.rendered], truth)
