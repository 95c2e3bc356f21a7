"""report.json and examples.jsonl validate against the JSON Schema shipped in the package; the doc is generated."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from test_report import NOISE, run  # noqa: F401 - the report fixture

from gradian.report.rows import read_examples
from gradian.report.schema import SCHEMA_VERSION, build_report
from gradian.report.schema_doc import render, report_schema
from gradian.report.writers import write_report
from gradian.verdict import decide


def validator(definition: str | None = None) -> jsonschema.Draft202012Validator:
    schema = report_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    if definition is not None:
        schema = {**schema, "$ref": f"#/$defs/{definition}", "properties": {}, "required": []}
    return jsonschema.Draft202012Validator(schema)


def test_a_data_cluster_report_and_its_rows_validate(run):  # noqa: F811
    written = write_report(run["out"], run["report"], run["examples"], run["rows"])
    report = json.loads(written["report.json"].read_text(encoding="utf-8"))
    validator().validate(report)
    assert report["schema_version"] == SCHEMA_VERSION == report_schema()["properties"]["schema_version"]["const"]
    rows = validator("example")
    lines = read_examples(run["out"])
    assert len(lines) == report["n_examples"] > 0
    for line in lines:
        rows.validate(line)


def test_a_refusal_validates_and_a_broken_report_does_not(run, tmp_path):  # noqa: F811
    verdict = decide(NOISE, [], None, None, [e.id for e in run["examples"]])
    report = build_report(NOISE, verdict, [], run["examples"])
    validator().validate(json.loads(write_report(tmp_path / "refusal", report, run["examples"])["report.json"]
                                    .read_text(encoding="utf-8")))
    broken = {**run["report"], "verdict": {**run["report"]["verdict"], "kind": "maybe"}}
    with pytest.raises(jsonschema.ValidationError):
        validator().validate(broken)
    with pytest.raises(jsonschema.ValidationError):
        validator().validate({k: v for k, v in run["report"].items() if k != "clusters"})


def test_the_schema_doc_is_generated_from_the_schema():
    doc = (Path(__file__).parents[2] / "docs" / "report-schema.md").read_text(encoding="utf-8")
    assert doc == render(report_schema()), "regenerate: python -m gradian.report.schema_doc > docs/report-schema.md"
