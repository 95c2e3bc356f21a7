"""`gradian verify`'s options are VerifySettings' fields: same help, default and range, and they reach `verify`."""

from __future__ import annotations

import dataclasses
import json

import click
import pytest

from gradian.cli.main import cli, register_commands
from gradian.cli.verify import verify_command
from gradian.verify import VerifySettings

register_commands()


def test_every_setting_is_an_option_with_its_help_default_and_range():
    options = {param.name: param for param in verify_command.params if isinstance(param, click.Option)}
    for spec in dataclasses.fields(VerifySettings):
        option = options.pop(spec.name)
        assert option.help == spec.metadata["help"] and option.opts == ["--" + spec.name.replace("_", "-")]
        assert option.required == (spec.default is dataclasses.MISSING)
        if not option.required:
            assert option.default == spec.default
        if "min" in spec.metadata:
            assert isinstance(option.type, click.IntRange) and option.type.min == spec.metadata["min"]
    assert set(options) == {"as_json"}  # the one option that is not a setting: how the result is printed
    assert isinstance(verify_command.params[0].type, click.Path) and not verify_command.params[0].type.file_okay


@pytest.mark.parametrize("args,words", [(["--controls", "-1"], "x>=0"), (["--groups", "-2"], "x>=0"),
                                        (["--max-steps", "0"], "x>=1"), (["--batch-size", "0"], "x>=1")])
def test_an_out_of_range_option_is_a_usage_error(cli_runner, tmp_path, args, words):
    result = cli_runner.invoke(cli, ["verify", "--report", str(tmp_path), *args])
    assert result.exit_code == 2 and words in result.output and "Traceback" not in result.output
    assert not (tmp_path / "verify").exists()


def test_a_report_that_is_a_file_is_a_usage_error(cli_runner, tmp_path):
    report = tmp_path / "report.json"
    report.write_text("{}")
    result = cli_runner.invoke(cli, ["verify", "--report", str(report)])
    assert result.exit_code == 2 and "is a file" in result.output


@pytest.mark.parametrize("options,message", [({"controls": -1}, "controls must be 0 or more, not -1"),
                                             ({"groups": -1}, "groups must be 0 or more, not -1"),
                                             ({"max_steps": 0}, "max_steps must be at least 1, not 0"),
                                             ({"batch_size": 0}, "batch_size must be at least 1, not 0")])
def test_the_library_checks_the_same_ranges(options, message):
    with pytest.raises(ValueError, match=message):
        VerifySettings(report="r", **options)
    assert VerifySettings(report="r", max_steps=None).max_steps is None


def test_the_options_reach_verify_as_settings(cli_runner, tmp_path, monkeypatch):
    import gradian.verify.run

    seen: list[VerifySettings] = []

    def fake_verify(settings, *, say=None, bar=None):
        seen.append(settings)
        return {"status": "confirmed"}

    monkeypatch.setattr(gradian.verify.run, "verify", fake_verify)
    result = cli_runner.invoke(cli, ["verify", "--report", str(tmp_path), "--controls", "2", "--groups", "1",
                                     "--curve", "--device", "cpu", "--max-steps", "3", "--batch-size", "4", "--json"])
    assert result.exit_code == 0, result.output
    assert seen == [VerifySettings(report=str(tmp_path), controls=2, groups=1, curve=True, device="cpu", max_steps=3,
                                   batch_size=4)]
    assert json.loads(result.stdout) == {"status": "confirmed"}
    cli_runner.invoke(cli, ["verify", "--report", str(tmp_path), "--json"])
    assert seen[-1] == VerifySettings(report=str(tmp_path))  # every default is the settings' own


@pytest.mark.parametrize("options,message", [({"seed": -1}, "seed must be 0 or more, not -1"),
                                             ({"batch_size": 0}, "batch_size must be at least 1, not 0"),
                                             ({"proj_dim": 0}, "proj_dim must be at least 1, not 0"),
                                             ({"n_clusters": 0}, "n_clusters must be at least 1, not 0"),
                                             ({"rank": "best"}, "rank must be one of")])
def test_attribute_settings_check_their_ranges_by_the_same_rule(options, message):
    """`check_fields` serves every settings class: attribute's ranges are its fields' `min`, as verify's are."""
    from gradian.settings import AttributeSettings

    paths = {"base_model": "m", "adapter": "a", "dataset": "d", "out": "o", "eval_dataset": "e", "capability": "c"}
    with pytest.raises(ValueError, match=message):
        AttributeSettings(**paths, **options)
    assert AttributeSettings(**paths, proj_dim=None, n_clusters=None).proj_dim is None


def test_a_serving_verdict_is_refused_before_any_work_pointing_at_its_fix(cli_runner, tmp_path):
    """The drop happens in the serving path: no retrain without training rows can move it, so verify plans none."""
    from gradian.report.schema import SCHEMA_VERSION

    fix = "raise max_new_tokens in generation_config.json above the longest answer (64 tokens)"
    report = {"schema_version": SCHEMA_VERSION, "settings": {"dataset": str(tmp_path / "train.jsonl")},
              "verdict": {"kind": "serving", "next_action": fix, "culprit_ids": [], "causes": []}}
    (tmp_path / "report.json").write_text(json.dumps(report))
    result = cli_runner.invoke(cli, ["verify", "--report", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert result.output == (
        f"Error: {tmp_path / 'report.json'}: has the verdict `serving`: the drop happens in the serving path, not in "
        "training, so removing training rows cannot move it; apply the report's serving fix instead and measure the "
        f"served answers again: {fix}.\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]  # no lock, no retrain folder
