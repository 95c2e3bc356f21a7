"""Which rendering the run's own evidence supports, where its preparation cannot be replayed: EOS after the cut.

A run that tokenized its rows itself (`tokenizer(prompt + answer, truncation=True, max_length=N)` with a tokenizer
whose post-processor appends EOS) trains every row cut at N with an EOS where the cut falls: the rows teach
stopping mid-answer. Nothing in its config says so, and a re-render that cuts without EOS takes the gradients on
rows the run never saw. The fine-tune itself tells which happened: where a cut row's trained tokens end, a run
that put EOS there made EOS far likelier than the base model finds it; at the same depth inside rows that were not
cut, it did not. Gradian reads P(EOS) of both models at both kinds of positions, and when the cut positions gained
at least `MIN_LIFT` times more than the uncut ones, it renders the cut rows with EOS after the cut (and the audit
names the setting, `eos_after_cut`). The saved tokenizer's post-processor is reported beside it as a second sign.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from gradian.audit import DiagnoseResult
from gradian.data.render import IGNORE, eos_token_of

ROWS = 32  # cut rows (and as many uncut control positions) read: two forward passes each, a few seconds on a CPU
MIN_LIFT = 10.0  # the cut positions' P(EOS) gain over the base must beat the controls' by this factor (medians)
MIN_EOS_PROB = 0.05  # ... and the fine-tune must put at least this on EOS there: stopping is what it learned


@dataclass
class EosEvidence:
    """The numbers behind the choice (report.json `run.rendering_evidence`)."""

    rows: int  # cut rows read
    controls: int  # uncut rows read, at the middle of their answer
    cut_eos_prob: float  # median P_fine-tuned(EOS) where a cut row's trained tokens end
    cut_lift: float  # median P_fine-tuned(EOS) / P_base(EOS) there
    control_lift: float  # the same at the middle of uncut rows' answers
    post_processor_appends_eos: bool | None  # a plain tokenizer(text) call ends in EOS (None: could not tell)
    eos_after_cut: bool  # the rendering chosen: the cut rows end in EOS
    why: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def eos_after_cut_evidence(audit: DiagnoseResult, model: Any) -> EosEvidence | None:
    """Weigh the two renderings of the rows cut at max_length (None when no row is cut at its end, the run's
    settings already say EOS follows the cut, or the trainer's own code prepared the rows: LLaMA-Factory's says
    itself whether EOS follows)."""
    setup = audit.setup
    if setup.eos_after_truncation or setup.truncation_mode != "keep_start" or setup.drop_overlong \
            or setup.framework == "llamafactory":
        return None
    rows = list(audit.rendered)
    cut = [r for r in rows if r.over_limit == "truncated" and r.tail_cut][:ROWS]
    if not cut:
        return None
    eos = audit.tokenizer.convert_tokens_to_ids(eos_token_of(audit.tokenizer, setup))
    controls = [p for p in (_middle(r) for r in rows if not r.over_limit) if p is not None][:ROWS]
    cut_positions = [r.input_ids[:-1] for r in cut]  # the run's EOS, if any, took the last kept token's place
    fine_cut, base_cut = _eos_probs(model, cut_positions, eos)  # (R,), (R,)
    fine_ctl, base_ctl = _eos_probs(model, controls, eos)  # (C,), (C,)
    cut_lift = _median_ratio(fine_cut, base_cut)
    control_lift = _median_ratio(fine_ctl, base_ctl) if controls else 1.0
    cut_prob = float(np.median(fine_cut))
    chosen = cut_lift >= MIN_LIFT * control_lift and cut_prob >= MIN_EOS_PROB
    why = (f"where the {len(cut)} cut rows' trained tokens end, the fine-tune puts {cut_prob:.1%} on EOS "
           f"({cut_lift:.3g}x the base model's), against {control_lift:.3g}x at the middle of {len(controls)} uncut "
           f"rows' answers: " + ("the run trained EOS after the cut" if chosen else
                                 "no sign that EOS followed the cut"))
    return EosEvidence(len(cut), len(controls), cut_prob, cut_lift, control_lift,
                       post_processor_appends_eos(audit.tokenizer), chosen, why)


def _middle(row: Any) -> list[int] | None:
    """An uncut row's tokens up to the middle of its supervised answer (None without one)."""
    supervised = [i for i, label in enumerate(row.labels) if label != IGNORE]
    if len(supervised) < 4:
        return None
    return list(row.input_ids[: supervised[len(supervised) // 2]])


def _eos_probs(model: Any, prefixes: list[list[int]], eos: int) -> tuple[np.ndarray, np.ndarray]:
    """(P_fine-tuned(EOS | prefix), P_base(EOS | prefix)) for each prefix, float64, one row at a time (no padding)."""
    device = next(model.parameters()).device

    def probs() -> np.ndarray:
        out = []
        with torch.no_grad():
            for ids in prefixes:
                logits = model(input_ids=torch.tensor([ids], device=device)).logits[0, -1].double()  # (V,)
                out.append(float(torch.softmax(logits, dim=-1)[eos]))
        return np.array(out, dtype=np.float64)

    fine = probs()
    with model.disable_adapter():
        base = probs()
    return fine, base


def _median_ratio(fine: np.ndarray, base: np.ndarray) -> float:
    return float(math.exp(np.median(np.log(np.maximum(fine, 1e-300)) - np.log(np.maximum(base, 1e-300)))))


def post_processor_appends_eos(tokenizer: Any) -> bool | None:
    """Whether `tokenizer(text)` (special tokens on, as a run that tokenizes itself calls it) ends in EOS."""
    try:
        ids = tokenizer("a b", add_special_tokens=True)["input_ids"]
    except Exception:  # a tokenizer that cannot say: unknown, never a failure
        return None
    return bool(ids) and tokenizer.eos_token_id is not None and ids[-1] == tokenizer.eos_token_id
