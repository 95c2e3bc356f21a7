"""Nothing Gradian writes is something it reads: every command refuses, before any work, an output path that is an
input (by path, symlink or hard link) or lies inside a folder it reads as a whole; exit code 2, the input unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from bad_inputs.corpus import attribute_args
from bad_inputs.fixtures import assert_one_line_error, gradian, snapshot, workspace  # noqa: F401
from gradian.errors import InputError
from gradian.guard import Read, inputs, refuse_overwrite
from gradian.stages.artifacts import ATTRIBUTE_WRITES


def _copy(source: Path, target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    (shutil.copytree if source.is_dir() else shutil.copyfile)(source, target)
    return target


def _refused(result, *names: str) -> None:
    assert_one_line_error(result, "Gradian would write")
    line = result.stderr.strip().splitlines()[-1]
    assert all(name in line for name in names), line


def test_attribute_refuses_a_dataset_named_like_its_examples_file(workspace, gradian, tmp_path):  # noqa: F811
    """`--dataset data/examples.jsonl --out data`: examples.jsonl is a file attribute writes."""
    dataset = _copy(workspace.dataset, tmp_path / "data" / "examples.jsonl")
    before = snapshot(tmp_path)
    result = gradian(attribute_args(workspace, tmp_path / "data", dataset=dataset))
    _refused(result, str(dataset), "--dataset", "choose another --out folder")
    assert snapshot(tmp_path) == before, "the refusal wrote or changed something"


def test_attribute_refuses_its_own_cleaned_file_as_the_dataset(workspace, gradian, tmp_path):  # noqa: F811
    dataset = _copy(workspace.dataset, tmp_path / "report" / "train.cleaned.jsonl")
    before = snapshot(tmp_path)
    result = gradian(attribute_args(workspace, tmp_path / "report", dataset=dataset))
    _refused(result, "train.cleaned.jsonl", "--dataset")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("option", ["--adapter", "--run", "--base-model"])
def test_attribute_refuses_an_out_inside_a_folder_it_reads_whole(option, workspace, gradian, tmp_path):  # noqa: F811
    folder = _copy({"--adapter": workspace.adapter, "--run": workspace.run, "--base-model": workspace.model}[option],
                   tmp_path / "folder")
    args = attribute_args(workspace, folder / "gradian", adapter=folder if option == "--adapter" else None,
                          model=folder if option == "--base-model" else None,
                          extra=("--run", str(folder)) if option == "--run" else ())
    before = snapshot(tmp_path)
    result = gradian(args)
    _refused(result, option, str(folder), "a folder it reads as a whole")
    assert snapshot(tmp_path) == before and not (folder / "gradian").exists()


def test_attribute_refuses_an_output_file_that_is_a_symlink_to_the_dataset(workspace, gradian, tmp_path):  # noqa: F811
    dataset = _copy(workspace.dataset, tmp_path / "data" / "train.jsonl")
    out = tmp_path / "out"
    out.mkdir()
    (out / "examples.jsonl").symlink_to(dataset)  # left there by an earlier step
    before = snapshot(dataset)
    result = gradian(attribute_args(workspace, out, dataset=dataset))
    _refused(result, str(out / "examples.jsonl"), str(dataset))
    assert snapshot(dataset) == before


def test_attribute_refuses_an_out_folder_that_is_a_symlink_to_the_data(workspace, gradian, tmp_path):  # noqa: F811
    dataset = _copy(workspace.dataset, tmp_path / "data" / "culprits.jsonl")
    (tmp_path / "out").symlink_to(tmp_path / "data", target_is_directory=True)
    result = gradian(attribute_args(workspace, tmp_path / "out", dataset=dataset))
    _refused(result, str(tmp_path / "out" / "culprits.jsonl"), str(dataset))


def test_attribute_refuses_an_output_file_hard_linked_to_the_eval_set(workspace, gradian, tmp_path):  # noqa: F811
    eval_set = _copy(workspace.eval_dataset, tmp_path / "data" / "eval.jsonl")
    out = tmp_path / "out"
    out.mkdir()
    os.link(eval_set, out / "report.md")
    before = snapshot(eval_set)
    result = gradian(attribute_args(workspace, out, eval_dataset=eval_set))
    _refused(result, str(out / "report.md"), "--eval-dataset", str(eval_set))
    assert snapshot(eval_set) == before


def test_extract_refuses_the_run_folder_as_out(workspace, gradian, tmp_path):  # noqa: F811
    run = _copy(workspace.run, tmp_path / "run")
    before = snapshot(run)
    result = gradian(["extract", "--base-model", workspace.model, "--adapter", run, "--dataset", workspace.dataset,
                      "--out", run, "--proj-dim", "16"])
    _refused(result, "--adapter", str(run))
    assert snapshot(run) == before


def test_diagnose_refuses_findings_over_the_config(workspace, gradian, tmp_path):  # noqa: F811
    config = tmp_path / "out" / "findings.json"
    config.parent.mkdir()
    config.write_text(json.dumps({"max_length": 64}))
    before = snapshot(tmp_path)
    result = gradian(["diagnose", "--dataset", workspace.dataset, "--base-model", workspace.model,
                      "--config", config, "--out", tmp_path / "out"])
    _refused(result, "--config", str(config))
    assert snapshot(tmp_path) == before


def test_diagnose_refuses_findings_hard_linked_into_the_run_folder(workspace, gradian, tmp_path):  # noqa: F811
    run = _copy(workspace.run, tmp_path / "run")
    (tmp_path / "out").mkdir()
    os.link(run / "trainer_state.json", tmp_path / "out" / "findings.md")
    before = snapshot(run)
    result = gradian(["diagnose", "--dataset", workspace.dataset, "--base-model", workspace.model, "--run", run,
                      "--out", tmp_path / "out"])
    _refused(result, "--run", str(run), "a folder it reads as a whole")
    assert snapshot(run) == before


def test_diagnose_writes_beside_an_input_it_does_not_overwrite(workspace, gradian, tmp_path):  # noqa: F811
    """Nesting alone is no clash: a dataset in the --out folder under a name diagnose does not write is read."""
    dataset = _copy(workspace.dataset, tmp_path / "data" / "train.jsonl")
    result = gradian(["diagnose", "--dataset", dataset, "--base-model", workspace.model, "--out", tmp_path / "data"])
    assert result.exit_code in (0, 1), result.output
    assert (tmp_path / "data" / "findings.json").is_file() and dataset.read_bytes() == workspace.dataset.read_bytes()


def test_verify_refuses_a_report_folder_inside_the_run_folder(workspace, gradian, tmp_path):  # noqa: F811
    from gradian.report.schema import SCHEMA_VERSION

    run = _copy(workspace.run, tmp_path / "run")
    report = run / "report"
    report.mkdir()
    (report / "report.json").write_text(json.dumps({
        "schema_version": SCHEMA_VERSION, "verdict": {"kind": "data-cluster"},
        "settings": {"dataset": str(workspace.dataset), "base_model": str(workspace.model), "run": str(run),
                     "adapter": str(run), "capability": "json_formatting"}}))
    before = snapshot(run)
    result = gradian(["verify", "--report", report])
    _refused(result, "--run", str(run), "rerun `gradian attribute`")
    assert snapshot(run) == before and not (report / "verify").exists()


def test_the_guard_reads_no_hub_id_and_lets_separate_folders_be(tmp_path):
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    (data / "train.jsonl").write_text("{}\n")
    reads = inputs(dataset=data / "train.jsonl", base_model="HuggingFaceTB/SmolLM2-135M", adapter=data)
    refuse_overwrite(out, ATTRIBUTE_WRITES, reads)  # nothing shared: no error
    refuse_overwrite(data, ("findings.json",), [Read("--dataset", data / "train.jsonl")])  # beside, not over
    with pytest.raises(InputError, match="inside --adapter"):
        refuse_overwrite(data / "out", ATTRIBUTE_WRITES, reads)


def test_the_guard_refuses_a_folder_it_writes_whole_that_holds_an_input(tmp_path):
    dataset = tmp_path / "out" / "gradients" / "train.jsonl"
    dataset.parent.mkdir(parents=True)
    dataset.write_text("{}\n")
    with pytest.raises(InputError, match=r"the folder .*gradients, which holds --dataset"):
        refuse_overwrite(tmp_path / "out", ATTRIBUTE_WRITES, inputs(dataset=dataset, base_model=None))


def test_the_guard_counts_a_capability_plugin_file_as_an_input(tmp_path):
    from gradian.capabilities.registry import capability_file

    assert capability_file("checks/yes_no.py:score") == "checks/yes_no.py" and capability_file("regex:a.py") is None
    schema = tmp_path / "out" / "scores.json"
    schema.parent.mkdir()
    schema.write_text("{}")
    with pytest.raises(InputError, match="--capability"):
        refuse_overwrite(tmp_path / "out", ATTRIBUTE_WRITES,
                         inputs(dataset=None, base_model=None, capability=f"json_schema:{schema}"))


def test_the_guard_reads_a_saved_dataset_folder_whole(tmp_path):
    saved = tmp_path / "saved"  # a folder `save_to_disk` wrote, passed as --dataset
    saved.mkdir()
    (saved / "state.json").write_text("{}")
    with pytest.raises(InputError, match="inside --dataset"):
        refuse_overwrite(saved / "out", ATTRIBUTE_WRITES, inputs(dataset=saved, base_model=None))
