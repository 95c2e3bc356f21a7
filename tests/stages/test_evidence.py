"""EOS after the cut, read from the fine-tune: the decision on models whose P(EOS) is set by hand, in float64."""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from gradian.data.render import IGNORE, Rendered
from gradian.data.setup import TrainingSetup
from gradian.stages.evidence import MIN_LIFT, eos_after_cut_evidence

EOS, VOCAB, LIMIT = 2, 8, 12


class Model(torch.nn.Module):
    """P(EOS | prefix) by hand: `cut` after a prefix of LIMIT - 1 tokens (where a cut row's trained tokens end),
    `other` elsewhere; the base (adapter disabled) puts `base` on EOS everywhere."""

    def __init__(self, cut: float, other: float, base: float) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.probs, self.base, self.disabled = (cut, other), base, False

    def forward(self, input_ids):  # (1, T) -> logits (1, T, V)
        p = self.base if self.disabled else self.probs[0 if input_ids.shape[1] == LIMIT - 1 else 1]
        row = torch.full((VOCAB,), (1 - p) / (VOCAB - 1), dtype=torch.float64)
        row[EOS] = p
        return SimpleNamespace(logits=row.log().expand(1, input_ids.shape[1], VOCAB))

    @contextmanager
    def disable_adapter(self):
        self.disabled = True
        yield
        self.disabled = False


def audit(setup: TrainingSetup | None = None):
    cut = [Rendered(f"c{i}", list(range(3, 3 + LIMIT)), [IGNORE] * 4 + list(range(7, 3 + LIMIT)), 20, 4, True,
                    False, "truncated") for i in range(5)]
    whole = [Rendered(f"w{i}", list(range(3, 9)) + [EOS], [IGNORE] * 2 + list(range(5, 9)) + [EOS], 7, 2)
             for i in range(6)]
    tokenizer = SimpleNamespace(eos_token="</s>", convert_tokens_to_ids=lambda token: EOS, eos_token_id=EOS)
    return SimpleNamespace(setup=setup or TrainingSetup(max_length=LIMIT), rendered=cut + whole, tokenizer=tokenizer)


def test_a_fine_tune_that_learned_eos_where_rows_were_cut_chooses_that_rendering():
    evidence = eos_after_cut_evidence(audit(), Model(cut=0.6, other=0.002, base=0.001))
    assert evidence.eos_after_cut and evidence.rows == 5 and evidence.controls == 6
    assert evidence.cut_eos_prob == pytest.approx(0.6)
    assert evidence.cut_lift == pytest.approx(600.0) and evidence.control_lift == pytest.approx(2.0)
    assert "the run trained EOS after the cut" in evidence.why


@pytest.mark.parametrize(("cut", "other"), [(0.6, 0.6), (0.004, 0.001), (0.02, 0.001)])
def test_no_rendering_change_without_the_fine_tunes_evidence(cut, other):
    """Stopping more everywhere (the controls gained as much), a gain too small, or too little mass on EOS."""
    evidence = eos_after_cut_evidence(audit(), Model(cut=cut, other=other, base=0.001))
    lift, control = cut / 0.001, other / 0.001
    assert evidence.eos_after_cut is (lift >= MIN_LIFT * control and cut >= 0.05) is False
    assert "no sign that EOS followed the cut" in evidence.why


def test_settings_that_already_say_so_or_keep_the_end_are_not_weighed():
    model = Model(cut=0.6, other=0.001, base=0.001)
    assert eos_after_cut_evidence(audit(TrainingSetup(max_length=LIMIT, eos_after_truncation=True)), model) is None
    assert eos_after_cut_evidence(audit(TrainingSetup(max_length=LIMIT, truncation_mode="keep_end")), model) is None


def test_the_median_lift_matches_a_naive_float64_reference():
    model = Model(cut=0.3, other=0.01, base=0.002)
    evidence = eos_after_cut_evidence(audit(), model)
    assert np.isclose(evidence.cut_lift, 0.3 / 0.002, rtol=1e-9)
    assert np.isclose(evidence.control_lift, 0.01 / 0.002, rtol=1e-9)
