"""One-off studies on a built scenario or SmolLM2 folder, each printing or writing a markdown section."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path


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
