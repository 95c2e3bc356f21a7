"""The feature store: resumes after an interruption with bit-identical features; shards; settings changes."""

from __future__ import annotations

import contextlib
import itertools
import json
from unittest import mock

import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model

from conftest import make_tiny_model
from gradian.data.render import IGNORE, Rendered
from gradian.errors import InputError
from gradian.gradients.batches import rows_sha
from gradian.gradients.extract import GradientSettings, extract_train_features
from gradian.gradients.store import FeatureStore

torch.set_num_threads(2)


@pytest.fixture
def model(tiny_tokenizer):
    base = make_tiny_model(tiny_tokenizer, seed=2)
    return get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))


@pytest.fixture
def rendered(tiny_tokenizer):
    generator = torch.Generator().manual_seed(3)
    rows = []
    for i in range(13):
        n = 4 + i % 5
        ids = torch.randint(4, len(tiny_tokenizer), (n,), generator=generator).tolist()
        rows.append(Rendered(f"row{i}", ids, [IGNORE] * 2 + ids[2:], n, 2, dropped=(i == 5)))
    return rows


SETTINGS = GradientSettings(proj_dim=256, batch_size=3, store_dtype="float32")


def test_resume_after_interruption_is_bit_identical(model, rendered, tmp_path):
    full = np.asarray(extract_train_features(model, rendered, tmp_path / "a", settings=SETTINGS))
    stopped = extract_train_features(
        model, rendered, tmp_path / "b", settings=SETTINGS, progress=lambda batches: itertools.islice(batches, 2)
    )
    assert 0 < stopped.done.sum() < len(rendered)
    with pytest.raises(InputError):
        np.asarray(stopped)
    calls = []
    resumed = extract_train_features(
        model,
        rendered,
        tmp_path / "b",
        settings=SETTINGS,
        progress=lambda batches: [calls.append(b) or b for b in batches],
    )
    assert resumed.complete
    assert np.array_equal(np.asarray(resumed), full)
    assert full.shape == (13, 256) and not full[5].any()  # the dropped row has zero features
    assert np.abs(np.delete(full, 5, axis=0)).sum(1).min() > 0


def test_shards_together_equal_one_run(model, rendered, tmp_path):
    whole = np.asarray(extract_train_features(model, rendered, tmp_path / "one", settings=SETTINGS))
    for rank in range(3):
        store = extract_train_features(model, rendered, tmp_path / "three", settings=SETTINGS, shard=(rank, 3))
    assert store.complete and store.ids == [r.example_id for r in rendered]
    assert np.allclose(np.asarray(FeatureStore(tmp_path / "three")), whole, atol=1e-6)


def test_changed_settings_recompute(model, rendered, tmp_path):
    extract_train_features(model, rendered, tmp_path, settings=SETTINGS)
    other = GradientSettings(proj_dim=128, batch_size=3, seed=1)
    store = extract_train_features(model, rendered, tmp_path, settings=other)
    assert store.complete and store.dim <= 128 and store.meta["gradient"]["seed"] == 1
    assert len(list(tmp_path.glob("shard-*.npy"))) == 2  # features + done flags of the new settings only


def test_retrained_adapter_or_edited_rows_recompute(model, rendered, tmp_path):
    before = np.asarray(extract_train_features(model, rendered, tmp_path, settings=SETTINGS)).copy()
    with torch.no_grad():
        next(p for n, p in model.named_parameters() if "lora_B" in n).mul_(2.0)  # the adapter, retrained in place
    retrained = np.asarray(extract_train_features(model, rendered, tmp_path, settings=SETTINGS))
    assert not np.allclose(retrained, before)
    fresh = np.asarray(extract_train_features(model, rendered, tmp_path / "fresh", settings=SETTINGS))
    assert np.array_equal(retrained, fresh)
    edited = [*rendered[:1], Rendered("row1", rendered[0].input_ids, rendered[0].labels, rendered[0].full_length,
                                      rendered[0].prompt_length), *rendered[2:]]  # row1's text changed, same id
    again = np.asarray(extract_train_features(model, edited, tmp_path, settings=SETTINGS))
    assert np.array_equal(again[1], again[0]) and not np.array_equal(again[1], retrained[1])


def test_rows_hash_changes_with_a_token_a_label_or_where_rows_split():
    def row(ids, labels):
        return Rendered("r", ids, labels, len(ids), 0)

    base = rows_sha([row([5, 6], [IGNORE, 6]), row([7], [7])])
    assert base == rows_sha([row([5, 6], [IGNORE, 6]), row([7], [7])])
    assert base != rows_sha([row([5, 8], [IGNORE, 6]), row([7], [7])])  # a token
    assert base != rows_sha([row([5, 6], [5, 6]), row([7], [7])])  # a label: the prompt mask moved
    # the same stream of values, cut into rows differently
    assert rows_sha([row([1, 2], [1, 2])]) != rows_sha([row([1], [2]), row([1], [2])])


def test_chunked_reads_cover_every_row(model, rendered, tmp_path):
    store = extract_train_features(model, rendered, tmp_path, settings=SETTINGS)
    stacked = np.concatenate([chunk for _, chunk in store.chunks(4)])
    assert np.array_equal(stacked, np.asarray(store))


