"""Faults: a run killed with -9 resumes to bit-identical features; an unwritable or busy --out gives one sentence.

The kill test runs tests/bad_inputs/extract_worker.py in a subprocess and kills it (SIGKILL) once some rows
are flagged done; the same worker code then resumes that store in this process and computes a clean store
from scratch; the two stores' features must be byte-equal.
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
import torch

from bad_inputs import extract_worker
from bad_inputs.corpus import attribute_args
from bad_inputs.fixtures import assert_no_traceback, assert_one_line_error, gradian, workspace  # noqa: F401
from gradian.gradients.store import FeatureStore
from gradian.lock import LOCK_NAME, output_lock

WORKER = Path(__file__).parents[1] / "bad_inputs" / "extract_worker.py"
ROWS = 40


def _worker(rows: int, slow: float, *stores: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.Popen([sys.executable, str(WORKER), str(rows), str(slow), *map(str, stores)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _done_rows(store: Path) -> int:
    flags = list(store.glob("shard-*.done.npy"))
    return int(np.load(flags[0]).sum()) if flags else 0


def test_fault_kill_9_during_extraction_resumes_bit_identical(tmp_path):
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    process = _worker(ROWS, 0.3, killed)
    try:
        deadline = time.monotonic() + 120
        while _done_rows(killed) < 4 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process.poll() is None, process.communicate()[1][-3000:]
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == -signal.SIGKILL
    partial = _done_rows(killed)
    assert 0 < partial < ROWS, partial  # killed mid-way: some rows flagged, some not

    threads = torch.get_num_threads()
    try:  # resume here, then a clean run, with the worker's settings (one thread: same reduction order)
        extract_worker.main(ROWS, 0.0, [killed, clean])
    finally:
        torch.set_num_threads(threads)
    after, reference = FeatureStore(killed), FeatureStore(clean)
    assert after.complete and reference.complete
    assert after.ids == reference.ids
    assert after.rows(0, ROWS).tobytes() == reference.rows(0, ROWS).tobytes()
    assert np.abs(reference.rows(0, ROWS)).sum(axis=1).min() > 0  # real features, not zeros on both sides


def test_fault_out_under_a_file_attribute(workspace, gradian, tmp_path):  # noqa: F811
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = gradian(attribute_args(workspace, blocker / "sub"))
    assert_one_line_error(result, "a-file/sub")


def test_fault_out_under_a_file_diagnose(workspace, gradian, tmp_path):  # noqa: F811
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = gradian(["diagnose", "--dataset", workspace.dataset, "--base-model", workspace.model, "--json",
                      "--out", blocker / "sub"])
    assert_one_line_error(result, "a-file/sub")


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores folder permissions")
def test_fault_out_read_only_folder(workspace, gradian, tmp_path):  # noqa: F811
    out = tmp_path / "locked"
    out.mkdir()
    out.chmod(0o500)
    try:
        result = gradian(attribute_args(workspace, out))
    finally:
        out.chmod(0o700)
    assert_one_line_error(result, "locked")


def test_fault_lock_refuses_a_second_writer(tmp_path):
    with output_lock(tmp_path) as path:
        assert path.read_text().split()[0] == str(os.getpid())
        with pytest.raises(Exception) as caught, output_lock(tmp_path):
            pass
        assert "another Gradian run" in str(caught.value) and str(tmp_path) in str(caught.value)
        assert path.read_text().split()[0] == str(os.getpid())  # the refused run left the holder's lock alone
    with output_lock(tmp_path):  # released: the next run takes it
        pass


def test_fault_lock_of_a_killed_run_is_taken_over(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    import socket

    (tmp_path / LOCK_NAME).write_text(f"{dead.stdout.strip()} {socket.gethostname()}\n")
    with output_lock(tmp_path) as path:
        assert path.read_text().split()[0] == str(os.getpid())


def test_fault_attribute_refuses_a_busy_out(workspace, gradian, tmp_path):  # noqa: F811
    """A live run holds the lock (this test process): a second attribute into that --out stops in one sentence."""
    out = tmp_path / "out"
    with output_lock(_mkdir(out)):
        result = gradian(attribute_args(workspace, out))
    assert_one_line_error(result, "another Gradian run")
    assert not (out / "report.json").exists()


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def test_fault_two_attribute_runs_into_one_out(workspace, tmp_path):  # noqa: F811
    """Two runs started at once into the same --out: each finishes or refuses in one sentence; what is left is whole."""
    out = tmp_path / "out"
    args = [sys.executable, "-c", "from gradian.cli.main import main; main()",
            *map(str, attribute_args(workspace, out, extra=("--force",)))]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runs = [subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    answers = [run.communicate(timeout=300) for run in runs]
    codes = sorted(run.returncode for run in runs)
    for (_, err), run in zip(answers, runs, strict=True):
        assert "Traceback" not in err, err[-3000:]
        if run.returncode == 2:
            assert err.rstrip("\n").split("\n")[-1].startswith("Error: "), err[-2000:]
    assert codes in ([0, 0], [0, 2]), (codes, answers[0][1][-1500:], answers[1][1][-1500:])
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"]["kind"]
    store = FeatureStore(out / "gradients")
    assert store.complete and np.isfinite(store.rows(0, store.n_rows)).all()
    assert not list(out.rglob("*.tmp")), "a temporary file was left behind"


def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: max(1, path.stat().st_size // 2)])


DAMAGE = {
    "generations-truncated": lambda out: _cut(out / "generations.jsonl"),
    "generations-settings-garbage": lambda out: (out / "generations.settings.json").write_text("{not json"),
    "store-settings-truncated": lambda out: _cut(out / "gradients" / "settings.json"),
    "store-ids-garbage": lambda out: (out / "gradients" / "ids.json").write_bytes(b"\xff\x00"),
    "shard-truncated": lambda out: _cut(next((out / "gradients").glob("shard-*[0-9].npy"))),
    "done-flags-garbage": lambda out: next((out / "gradients").glob("shard-*.done.npy")).write_bytes(b"garbage"),
    "report-json-truncated": lambda out: _cut(out / "report.json"),
}


@pytest.fixture(scope="module")
def finished_out(workspace, tmp_path_factory):  # noqa: F811
    """An --out folder from a finished attribute run (every stage, --force)."""
    from click.testing import CliRunner

    from gradian.cli.main import cli, register_commands

    if not cli.commands:
        register_commands()
    out = tmp_path_factory.mktemp("finished") / "out"
    result = CliRunner().invoke(cli, attribute_args(workspace, out, extra=("--force",)))
    assert result.exit_code == 0, result.output[-2000:]
    return out


DAMAGE_BUGS: dict[str, str] = {}  # damage a rerun cannot yet recover from (none known)


@pytest.mark.parametrize("damage", [
    pytest.param(d, id=f"fault-damaged-out-{d}",
                 marks=[pytest.mark.xfail(strict=True, reason=DAMAGE_BUGS[d])] if d in DAMAGE_BUGS else [])
    for d in sorted(DAMAGE)])
def test_fault_rerun_over_a_damaged_out(damage, finished_out, workspace, gradian, tmp_path):  # noqa: F811
    """A crash or a full disk left a damaged artifact: a rerun recomputes it, or says which file, never a traceback."""
    import shutil

    out = tmp_path / "out"
    shutil.copytree(finished_out, out)
    DAMAGE[damage](out)
    result = gradian(attribute_args(workspace, out, extra=("--force",)))
    if result.exit_code == 2:
        assert_one_line_error(result, str(out))
    else:
        assert_no_traceback(result)
        assert result.exit_code == 0, result.output[-2000:]
        assert json.loads((out / "report.json").read_text())["verdict"]["kind"]
        assert FeatureStore(out / "gradients").complete
