"""`gradian verify` on the scenario world: real retrains must bring the capability back where the answer is right.

Each retrain is a real TRL SFTTrainer + PEFT run of the tiny base (seconds to minutes on one thread), measured on the
report's own eval prompts. The goals come from the issues: removing the named rows of a planted cluster by zero
weight recovers ≥ 80% of the lost capability while random removal of the same size recovers ≤ 20%, and the paired
tests confirm it; the fix of pad == eos recovers ≥ 80%; a null run shows no change beyond seed noise; a retrain
killed with SIGKILL resumes.
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
from filelock import FileLock

from gradian.cli.main import cli, register_commands
from gradian.scenarios.base import one_thread
from gradian.verify import VerifySettings, verify
from gradian.verify.retrain import MARKER, ORDER, PROGRESS
from gradian.verify.verification import verification_schema

pytestmark = pytest.mark.slow  # attributes three scenarios and retrains each a few times (minutes on 2 cores)


def run_verify(report: Path, **options) -> dict:
    with one_thread():  # a tiny model under CPU contention trains ~10x faster on one thread
        return verify(VerifySettings(report=str(report), device="cpu", **options))


@pytest.fixture(scope="module")
def truncated_report(attributed_copy, tmp_path_factory):
    """The default report of truncated-cluster, copied: verify writes its retrains and verification into it."""
    return attributed_copy("truncated-cluster", tmp_path_factory.mktemp("truncated") / "report")


@pytest.fixture(scope="session")
def verified(attributed, tmp_path_factory, worker_id):
    """The truncated-cluster report after `verify --controls 2`, made once per test run and shared by its workers
    (a lock, as `attributed`): each worker that runs this module would otherwise retrain the same six runs."""
    base = tmp_path_factory.getbasetemp()
    out = (base.parent if worker_id != "master" else base) / "verified" / "truncated-cluster"
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{out}.lock"):
        if not (out / "verified.done").exists():
            shutil.rmtree(out, ignore_errors=True)
            shutil.copytree(attributed("truncated-cluster"), out, ignore=shutil.ignore_patterns("attributed.done"))
            run_verify(out, controls=2)
            (out / "verified.done").touch()
    return out


@pytest.fixture(scope="module")
def truncated(verified, tmp_path_factory):
    """A private copy of `verified` (retrains included): the tests below verify again into it."""
    report = tmp_path_factory.mktemp("verified") / "report"
    shutil.copytree(verified, report, ignore=shutil.ignore_patterns("verified.done"))
    return report, json.loads((report / "verification.json").read_text())


def test_removing_the_culprits_recovers_and_random_removal_does_not(truncated):
    report, verification = truncated
    culprits = json.loads((report / "report.json").read_text())["verdict"]["culprit_ids"]
    assert verification["removed"] == len(culprits) > 0
    assert verification["scheme"] == "zero-weight"
    assert verification["recovery"] >= 0.8, verification["recovery"]
    assert verification["random_recovery"] <= 0.2, verification["random_recovery"]
    assert verification["status"] == "confirmed", verification["status_reason"]
    assert [t["against"] for t in verification["tests"]] == ["fine-tuned", "control-1", "control-2"]
    assert all(t["beats"] for t in verification["tests"]), verification["tests"]
    kinds = sorted(r["kind"] for r in verification["retrains"])
    assert kinds == ["control", "control", "dropped", "removal", "reseeded", "topic"]
    rows = {r["name"]: r["rows"] for r in verification["retrains"]}
    zero = {r["name"]: r["zero_weight"] for r in verification["retrains"]}
    cleaned = (report / "train.cleaned.jsonl").read_text().splitlines()
    assert rows["without-culprits"] == len(cleaned) == rows["control-1"] == rows["control-2"]
    assert rows["without-culprits-dropped"] == len(cleaned) and zero["without-culprits-dropped"] == 0
    assert zero["without-culprits"] == zero["control-1"] == zero["same-category"] == len(culprits)
    assert rows["reseeded"] == len(cleaned) + len(culprits)
    steps = {r["name"]: r["global_step"] for r in verification["retrains"]}
    assert steps["without-culprits"] == steps["control-1"] == steps["reseeded"] > steps["without-culprits-dropped"]
    orders = {name: json.loads((report / "verify" / name / ORDER).read_text())
              for name in ("without-culprits", "control-1", "same-category")}
    assert orders["without-culprits"] == orders["control-1"] == orders["same-category"], "zero weight keeps the order"
    assert verification["topic"]["source"] == "category" and verification["topic"]["pool"] > len(culprits)


def test_verification_validates_against_its_schema_and_draws_its_page(truncated):
    report, verification = truncated
    jsonschema.validate(verification, verification_schema())
    assert verification["schema_version"] == verification_schema()["properties"]["schema_version"]["const"]
    page = (report / "verification.html").read_text()
    assert "What you will see when you retrain" in page and "without-culprits-dropped" in page
    assert "### Verification: confirmed" in (report / "verification.md").read_text()


def test_verification_is_written_and_shown(truncated):
    report, verification = truncated
    assert json.loads((report / "verification.json").read_text()) == verification
    rewritten = json.loads((report / "report.json").read_text())
    assert rewritten["verification"] == verification
    assert "examples" not in rewritten  # the per-row results stay in examples.jsonl
    markdown = (report / "report.md").read_text()
    assert "### Verification: confirmed" in markdown and markdown.rstrip().endswith("</sub>")
    html = (report / "report.html").read_text()
    assert 'id="verification-chart"' in html and "without-culprits" in html
    for row in verification["retrains"]:
        assert (report / "verify" / row["name"] / MARKER).is_file()
        assert (report / "verify" / row["name"] / "adapter_model.safetensors").is_file()


def test_a_finished_retrain_is_reused(truncated):
    report, verification = truncated
    again = run_verify(report, controls=2)
    assert all(row["reused"] for row in again["retrains"])
    assert [r["rate"] for r in again["retrains"]] == [r["rate"] for r in verification["retrains"]]


def test_groups_check_the_ranking_by_retraining(truncated):
    report, _ = truncated
    verification = run_verify(report, controls=2, groups=2)
    groups = verification["groups"]
    assert [g["harm_rank"] for g in groups] == [1, 2]
    assert groups[0]["harm_share"] >= groups[1]["harm_share"]
    assert groups[0]["recovery_rank"] == 1, groups  # the group ranked most harmful recovers most when removed
    assert groups[0]["recovery"] >= 0.8, groups
    reused = {r["name"]: r["reused"] for r in verification["retrains"]}
    assert reused["without-culprits"] and reused["control-1"] and not reused["group-1"]
    assert all(r["scheme"] == "zero-weight" for r in verification["retrains"] if r["kind"] == "group")


def test_the_pad_token_fix_recovers(attributed_copy, tmp_path):
    report = attributed_copy("pad-eos", tmp_path / "report")
    assert json.loads((report / "report.json").read_text())["verdict"]["kind"] == "setup"
    verification = run_verify(report)
    assert verification["fix"]["changes"] == {"pad_token": "<pad>"}
    assert verification["fix_recovery"] >= 0.8, verification["fix_recovery"]
    assert verification["status"] == "confirmed", verification["status_reason"]


def test_a_null_run_shows_no_change_beyond_seed_noise(attributed_copy, tmp_path):
    report = attributed_copy("null", tmp_path / "report")
    assert json.loads((report / "report.json").read_text())["verdict"]["kind"] == "no-regression"
    verification = run_verify(report, controls=2)  # two random removals and the reseeded run: no change in any
    assert not any(row["beyond_seed_noise"] for row in verification["retrains"]), verification["retrains"]
    assert not verification["reseeded_regression"]["significant"]
    assert verification["status"] == "confirmed", verification["status_reason"]


def step_of(staging: Path) -> int:
    try:
        return json.loads((staging / PROGRESS).read_text())["step"]
    except (OSError, ValueError, KeyError):
        return -1


def test_a_retrain_killed_mid_training_resumes(truncated_report, tmp_path):
    source = truncated_report
    report = tmp_path / "report"
    shutil.copytree(source, report, ignore=shutil.ignore_patterns("verify", "gradients*", "verification.json"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-c", "from gradian.cli.main import main; main()", "verify", "--report", str(report),
               "--controls", "0", "--max-steps", "60", "--device", "cpu"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    staging = report / "verify" / "without-culprits.partial"
    deadline = time.monotonic() + 600
    while step_of(staging) < 5 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert process.poll() is None and 5 <= step_of(staging) < 60, "the retrain was not caught mid-training"
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (report / "verify" / "without-culprits" / MARKER).exists()
    verification = run_verify(report, controls=0, max_steps=60)
    assert not staging.exists()
    assert verification["capped"] and all(r["capped"] and r["global_step"] == 60 for r in verification["retrains"])
    assert (report / "verify" / "without-culprits" / ORDER).is_file()
    assert not any(r["reused"] for r in verification["retrains"])


def test_a_missing_base_model_is_one_sentence_and_exit_2(truncated_report, tmp_path, cli_runner):
    source = truncated_report
    report = json.loads((source / "report.json").read_text())
    report["settings"]["base_model"] = str(tmp_path / "gone")
    (tmp_path / "report.json").write_text(json.dumps(report))
    register_commands()
    result = cli_runner.invoke(cli, ["verify", "--report", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "base model is missing" in result.output and "Traceback" not in result.output


def test_a_report_of_another_schema_is_one_sentence_and_exit_2(truncated_report, tmp_path, cli_runner):
    report = json.loads((truncated_report / "report.json").read_text())
    report["schema_version"] = "1.0"  # written by an older Gradian: its report.md/html could not be rendered again
    (tmp_path / "report.json").write_text(json.dumps(report))
    register_commands()
    result = cli_runner.invoke(cli, ["verify", "--report", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "report schema 1.0" in result.output and "rerun `gradian attribute`" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "verify").exists()
