"""The refusal's training-noise band on suite runs: `attribute` with its defaults on each run folder; for each run the
gate refuses and whose folder keeps a checkpoint before the final adapter, the prompts' noise band beside how far
the capability moved from that checkpoint to the final adapter (`regression.training_noise`).

    python -m benchmarks.studies.training_noise --work DIR --results FILE.json RUN_FOLDER ...

A report already in `DIR/<run>/` (for example `suite_quality.py`'s `attribute/`, copied there) is reused: its
generations are kept, so only the checkpoint's answers are generated.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from gradian import attribute
from gradian.scenarios import attribute_settings
from gradian.scenarios.base import one_thread


def noise_of(folder: Path, out: Path) -> dict:
    """One run's refusal and its training-noise band (None where the run is not refused or keeps no checkpoint)."""
    started = time.perf_counter()
    with one_thread():
        report = attribute(attribute_settings(folder, out)).report
    regression = report["regression"]
    return {"run": folder.name, "verdict": report["verdict"]["kind"], "delta": regression["delta"],
            "ci": [regression["ci_low"], regression["ci_high"]], "n": regression["n"],
            "detectable_drop": regression.get("detectable_drop"), "training_noise": regression.get("training_noise"),
            "seconds": round(time.perf_counter() - started, 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--results", type=Path, required=True)
    args = parser.parse_args(argv)
    rows = []
    for folder in args.folders:
        rows.append(noise_of(folder, args.work / folder.name))
        print(json.dumps(rows[-1]), flush=True)
    args.results.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
