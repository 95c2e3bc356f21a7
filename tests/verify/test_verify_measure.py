"""A retrain's scores are cached in its folder, and reused only for the prompts they were measured on."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np

import gradian.regression.loading as loading
from gradian.capabilities import get_capability
from gradian.data.base_model import BaseModelRef
from gradian.verify import measure
from gradian.verify.measure import Original, measure_adapter


def test_scores_are_measured_again_when_the_prompts_behind_the_same_ids_changed(tmp_path, monkeypatch):
    calls = []

    def answer(model, tokenizer, prompt_ids, **_):
        calls.append(prompt_ids)  # answers valid JSON to the first prompts and prose to any others
        return [SimpleNamespace(text='{"a": 1}' if ids[0] == 1 else "prose") for ids in prompt_ids]

    monkeypatch.setattr(loading, "load_models", lambda *args, **kwargs: (None, None))
    monkeypatch.setattr(measure, "generate", answer)
    capability = get_capability("json_formatting")
    original = Original(["e1", "e2"], [[1, 2], [1, 3]], [None, None], np.ones(2), np.zeros(2), 16)
    base = BaseModelRef("base", str(tmp_path))

    first = measure_adapter(tmp_path, base, original, capability, device="cpu")
    assert measure_adapter(tmp_path, base, original, capability, device="cpu").tolist() == first.tolist()
    assert len(calls) == 1  # the second call read the cache
    edited = dataclasses.replace(original, prompt_ids=[[7, 2], [7, 3]])
    again = measure_adapter(tmp_path, base, edited, capability, device="cpu")
    assert len(calls) == 2 and calls[-1] == [[7, 2], [7, 3]]
    assert first.tolist() == [1.0, 1.0] and again.tolist() == [0.0, 0.0]
