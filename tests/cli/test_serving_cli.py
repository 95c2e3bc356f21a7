"""`gradian attribute --served-outputs` on the tiny world: a drop only the served answers show is `serving`, served
answers equal to Gradian's own change nothing, and a bad served file is one sentence and exit code 2."""

from __future__ import annotations

import json
import shutil

import jsonschema
import pytest

from bad_inputs.corpus import attribute_args
from bad_inputs.fixtures import assert_no_traceback, assert_one_line_error, gradian, workspace  # noqa: F401
from bad_inputs.workspace import eval_rows, write_jsonl
from gradian.report.schema_doc import report_schema

N_EVAL = 8  # McNemar needs 6 answers broken and none fixed to call a drop significant at 95%


@pytest.fixture(scope="module")
def world(workspace, tmp_path_factory):  # noqa: F811
    """The tiny world with eight eval rows, and the report `attribute` writes without served answers."""
    folder = tmp_path_factory.mktemp("serving")
    eval_dataset = write_jsonl(folder / "eval.jsonl", eval_rows(N_EVAL))
    return folder, eval_dataset


def run(gradian, workspace, out, eval_dataset, *extra):  # noqa: F811
    result = gradian(attribute_args(workspace, out, eval_dataset=eval_dataset, extra=("--json", *extra)))
    assert_no_traceback(result)
    assert result.exit_code == 0, result.output[-3000:]
    return json.loads((out / "report.json").read_text(encoding="utf-8"))


def served_file(path, answers):
    return write_jsonl(path, [{"id": i, "output": text} for i, text in answers.items()])


def test_served_answers_that_fail_where_gradians_path_does_not_get_the_serving_verdict(world, workspace, gradian):  # noqa: F811
    folder, eval_dataset = world
    references = {row["id"]: row["completion"] for row in eval_rows(N_EVAL)}
    base = served_file(folder / "served-base.jsonl", references)  # the base as served answers every row right
    tuned = served_file(folder / "served.jsonl", {i: text[:5] for i, text in references.items()})  # cut short
    export = folder / "export"
    shutil.copytree(workspace.model, export)
    (export / "generation_config.json").write_text(json.dumps({"eos_token_id": 3, "max_new_tokens": 2}))
    report = run(gradian, workspace, folder / "out", eval_dataset, "--served-outputs", tuned,
                 "--served-base-outputs", base, "--served-model", export)
    assert not report["regression"]["significant"]  # Gradian's own path: no regression
    served = report["served"]
    assert served["base_source"] == "served" and served["regression"]["significant"]
    assert served["regression"]["base_rate"] == 1.0 and served["regression"]["finetuned_rate"] == 0.0
    assert served["served_only_delta"] == pytest.approx(-1.0 - report["regression"]["delta"])
    assert report["verdict"]["kind"] == "serving"
    assert report["verdict"]["culprit_ids"] == []
    limit = next(d for d in served["differences"] if d["rule"] == "max_new_tokens")
    assert limit["evidence"]["max_new_tokens"] == 2 and limit["evidence"]["longest_reference"] > 2
    assert "max_new_tokens" in [c["name"] for c in report["verdict"]["causes"]]
    assert "raise max_new_tokens in generation_config.json" in report["verdict"]["next_action"]
    assert "| as served | 100.0% | 0.0% | -100.0%" in (folder / "out" / "report.md").read_text(encoding="utf-8")
    jsonschema.Draft202012Validator(report_schema()).validate(report)
    # verify retrains nothing: removing training rows cannot move a drop the serving path causes
    refused = gradian(["verify", "--report", folder / "out"])
    assert_one_line_error(refused, "report.json: has the verdict `serving`: the drop happens in the serving path")
    assert f"measure the served answers again: {report['verdict']['next_action'].rstrip('.')}." in refused.output
    assert not (folder / "out" / "verify").exists() and not (folder / "out" / "verification.json").exists()
    # attribute --verify answers with the report and says why verify did not run (the cached stages are reused)
    again = gradian(attribute_args(workspace, folder / "out", eval_dataset=eval_dataset,
                                   extra=("--verify", "--served-outputs", tuned, "--served-base-outputs", base,
                                          "--served-model", export)))
    assert again.exit_code == 0, again.output[-3000:]
    assert "Verdict: serving" in again.output and "verify: not run" in again.output
    assert not (folder / "out" / "verify").exists() and not (folder / "out" / "verification.json").exists()


