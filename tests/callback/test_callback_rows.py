"""The run's record is the truth: GradianCallback stores the trainer's rows (gradian_rows.safetensors) and `diagnose`
on the run folder audits them instead of re-rendering.

The case: `assistant_only_loss=True` with Qwen2.5's stock chat template, which has no `{% generation %}` markers.
TRL swaps in its own training template (`trl.chat_template_utils.get_training_chat_template`) and trains the
assistant turns. A port that rendered with the stock template would find no assistant mask and call every row
`no_loss`; without the record Gradian runs TRL's own preparation (`data.trl_prepare`), which swaps the template
as the run did."""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest
from trl.chat_template_utils import qwen2_5_chat_template

from callback_runs import chatml_tokenizer, chats, sft_trainer, tickets
from conftest import make_tiny_model
from gradian import GradianCallback
from gradian.cli.main import cli, register_commands
from gradian.data.recorded_rows import ROWS_NAME, read_recorded_rows
from gradian.data.run_record import read_run_record
from gradian.gradients.store import FeatureStore


@pytest.fixture(autouse=True)
def commands():
    register_commands()


def quiet() -> GradianCallback:
    return GradianCallback(on_critical="warn", echo=lambda _: None)


def finished(trainer, run):
    trainer.train()
    trainer.save_model(str(run))
    trainer.save_state()
    return trainer


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory):
    """A finished stock-template assistant-only run, its base model folder (named instruct: its turn tokens are
    known) and its training rows as a JSONL file."""
    root = tmp_path_factory.mktemp("assistant-only")
    tokenizer = chatml_tokenizer(qwen2_5_chat_template)
    base = root / "tiny-instruct"
    make_tiny_model(tokenizer).save_pretrained(base)  # the weights the run started from (same seed)
    tokenizer.save_pretrained(base)
    run = root / "run"
    trainer = finished(sft_trainer(run, chats(), tokenizer=tokenizer, callbacks=[quiet()], assistant_only_loss=True,
                                   max_length=128), run)
    assert trainer.chat_template is not None  # TRL swapped in its training template: the case under test
    rows = root / "train.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in chats()))
    return run, base, rows, trainer


def diagnose(runner, run, base, rows, *more):
    return runner.invoke(cli, ["diagnose", "--dataset", str(rows), "--run", str(run), "--base-model", str(base),
                               *more])


def copied(run, tmp_path, without=()):
    """The run folder's files, less those named in `without`."""
    out = tmp_path / "copy"
    out.mkdir()
    for path in run.iterdir():
        if path.is_file() and path.name not in without:
            shutil.copy(path, out / path.name)
    return out


def trained_by_collator(trainer, index):
    """(input_ids, trained positions) of train row `index`, put alone through the trainer's own collator."""
    batch = trainer.data_collator([dict(trainer.train_dataset[index])])
    return batch["input_ids"][0].tolist(), (batch["labels"][0] != -100).tolist()