@contextlib.contextmanager
def _counting_backwards():
    """The number of rows in each backward extraction runs inside, in a list."""
    from gradian.gradients import extract

    seen, original = [], extract.lora_backward

    def counted(model, batch, roots, **kwargs):
        seen.append(int(batch["input_ids"].shape[0]))
        return original(model, batch, roots, **kwargs)

    with mock.patch.object(extract, "lora_backward", counted):
        yield seen


def _direction(model, seed=4):
    from gradian.gradients.hooks import lora_matrices

    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(m.shape, generator=generator) for m in lora_matrices(model)]


def test_extraction_gives_each_rows_harmful_positions_and_repsim_in_its_own_passes(model, rendered, tmp_path):
    """With a direction and the queries' states, the store's forward and backward also give `position_harms`' and
    RepSim's numbers (the dropped row 0), the features unchanged; a store made without them, and the energy pass's
    rows, get theirs from passes of their own, unless the energy pass took them along the same (one backward a row); resumed after an interruption, the same numbers; another direction
    or other queries are not read as these."""
    from gradian.gradients.energy import gradient_energy
    from gradian.gradients.hooks import lora_matrices
    from gradian.gradients.sides import SideTaker, cosine, position_harms_of, repsim_of
    from gradian.scores.relevance import mean_hidden_states
    from gradian.scores.token_harm import position_harms

    direction = _direction(model)
    states = np.random.default_rng(0).normal(size=(3, model.config.hidden_size))  # (Q, d) the queries'
    harms = position_harms(model, rendered, direction, batch_size=SETTINGS.batch_size)
    repsim = cosine(mean_hidden_states(model, [r.input_ids for r in rendered]), states)  # (N, Q)
    repsim[5] = 0.0  # never trained: no relevance either
    assert harms[5] == 0 and (np.delete(harms, 5) > 0).all()

    def check(store):
        np.testing.assert_allclose(position_harms_of(store, direction), harms, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(repsim_of(store, states), repsim, atol=1e-5)

    plain = extract_train_features(model, rendered, tmp_path / "plain", settings=SETTINGS)
    both = extract_train_features(model, rendered, tmp_path / "both", settings=SETTINGS, direction=direction,
                                  representations=states)
    assert np.array_equal(np.asarray(both), np.asarray(plain))  # the features see neither
    check(both)

    before = {path.name: path.read_bytes() for path in (tmp_path / "plain").glob("shard-*")}
    later = extract_train_features(model, rendered, tmp_path / "plain", settings=SETTINGS, direction=direction,
                                   representations=states)
    assert {path.name: path.read_bytes() for path in (tmp_path / "plain").glob("shard-*")} == before
    check(later)
    with pytest.raises(InputError):
        position_harms_of(later, _direction(model, seed=5))
    with pytest.raises(InputError):
        repsim_of(later, states[:2])

    _, sampled = gradient_energy(model, rendered, SETTINGS, max_rows=4, keep_bytes=10**8)
    assert sampled is not None and len(sampled.rows) == 4
    check(extract_train_features(model, rendered, tmp_path / "energy", settings=SETTINGS, sampled=sampled,
                                 direction=direction, representations=states))
    # the energy pass takes the sides from its own backward: extraction then runs no second one for its rows
    taker = SideTaker(model, lora_matrices(model), direction=direction, representations=states)
    _, sampled = gradient_energy(model, rendered, SETTINGS, max_rows=4, keep_bytes=10**8, taker=taker)
    assert sampled is not None and set(sampled.sides) == {"positions", "repsim"}
    trained = [r for r in rendered if not r.dropped]
    with _counting_backwards() as rows_seen:
        check(extract_train_features(model, rendered, tmp_path / "taken", settings=SETTINGS, sampled=sampled,
                                     direction=direction, representations=states))
    assert sum(rows_seen) == len(trained) - 4  # each row once: the sampled 4 in the energy pass alone
    with _counting_backwards() as rows_seen:  # taken along another direction: those rows' sides are taken again
        extract_train_features(model, rendered, tmp_path / "other", settings=SETTINGS, sampled=sampled,
                               direction=_direction(model, seed=5), representations=states)
    assert sum(rows_seen) == len(trained)

    extract_train_features(model, rendered, tmp_path / "stopped", settings=SETTINGS, direction=direction,
                           representations=states, progress=lambda batches: itertools.islice(batches, 2))
    resumed = extract_train_features(model, rendered, tmp_path / "stopped", settings=SETTINGS, direction=direction,
                                     representations=states)
    assert np.array_equal(position_harms_of(resumed, direction), position_harms_of(both, direction))
    assert np.array_equal(repsim_of(resumed, states), repsim_of(both, states))


def test_a_stores_gradient_settings_read_back_equal_what_wrote_them(tmp_path):
    """settings.json holds `to_dict()` (budget weights as a JSON list); `from_dict` gives the same settings back."""
    written = GradientSettings(proj_dim=64, seed=3, budget_weights=(0.25, 0.75), store_dtype="float32")
    (tmp_path / "settings.json").write_text(json.dumps(written.to_dict()))
    assert GradientSettings.from_dict(json.loads((tmp_path / "settings.json").read_text())) == written
    assert GradientSettings.from_dict(GradientSettings().to_dict()) == GradientSettings()
