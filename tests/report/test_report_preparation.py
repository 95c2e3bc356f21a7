"""The report says which preparation produced the rows it audited and attributed: the trainer, its version, and
whether the trainer's own code ran (GradianCallback's preflight) or Gradian's port of it (`run.preparation`)."""

from __future__ import annotations

import json
from html import unescape

import pytest
import trl
from test_report_schema import validator

from bad_inputs.corpus import attribute_args, diagnose_args
from bad_inputs.fixtures import gradian, workspace  # noqa: F401
from gradian.data.setup import TrainingSetup, preparation


@pytest.mark.parametrize(("setup", "trainer_code", "text"), [
    (TrainingSetup(framework_version="0.19.1"), False, "rows as TRL 0.19.1 SFTTrainer prepares them (Gradian's port)"),
    (TrainingSetup(framework_version=">=0.17,<0.20"), False,
     "rows as TRL SFTTrainer >=0.17,<0.20 prepares them (Gradian's port)"),
    (TrainingSetup(), False, "rows as TRL SFTTrainer prepares them (Gradian's port, TRL version unknown)"),
    (TrainingSetup(framework="axolotl", framework_version="0.18.0"), False,
     "rows as axolotl 0.18.0 prepares them (Gradian's port)"),
    (TrainingSetup(framework="trl", framework_version="1.16.0", record="run/gradian_run.json"), False,
     "rows as TRL 1.16.0 SFTTrainer prepares them (Gradian's port, with the settings GradianCallback recorded)"),
    (TrainingSetup(framework="transformers", framework_version="5.25.0", record="run/gradian_run.json"), False,
     "rows as TRL SFTTrainer prepares them (Gradian's port, with the settings GradianCallback recorded); the run "
     "trained with transformers 5.25.0 Trainer on rows its own script prepared"),
    (TrainingSetup(framework="trl", framework_version="1.16.0"), True,
     "rows as recorded by GradianCallback: the running TRL 1.16.0 SFTTrainer's own tokens and collator labels"),
    (TrainingSetup(framework_version="0.19.1", prepared_by={"trainer_rows": 40, "trl_version": "1.16.0"}), False,
     "rows as TRL 0.19.1 SFTTrainer prepares them (TRL 1.16.0's own code, the run used TRL 0.19.1)"),
    (TrainingSetup(framework_version="1.16.0", prepared_by={"checked_rows": 40, "trl_version": "1.16.0"}), False,
     "rows as TRL 1.16.0 SFTTrainer prepares them (TRL 1.16.0's own code, string rows by Gradian's batched "
     "tokenization, checked equal to TRL's on their first rows)"),
    (TrainingSetup(prepared_by={"trainer_rows": 38, "port_rows": 2, "why": ["TRL refused them"],
                                "trl_version": "1.16.0"}), False,
     "rows as TRL SFTTrainer prepares them (TRL 1.16.0's own code, 2 rows by Gradian's port (TRL refused them), "
     "the run's TRL version unknown)"),
    (TrainingSetup(framework="axolotl", framework_version="0.18.0",
                   prepared_by={"port_rows": 40, "why": ["axolotl is not installed"]}), False,
     "rows as axolotl 0.18.0 prepares them (Gradian's port (axolotl is not installed))"),
    (TrainingSetup(framework="axolotl", framework_version="0.18.0",
                   prepared_by={"trainer_rows": 40, "axolotl_version": "0.19.0"}), False,
     "rows as axolotl 0.18.0 prepares them (axolotl 0.19.0's own config loader and prompt strategies, the run used "
     "axolotl 0.18.0)"),
], ids=["trl", "trl-range", "trl-unknown", "axolotl", "trl-recorded", "plain-trainer-recorded", "callback",
        "trl-code", "trl-code-checked", "trl-code-and-port", "axolotl-port", "axolotl-code"])
def test_preparation_names_trainer_version_and_whose_code_ran(setup, trainer_code, text):
    prepared = preparation(setup, trainer_code=trainer_code)
    assert prepared["text"] == text
    assert prepared["version"] == setup.framework_version
    prepared_by = setup.prepared_by or {}
    by_trl = prepared_by.get("trainer_rows", 0) + prepared_by.get("checked_rows", 0)
    ported = "trainer+port" if prepared_by.get("port_rows") else "trainer"
    assert prepared["code"] == ("trainer" if trainer_code else ported if by_trl else "gradian-port")


def test_attribute_writes_the_preparation_into_the_report(workspace, gradian, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    result = gradian(attribute_args(workspace, out))
    assert result.exit_code in (0, 1), result.output[-2000:]
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    validator().validate(report)
    text = (f"rows as TRL SFTTrainer prepares them (TRL {trl.__version__}'s own code, string rows by Gradian's batched "
            "tokenization, checked equal to TRL's on their first rows, the run's TRL version unknown)")
    rows = report["run"]["preparation"].pop("rows")
    assert report["run"]["preparation"] == {"trainer": "TRL SFTTrainer", "version": None, "code": "trainer",
                                            "text": text}
    assert rows["checked_rows"] > 0 and rows["port_rows"] == 0
    assert f"Training rows: {text}." in (out / "report.md").read_text(encoding="utf-8")
    html = unescape((out / "report.html").read_text(encoding="utf-8"))
    assert f'<p class="muted" id="preparation">Training rows: {text}.</p>' in html


def test_diagnose_says_how_the_rows_were_prepared(workspace, gradian):  # noqa: F811
    payload = json.loads(gradian(diagnose_args(workspace, workspace.dataset)).stdout)
    assert payload["preparation"]["code"] == "trainer" and payload["preparation"]["trainer"] == "TRL SFTTrainer"