def test_recorded_rows_give_no_false_finding(cli_runner, chat_run):
    run, base, rows, _ = chat_run
    result = diagnose(cli_runner, run, base, rows, "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload["findings"] == []
    assert payload["setup"]["rows_from"] == "record"
    source = payload["rows_source"]
    assert (source["recorded"], source["rendered"], source["matched_by"]) == (8, 0, "id")
    assert source["file"] == str((run / ROWS_NAME).resolve())


def test_table_says_the_rows_came_from_the_record(cli_runner, chat_run):
    run, base, rows, _ = chat_run
    text = " ".join(diagnose(cli_runner, run, base, rows).output.split())
    assert "Rows: all 8 rows as the trainer prepared them, recorded by GradianCallback" in text


@pytest.mark.parametrize("how", ["rows file gone", "record before rows"])
def test_without_the_recorded_rows_trls_own_code_renders_them(cli_runner, chat_run, tmp_path, how):
    run, base, rows, _ = chat_run
    bare = copied(run, tmp_path, without={ROWS_NAME})
    if how == "record before rows":  # a record written before the callback stored rows
        record = json.loads((bare / "gradian_run.json").read_text())
        del record["rows"]
        (bare / "gradian_run.json").write_text(json.dumps(record))
    result = diagnose(cli_runner, bare, base, rows, "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload["findings"] == []  # TRL's training template trains the assistant turns: no false no_loss
    assert payload["setup"]["rows_from"] == "render"
    assert payload["preparation"]["code"] == "trainer" and payload["preparation"]["rows"]["trainer_rows"] == 8
    why = payload["rows_source"]["why"]
    assert (f"{ROWS_NAME}, which gradian_run.json names, is not in the run folder" if how == "rows file gone"
            else "holds no rows") in why


def test_a_row_the_record_lacks_is_rendered_and_named(cli_runner, chat_run, tmp_path):
    run, base, rows, _ = chat_run
    extra = tmp_path / "train.jsonl"
    added = {**chats(9)[8], "id": "new"}
    extra.write_text(rows.read_text() + json.dumps(added) + "\n")
    payload = json.loads(diagnose(cli_runner, run, base, extra, "--json").output)
    source = payload["rows_source"]
    assert (payload["setup"]["rows_from"], source["recorded"], source["rendered"]) == ("record+render", 8, 1)
    assert source["rendered_ids"] == ["new"] and "1 match no recorded row by id or text" in source["why"]
    assert payload["findings"] == []  # the rendered row is TRL's own preparation of it


def test_a_changed_row_is_rendered_not_matched(cli_runner, chat_run, tmp_path):
    run, base, rows, _ = chat_run
    changed = chats()
    changed[3]["messages"][1]["content"] = '{"order": "refund"}'
    edited = tmp_path / "train.jsonl"
    edited.write_text("".join(json.dumps(r) + "\n" for r in changed))
    source = json.loads(diagnose(cli_runner, run, base, edited, "--json").output)["rows_source"]
    assert (source["recorded"], source["rendered_ids"]) == (7, ["c3"])
    assert "1 differ from the trainer's copy of them" in source["why"]


@pytest.mark.parametrize("record_ids", [True, False])
def test_rows_without_ids_match_by_content(cli_runner, chat_run, tmp_path, record_ids):
    """A dataset file without the trainer's ids (in another order) finds its rows by their text."""
    run, base, rows, _ = chat_run
    bare = copied(run, tmp_path)
    if not record_ids:
        record = json.loads((bare / "gradian_run.json").read_text())
        record["dataset"]["ids"] = None
        (bare / "gradian_run.json").write_text(json.dumps(record))
    unnamed = tmp_path / "unnamed.jsonl"
    unnamed.write_text("".join(json.dumps({"messages": r["messages"]}) + "\n" for r in reversed(chats())))
    payload = json.loads(diagnose(cli_runner, bare, base, unnamed, "--json").output)
    assert payload["findings"] == []
    assert (payload["rows_source"]["recorded"], payload["rows_source"]["matched_by"]) == (8, "content")


def test_extract_takes_gradients_on_the_recorded_rows(cli_runner, chat_run, tmp_path):
    """What attribute extracts: every row has a gradient from the record, and the same gradient from TRL's own
    preparation of the dataset when the record's rows are gone."""
    run, base, rows, _ = chat_run
    features = []
    for name, folder in (("record", run), ("render", copied(run, tmp_path, without={ROWS_NAME}))):
        out = tmp_path / f"features-{name}"
        result = cli_runner.invoke(cli, ["extract", "--base-model", str(base), "--adapter", str(folder), "--dataset",
                                         str(rows), "--run", str(folder), "--out", str(out), "--device", "cpu"])
        assert result.exit_code == 0, result.output
        features.append(np.asarray(FeatureStore(out / "gradients"), dtype=np.float64))  # (8, k)
    assert features[0].shape[0] == 8 and int((np.abs(features[0]).sum(axis=1) > 0).sum()) == 8
    np.testing.assert_allclose(features[1], features[0], rtol=1e-5, atol=1e-8)


def test_recorded_rows_equal_the_trainers_token_for_token(chat_run):
    run, _, _, trainer = chat_run
    record = read_run_record(run)
    recorded = read_recorded_rows(run / ROWS_NAME, record.rows)
    assert len(recorded) == len(trainer.train_dataset) == 8
    for index in range(8):
        row = recorded.row(index, str(index))
        ids, trained = trained_by_collator(trainer, index)
        assert row.input_ids == trainer.train_dataset[index]["input_ids"] == ids
        assert [label != -100 for label in row.labels] == trained
        assert sum(trained) > 0  # TRL's training template marks the assistant turn
        assert all(label in (token, -100) for token, label in zip(row.input_ids, row.labels, strict=True))


def test_pad_masking_collator_rows_round_trip(tmp_path):
    """pad == eos with transformers' collator: the trained positions are the collator's (EOS hidden), not the
    dataset's labels."""
    run = tmp_path / "run"
    trainer = finished(sft_trainer(run, tickets(), pad_eos=True, callbacks=[quiet()]), run)
    recorded = read_recorded_rows(run / ROWS_NAME, read_run_record(run).rows)
    eos = trainer.processing_class.eos_token_id
    for index in range(len(trainer.train_dataset)):
        row = recorded.row(index, str(index))
        ids, trained = trained_by_collator(trainer, index)
        assert row.input_ids == ids and [label != -100 for label in row.labels] == trained
        assert row.input_ids[-1] == eos and row.labels[-1] == -100  # the collator hid the EOS it pads with


def test_rows_are_recorded_without_preflight(tmp_path):
    run = tmp_path / "run"
    trainer = finished(sft_trainer(run, tickets(), callbacks=[GradianCallback(preflight=False, echo=lambda _: None)]),
                       run)
    recorded = read_recorded_rows(run / ROWS_NAME, read_run_record(run).rows)
    assert [recorded.row(i, "").input_ids for i in range(12)] == trainer.train_dataset["input_ids"]
    assert read_run_record(run).rows["with_content"] == 12


def damage(path, how):
    data = path.read_bytes()
    if how == "byte flipped":
        path.write_bytes(data[:-3] + bytes([data[-3] ^ 1]) + data[-2:])
    else:
        path.write_bytes(data[: len(data) // 2])
    if how == "truncated, hash rewritten":  # the hash agrees: the file itself must be checked
        record = json.loads((path.parent / "gradian_run.json").read_text())
        record["rows"]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        (path.parent / "gradian_run.json").write_text(json.dumps(record))


@pytest.mark.parametrize("how", ["byte flipped", "truncated", "truncated, hash rewritten"])
def test_a_damaged_rows_file_is_refused(cli_runner, chat_run, tmp_path, how):
    run, base, rows, _ = chat_run
    bare = copied(run, tmp_path)
    damage(bare / ROWS_NAME, how)
    result = diagnose(cli_runner, bare, base, rows, "--json")
    assert result.exit_code == 2, result.output
    message = result.output.strip()
    assert f"{(bare / ROWS_NAME).resolve()}: is damaged (" in message and "Traceback" not in message
    assert message.count(". ") == 0 and message.endswith("instead.")  # one sentence
    assert ("do not hash" in message) == (how != "truncated, hash rewritten")


def test_a_rows_file_whose_tensors_do_not_fit_is_refused(chat_run, tmp_path):
    from safetensors.numpy import save

    run, _, _, _ = chat_run
    record = read_run_record(run)
    tensors = dict(read_recorded_rows(run / ROWS_NAME, record.rows).tensors)
    tensors["offsets"] = tensors["offsets"][:-1]  # a row short
    path = tmp_path / ROWS_NAME
    path.write_bytes(save(tensors))
    reference = {**record.rows, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    with pytest.raises(Exception, match="is damaged") as error:
        read_recorded_rows(path, reference)
    assert type(error.value).__name__ == "InputError" and np.asarray(tensors["offsets"]).size == 8
