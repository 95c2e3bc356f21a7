"""`fails_capability`: the measured capability applied to every training completion, as a per-row finding."""

from __future__ import annotations

import json

import pytest

from gradian.audit import diagnose
from gradian.audit.capability import CRITICAL_SHARE, target_text
from gradian.capabilities import get_capability
from gradian.cli.main import cli, register_commands
from gradian.data.examples import Example


def audit(folder, capability):
    return diagnose(folder / "train.jsonl", base_model=folder / "base", run=folder / "run", capability=capability)


def capability_findings(result):
    return [f for f in result.findings if f.check == "fails_capability"]


def test_format_cluster_flags_exactly_the_single_quote_rows(scenario):
    folder = scenario("format-cluster")
    truth = json.loads((folder / "truth.json").read_text())
    result = audit(folder, "json_formatting")
    (finding,) = capability_findings(result)
    assert finding.example_ids == truth["culprit_ids"]  # every planted row, no other, in dataset order
    culprits, rows = len(truth["culprit_ids"]), len(result.examples)
    assert finding.title.startswith(f"{culprits} of {rows} training completions fail json_formatting")
    assert finding.values["failing"] == culprits and finding.values["scored"] == rows
    assert finding.severity == ("critical" if culprits >= CRITICAL_SHARE * rows else "warning")
    assert finding.values["examples"][0]["id"] == truth["culprit_ids"][0]
    assert truth["culprit_ids"][0] in finding.fix


def test_null_run_has_no_capability_finding(scenario):
    assert capability_findings(audit(scenario("null"), "json_formatting")) == []


def test_capability_that_needs_a_reference_is_skipped(scenario):
    folder = scenario("format-cluster")
    assert get_capability("exact_match").needs_reference
    assert capability_findings(audit(folder, "exact_match")) == []
    assert capability_findings(audit(folder, "json_formatting:keys")) == []


def test_without_a_capability_the_check_is_silent(scenario):
    assert capability_findings(audit(scenario("format-cluster"), None)) == []


def test_target_text_is_what_the_row_teaches():
    plain = Example("1", 1, {"prompt": "p", "completion": ' {"a": 1}</s>'})
    chat = Example("2", 2, {"messages": [{"role": "user", "content": "p"}, {"role": "assistant", "content": "{}"}]})
    text = Example("3", 3, {"text": "all of it"})
    assert target_text(plain, "</s>") == '{"a": 1}'
    assert target_text(chat, "</s>") == "{}"
    assert target_text(text, "</s>") is None


def test_regex_capability_scores_targets_and_warns_below_the_critical_share(scenario):
    folder = scenario("null")
    rows = [json.loads(line) for line in (folder / "train.jsonl").read_text().splitlines()]
    # The rows whose answer has a "user" field fail ^(?!.*"user") : a capability scored without a reference.
    expected = [r["id"] for r in rows if '"user"' in r["completion"]]
    assert 0 < len(expected)
    (finding,) = capability_findings(audit(folder, 'regex:^(?!.*"user")'))
    assert finding.example_ids == expected
    share = len(expected) / len(rows)
    assert finding.severity == ("critical" if share >= CRITICAL_SHARE else "warning")


@pytest.fixture
def commands():
    register_commands()


def test_cli_capability_flag(scenario, cli_runner, commands, tmp_path):
    folder = scenario("format-cluster")
    truth = json.loads((folder / "truth.json").read_text())
    args = ["diagnose", "--dataset", str(folder / "train.jsonl"), "--base-model", str(folder / "base"),
            "--run", str(folder / "run")]
    result = cli_runner.invoke(cli, [*args, "--capability", "json_formatting", "--json", "--out", str(tmp_path)])
    payload = json.loads(result.output)
    (finding,) = [f for f in payload["findings"] if f["check"] == "fails_capability"]
    assert finding["example_ids"] == truth["culprit_ids"]
    markdown = (tmp_path / "findings.md").read_text()
    assert f"| `fails_capability` | {finding['title']} | {len(truth['culprit_ids'])} |" in markdown
    bad = cli_runner.invoke(cli, [*args, "--capability", "no_such_capability"])
    assert bad.exit_code == 2 and "unknown capability" in bad.output and "Traceback" not in bad.output
