"""The benchmark harness's job pool: results in order, and no worker outlives a harness killed with SIGKILL (a
worker left running would keep writing into the cache, holding its locks, while a rerun starts)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.harness.jobs import merge_records, run_jobs

ROOT = Path(__file__).resolve().parents[2]
HARNESS = """
import os, sys, time
from pathlib import Path
from benchmarks.harness.jobs import run_jobs

def nap(folder, i):
    (Path(folder) / str(os.getpid())).write_text(str(i))
    time.sleep(60)

if __name__ == "__main__":
    run_jobs(nap, [(sys.argv[1], i) for i in range(4)], 2)
"""


def square(x: int) -> int:
    return x * x


def alive(pid: int) -> bool:
    """The process runs (Linux: a zombie waiting for its reaper has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_results_come_back_in_order():
    assert run_jobs(square, [(i,) for i in range(5)], 2) == [0, 1, 4, 9, 16]


def test_workers_die_with_a_killed_harness(tmp_path):
    script = tmp_path / "harness.py"
    script.write_text(HARNESS)
    harness = subprocess.Popen([sys.executable, str(script), str(tmp_path)], cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 120
    while len([p for p in tmp_path.iterdir() if p.name.isdigit()]) < 2:  # both workers inside a job
        assert time.monotonic() < deadline and harness.poll() is None
        time.sleep(0.2)
    workers = [int(p.name) for p in tmp_path.iterdir() if p.name.isdigit()]
    harness.send_signal(signal.SIGKILL)
    harness.wait()
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in workers if alive(pid)]


def test_a_run_measured_again_replaces_its_record_and_the_others_are_kept(tmp_path):
    path = tmp_path / "results.json"
    assert merge_records(path, [{"work": "a", "v": 1}, {"work": "b", "v": 1}], "work") == [
        {"work": "a", "v": 1}, {"work": "b", "v": 1}]
    merged = merge_records(path, [{"work": "b", "v": 2}, {"work": "c", "v": 2}], "work")
    assert merged == [{"work": "a", "v": 1}, {"work": "b", "v": 2}, {"work": "c", "v": 2}]
    assert json.loads(path.read_text()) == merged
