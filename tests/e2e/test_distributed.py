"""torch.distributed: 2 gloo processes on CPU write the very bytes of one process, and a killed rank resumes.

The extraction tests launch tests/e2e/distributed_worker.py with torchrun (`python -m torch.distributed.run`) in a
subprocess; the attribute test runs `gradian attribute` under torchrun on a scenario.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gradian.gradients.store import FeatureStore

WORKER = Path(__file__).parent / "distributed_worker.py"
ROWS = 40  # 8 store files of 5 rows: ranks 0 and 1 write 4 each
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def torchrun(n: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}", *args]


def run_worker(n: int | None, store: Path, slow: float = 0.0, **popen) -> subprocess.Popen:
    store.parent.mkdir(parents=True, exist_ok=True)
    args = [str(WORKER), str(ROWS), str(slow), str(store)]
    command = torchrun(n, *args) if n else [sys.executable, *args]
    return subprocess.Popen(command, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def finished(process: subprocess.Popen) -> None:
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err[-3000:]


def store_bytes(root: Path) -> dict[str, bytes]:
    """The store's files and its positions' side store's, by name."""
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted([*root.iterdir(), *root.glob("*/*")])
            if path.suffix in (".npy", ".json")}


def test_two_gloo_processes_write_the_bytes_of_one(tmp_path):
    finished(run_worker(None, tmp_path / "one" / "store"))
    finished(run_worker(2, tmp_path / "two" / "store"))
    one, two = store_bytes(tmp_path / "one" / "store"), store_bytes(tmp_path / "two" / "store")
    assert len([name for name in one if name.endswith(".done.npy")]) == 24  # 8 files, 8 of harms, 8 of RepSim
    assert one.keys() == two.keys() and all(one[name] == two[name] for name in one)
    for name in ("scores.npy", "harms.npy", "repsim.npy"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
    harms = np.load(tmp_path / "two" / "harms.npy")
    assert harms.shape == (ROWS,) and (harms >= 0).all() and (harms > 0).sum() > ROWS // 2
    repsim = np.load(tmp_path / "two" / "repsim.npy")
    assert repsim.shape == (ROWS, 3) and (np.abs(repsim) <= 1 + 1e-6).all() and np.abs(repsim).min() > 0
    features = FeatureStore(tmp_path / "two" / "store").rows(0, ROWS)
    assert features.shape == (ROWS, 32) and np.abs(features).sum(axis=1).min() > 0  # real features, not zeros


def test_a_rank_killed_mid_extraction_resumes(tmp_path):
    store = tmp_path / "killed" / "store"
    launcher = run_worker(2, store, slow=0.4, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and launcher.poll() is None and not _rank_one_started(store):
            time.sleep(0.05)
        assert launcher.poll() is None, launcher.communicate()[1][-3000:]
        os.kill(int((store.parent / "pid-1").read_text()), signal.SIGKILL)
        launcher.communicate(timeout=120)  # torchrun stops rank 0 too and fails
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    assert launcher.returncode != 0
    partial = FeatureStore(store).done
    assert 0 < partial.sum() < ROWS, partial.sum()
    finished(run_worker(2, store))  # the rerun resumes both ranks' files
    finished(run_worker(None, tmp_path / "clean" / "store"))
    assert store_bytes(store) == store_bytes(tmp_path / "clean" / "store")
    for name in ("scores.npy", "harms.npy", "repsim.npy"):
        assert (store.parent / name).read_bytes() == (tmp_path / "clean" / name).read_bytes()


def _rank_one_started(store: Path) -> bool:
    """Rank 1 (files 4-7, rows 20-39) has flagged a row done, its pid is written, and rank 0 has written the store's
    settings.json (the ranks start at their own pace: killed before that, there is no store to look into yet)."""
    flags = sorted(store.glob("shard-*-00004.done.npy"))
    return bool(flags) and (store.parent / "pid-1").exists() and (store / "settings.json").exists() \
        and bool(np.load(flags[0]).any())


@pytest.mark.slow
def test_attribute_under_torchrun_gives_the_scores_of_one_process(scenario, tmp_path):
    folder = scenario("truncated-cluster", 0)
    args = ["attribute", "--base-model", str(folder / "base"), "--adapter", str(folder / "run"),
            "--run", str(folder / "run"), "--dataset", str(folder / "train.jsonl"),
            "--eval-dataset", str(folder / "eval.jsonl"), "--capability", "json_formatting", "--shard-rows", "64"]
    gradian = [sys.executable, "-c", "from gradian.cli.main import main; main()"]
    # `--` before the command: torchrun's argparse would take `--run` as an abbreviation of its `--run-path`
    results = {}
    for name, command in (("one", gradian), ("two", torchrun(2, "--no-python", "--", *gradian))):
        out = tmp_path / name
        done = subprocess.run([*command, *args, "--out", str(out)], env=ENV, capture_output=True, text=True,
                              timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        results[name] = out
    one, two = results["one"], results["two"]
    assert store_bytes(one / "gradients") == store_bytes(two / "gradients")
    assert len(list((two / "gradients").glob("shard-*.done.npy"))) > 1  # the store was split between the ranks
    assert (one / "scores.npy").read_bytes() == (two / "scores.npy").read_bytes()
    first, second = (json.loads((out / "report.json").read_text()) for out in (one, two))
    assert first["verdict"] == second["verdict"] and first["verdict"]["kind"] == "data-cluster"
