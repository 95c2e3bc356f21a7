"""report.html in a real browser: headless Chromium opens it from disk, the page script runs with no console error,
the charts and the culprit table are in the DOM, and a screenshot is saved.

Skipped when Chromium is absent on a developer machine; a failure under CI (env CI set), where .ci/run installs
Debian's `chromium`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from test_report import run  # noqa: F401  (the synthetic run fixture)

from gradian.report.writers import write_report

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run"]


def chromium_binary() -> str:
    found = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail("chromium is not installed but CI is set; .ci/run must install Debian's chromium")
    pytest.skip("chromium not installed (apt-get install -y chromium); the browser test runs under CI")


def open_page(html: Path, profile: Path, *extra: str) -> subprocess.CompletedProcess:
    command = [chromium_binary(), *FLAGS, f"--user-data-dir={profile}", *extra, html.resolve().as_uri()]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def page(run, tmp_path):  # noqa: F811
    written = write_report(run["out"], run["report"], run["examples"])
    return written["report.html"], run


def test_page_loads_without_console_errors_and_shows_charts_and_culprits(page, tmp_path):
    html, run_data = page
    result = open_page(html, tmp_path / "profile", "--enable-logging=stderr", "--v=0", "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    console = [line for line in result.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
    assert console == []  # the page logs nothing; any console line is an error or a warning
    dom = result.stdout
    assert re.search(r'id="status"[^>]*>page ready<', dom), "the page's script did not run to the end"
    for chart in ("regression-chart", "effect-histogram", "cluster-map", "cluster-shares"):
        assert re.search(rf'<svg[^>]*id="{chart}"', dom), chart
    assert 'data-charts="4"' in dom
    assert dom.count('class="culprit-row"') == len(run_data["culprits"])
    assert f'data-rows="{len(run_data["culprits"])}"' in dom
    assert dom.count("<script") == 1  # the user's <script> stayed text
    assert "&lt;script&gt;alert(" in dom


def test_screenshot_is_saved(page, tmp_path):
    html, _ = page
    target = Path(os.environ.get("GRADIAN_SCREENSHOT_DIR", tmp_path)) / "report.png"
    target.parent.mkdir(parents=True, exist_ok=True)
    result = open_page(html, tmp_path / "profile", f"--screenshot={target}", "--window-size=1280,2000")
    assert result.returncode == 0, result.stderr[-2000:]
    data = target.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 20_000  # a blank page compresses to a few kB
