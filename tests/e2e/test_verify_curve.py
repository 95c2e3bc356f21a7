"""`gradian verify --curve` on the truncated-cluster scenario: the ranking's top k rows at zero weight for each k,
beside random sets, resumable after SIGKILL; and bad input (no ranking, no generations) is one sentence and exit 2.

The retrains are capped at a few steps: what is tested here is the curve's plan, its resumption and its page, not
its recovery (tests/e2e/test_verify.py measures recovery on full retrains).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest
from test_verify import run_verify, step_of

from gradian.cli.main import cli, register_commands
from gradian.verify.retrain import MARKER
from gradian.verify.sets import curve_sizes
from gradian.verify.verification import verification_schema

pytestmark = pytest.mark.slow  # attributes one scenario and runs a dozen short retrains (minutes on 2 cores)

STEPS = 6


@pytest.fixture(scope="module")
def curve_report(attributed):
    return attributed("truncated-cluster")  # read only: each test copies it


def test_a_curve_killed_mid_retrain_resumes(curve_report, tmp_path):
    report = tmp_path / "report"
    shutil.copytree(curve_report, report, ignore=shutil.ignore_patterns("verify", "gradients*", "verification.*"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-c", "from gradian.cli.main import main; main()", "verify", "--report", str(report),
               "--controls", "1", "--curve", "--max-steps", str(STEPS), "--device", "cpu"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    staging = report / "verify" / "top-2pct.partial"
    deadline = time.monotonic() + 1800
    while step_of(staging) < 2 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.poll() is None and 2 <= step_of(staging) < STEPS, "the curve was not caught mid-retrain"
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert (report / "verify" / "top-1pct" / MARKER).is_file() and not (report / "verify" / "top-2pct").exists()

    verification = run_verify(report, controls=1, curve=True, max_steps=STEPS)
    assert not staging.exists()
    jsonschema.validate(verification, verification_schema())
    curve = verification["curve"]
    reused = {r["name"]: r["reused"] for r in curve["retrains"]}
    assert reused["top-1pct"] and reused["top-1pct-random-1"] and not reused["top-2pct"]
    n_rows = json.loads((report / "report.json").read_text())["n_examples"]
    assert [(p["share"], p["size"]) for p in curve["points"]] == curve_sizes(n_rows)
    assert [p["size"] for p in curve["points"]] == [4, 8, 20, 40, 80]
    assert all(r["zero_weight"] == next(p["size"] for p in curve["points"] if r["name"].startswith(p["name"]))
               and r["global_step"] == STEPS for r in curve["retrains"])
    assert curve["ranking"] == "rank_score"
    page = (report / "verification.html").read_text()
    assert 'id="recovery-curve"' in page and page.count("<circle") == 2 * (len(curve["points"]) + 1)
    assert all(not r["name"].startswith("top-") for r in verification["retrains"]), "the curve stays in `curve`"


def test_a_curve_without_a_ranking_is_one_sentence_and_exit_2(curve_report, tmp_path, cli_runner):
    shutil.copytree(curve_report, tmp_path / "report", ignore=shutil.ignore_patterns("verify", "gradients*"))
    rows = [json.loads(line) for line in (tmp_path / "report" / "examples.jsonl").read_text().splitlines()]
    keep = ("id", "cluster", "flags", "culprit")  # as attribute writes a report where attribution did not run
    (tmp_path / "report" / "examples.jsonl").write_text(
        "".join(json.dumps({**{k: row[k] for k in keep}, "effect": None}) + "\n" for row in rows))
    register_commands()
    result = cli_runner.invoke(cli, ["verify", "--report", str(tmp_path / "report"), "--curve"])
    assert result.exit_code == 2, result.output
    assert "no per-row ranking" in result.output and "without --curve" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "report" / "verify").exists()


def test_a_report_without_its_generations_is_one_sentence_and_exit_2(curve_report, tmp_path, cli_runner):
    shutil.copytree(curve_report, tmp_path / "report", ignore=shutil.ignore_patterns("verify", "gradients*"))
    (tmp_path / "report" / "generations.jsonl").unlink()
    register_commands()
    result = cli_runner.invoke(cli, ["verify", "--report", str(tmp_path / "report")])
    assert result.exit_code == 2, result.output
    assert "generations.jsonl" in result.output and "Traceback" not in result.output
    assert Path(tmp_path / "report" / "report.json").is_file() and not (tmp_path / "report" / "verify").exists()

