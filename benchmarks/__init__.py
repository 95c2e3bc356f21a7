"""Gradian's benchmarks, run from the repository root as modules (`python -m benchmarks.<kind>.<script> --help`).

- `harness/`: the suites that write BENCHMARKS.md's regions (build, rank, verdicts, verify) and their helpers;
- `speed/`: speed and memory measurements, each printing a table;
- `studies/`: one-off studies on a built folder;
- `results/`: what the harness and the measurements wrote.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]


def module_child(module: str, *args: str, env: Mapping[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) that run `python -m MODULE ARGS` in a child process, which finds `benchmarks` from any
    working folder: the repository root goes first on the child's PYTHONPATH."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPOSITORY), env.get("PYTHONPATH")) if p)
    return [sys.executable, "-m", module, *args], env