def test_served_answers_equal_to_gradians_own_leave_the_verdict_unchanged(world, workspace, gradian):  # noqa: F811
    folder, eval_dataset = world
    plain = run(gradian, workspace, folder / "plain", eval_dataset)
    own = [json.loads(line) for line in (folder / "plain" / "generations.jsonl").read_text().splitlines()]
    tuned = served_file(folder / "own.jsonl", {row["id"]: row["finetuned_output"] for row in own})
    report = run(gradian, workspace, folder / "own", eval_dataset, "--served-outputs", tuned)
    served = report["served"]
    assert served["base_source"] == "gradian"
    assert {k: served["regression"][k] for k in ("base_rate", "finetuned_rate", "delta", "p_value")} == \
        {k: plain["regression"][k] for k in ("base_rate", "finetuned_rate", "delta", "p_value")}
    assert served["served_only_delta"] == 0.0
    assert report["verdict"]["kind"] == plain["verdict"]["kind"] != "serving"
    assert report["verdict"]["summary"] == plain["verdict"]["summary"]


def test_served_answers_running_past_the_fine_tunes_own_eos_name_the_stop_tokens(world, workspace, gradian):  # noqa: F811
    folder, eval_dataset = world
    plain = run(gradian, workspace, folder / "plain-stop", eval_dataset)
    own = [json.loads(line) for line in (folder / "plain-stop" / "generations.jsonl").read_text().splitlines()]
    assert all(row["finetuned_stopped"] and row["finetuned_ids"][-1] == 3 for row in own)  # </s>, id 3
    references = {row["id"]: row["completion"] for row in eval_rows(N_EVAL)}
    base = served_file(folder / "stop-base.jsonl", references)
    tuned = served_file(folder / "stop.jsonl", {row["id"]: row["finetuned_output"] + " please help" for row in own})
    export = folder / "export-stop"
    shutil.copytree(workspace.model, export)
    (export / "generation_config.json").write_text(json.dumps({"eos_token_id": [0]}))  # <pad>, not the trained </s>
    report = run(gradian, workspace, folder / "stop-out", eval_dataset, "--served-outputs", tuned,
                 "--served-base-outputs", base, "--served-model", export)
    assert plain["verdict"]["kind"] != "serving" and report["verdict"]["kind"] == "serving"
    stop = next(d for d in report["served"]["differences"] if d["rule"] == "stop_token")
    ran_on = [row["id"] for row in own if row["finetuned_output"].strip()]  # an empty own answer has nothing to run past
    assert stop["evidence"] == {"n_rows": len(ran_on), "example_id": ran_on[0], "trained_eos_id": 3,
                                "served_eos_ids": [0]}
    assert "add the trained end token 3 to generation_config.json's eos_token_id" in report["verdict"]["next_action"]


@pytest.mark.parametrize(("name", "content", "names"), [
    ("unknown-id", '{"id": "e0", "output": "x"}\n{"id": "nope", "output": "y"}\n', "unknown-id.jsonl:2:"),
    ("missing-row", '{"id": "e0", "output": "x"}\n', "missing-row.jsonl: 3 eval row(s) have no served answer"),
    ("empty", "", "empty.jsonl: the file holds no served answers"),
    ("invalid-json", '{"id": "e0", "output": "x"}\n{"id": "e1", \n', "invalid-json.jsonl:2: this line is not valid"),
])
def test_a_bad_served_file_is_one_sentence_naming_the_file_and_line(workspace, gradian, name, content,  # noqa: F811
                                                                   names):
    scratch = workspace.scratch(f"served-{name}")
    path = scratch / f"{name}.jsonl"
    path.write_text(content, encoding="utf-8")
    result = gradian(attribute_args(workspace, scratch / "out", extra=("--served-outputs", path)))
    assert_one_line_error(result, names)


def test_a_missing_served_model_folder_is_one_sentence_naming_it(workspace, gradian):  # noqa: F811
    scratch = workspace.scratch("served-model-missing")
    served = served_file(scratch / "served.jsonl", {row["id"]: "x" for row in eval_rows(4)})
    result = gradian(attribute_args(workspace, scratch / "out",
                                    extra=("--served-outputs", served, "--served-model", scratch / "export-gone")))
    assert_one_line_error(result, "export-gone: no such folder")
