"""`--rank activation`: training rows ranked by how far their completions move the base model's hidden state the way
the fine-tune's failing answers do (activation differences, as in Xiao & Aranguri 2026).

All hidden states are the BASE model's (the adapter switched off), after layer `activation_layer`, averaged over a
sequence's answer tokens only (the prompt is the same on both sides of each difference and would only dilute it):

    v   = mean_q [ h(x_q, ŷ_q) − h(x_q, y_q) ]       (d,)  ŷ_q the fine-tune's failing answer, y_q the reference
    d_i = h(x_i, c_i) − h(x_i, b_i)                   (d,)  c_i row i's completion as trained, b_i the base's own
                                                            greedy answer to x_i
    score_i = cos(d_i, v)                                   higher = more likely a culprit

v is the behaviour the fine-tune took on, seen where it fails; d_i is what row i teaches the base model beyond what
it would have said anyway. A row whose completion carries the failing behaviour (a cut answer, an opening fence)
points along v; a clean row teaches the fine-tune's purpose, which the references carry too, and sits near 0.

A training row is read as trained (`audit.rendered`): its answer tokens are its supervised positions after the
prompt, so a max-length cut or a masked EOS is seen as the run saw it. A row with no supervised answer token (cut to
its prompt, dropped, no prompt to answer) has d_i = 0 and cosine 0.

The gradients still run: the clusters, the verdict's harm shares and the report read the gradient effects, leveled
to this score (`combine._level`) so that ranking by effect is ranking by the cosine, each row keeping which failing
queries it hurts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gradian.data.render import IGNORE, render_prompt
from gradian.errors import InputError
from gradian.gradients.sides import cosine
from gradian.regression.base_answers import base_answers
from gradian.regression.generation import GENERATION_BATCH, GeneratedAnswer
from gradian.scores.pairs import answer_tokens
from gradian.scores.relevance import mean_hidden_states

# Which hidden state: hidden_states[n_layers * LAYER_SHARE], after the middle layer (n_layers // 2). Behaviour
# directions are read mid-network in the model-diffing and steering work this method comes from: the first layers
# still mostly hold the tokens themselves, the last ones the next token's logits. Not yet chosen on the suite's dev
# half; to be measured there.
LAYER_SHARE = 0.5
AGREEMENT_SHARE = 0.05  # the top k compared with the gradient's: at most this share of rows ...
AGREEMENT_MIN = 5  # ... and at least this many
ANSWER_ROOM = (1.5, 8)  # base answers' token limit: 1.5 × the longest answer as trained + 8, as for the eval rows

Sequenced = tuple[list[int], list[bool]]  # token ids and, per token, whether it is an answer token


@dataclass
class ActivationScores:
    """What the activation ranking measured: each row's cosine and where and at what cost it was taken."""

    cosine: np.ndarray  # (N,)
    layer: int
    n_queries: int  # failing eval rows with a reference, averaged into v
    n_rows: int  # training rows with a supervised answer, the others scored 0
    generation_seconds: float
    activation_seconds: float
    cached: bool  # the base answers came from the output folder

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "n_queries": self.n_queries, "n_rows": self.n_rows,
                "generation_seconds": round(self.generation_seconds, 3),
                "activation_seconds": round(self.activation_seconds, 3), "base_answers_cached": self.cached}


def activation_layer(model: Any) -> int:
    """The hidden state read: `n_layers // 2` (`LAYER_SHARE`), an index into `hidden_states` (0 the embeddings)."""
    config = getattr(model, "config", None)
    config = getattr(config, "text_config", None) or config
    n_layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    if n_layers < 1:
        raise ValueError("the model's config names no num_hidden_layers")
    return int(n_layers * LAYER_SHARE)


def behaviour_direction(failing: np.ndarray, intended: np.ndarray) -> np.ndarray:
    """(d,) v: the mean over the failing eval rows of (failing answer's state − reference's), each (Q, d)."""
    return (np.asarray(failing, dtype=np.float64) - np.asarray(intended, dtype=np.float64)).mean(axis=0)


def difference_cosines(trained: np.ndarray, own: np.ndarray, direction: np.ndarray) -> np.ndarray:
    """(N,) cos(d_i, v), d_i = trained_i − own_i (each (N, d)); a zero d_i or v gives 0."""
    differences = np.asarray(trained, dtype=np.float64) - np.asarray(own, dtype=np.float64)  # (N, d)
    return cosine(differences, np.asarray(direction, dtype=np.float64)[None, :])[:, 0]


def agreement_size(gradient_effect: np.ndarray) -> int:
    """k for the top-k agreement: the rows with a negative gradient effect, at most 5% of the rows and at least 5
    (never more than there are rows)."""
    n_rows = len(gradient_effect)
    harmful = int((np.asarray(gradient_effect) < 0).sum())
    return min(n_rows, max(AGREEMENT_MIN, min(harmful, round(AGREEMENT_SHARE * n_rows))))


def top_overlap(score: np.ndarray, other: np.ndarray, k: int) -> float:
    """The share of the top `k` rows by `score` (higher first) that are in the top `k` by `other`; 0 for k = 0."""
    if k <= 0:
        return 0.0
    top = set(np.argsort(-np.asarray(score), kind="stable")[:k].tolist())
    return len(top & set(np.argsort(-np.asarray(other), kind="stable")[:k].tolist())) / k


def ranking_agreement(score: np.ndarray, gradient_score: np.ndarray, gradient_effect: np.ndarray) -> dict[str, float]:
    """How far this ranking's top agrees with the gradient's: k, the overlap of the two top k, and its chance level."""
    k = agreement_size(gradient_effect)
    n_rows = max(len(score), 1)
    return {"k": k, "overlap": top_overlap(score, gradient_score, k), "chance": k / n_rows}


def trained_sequence(rendered: Any) -> Sequenced:
    """A row as trained: its tokens, its answer tokens the supervised ones after the prompt."""
    ids = list(rendered.input_ids)
    return ids, [t >= rendered.prompt_length and label != IGNORE for t, label in enumerate(rendered.labels)]


def answer_sequence(prompt: Sequence[int], answer: Sequence[int]) -> Sequenced:
    """A prompt followed by an answer given as tokens, the answer's tokens flagged."""
    return list(prompt) + list(answer), [False] * len(prompt) + [True] * len(answer)


def departed(one: Sequenced, other: Sequenced) -> tuple[Sequenced, Sequenced]:
    """The pair with its common answer start unflagged: each side's answer tokens from the first token where the two
    sequences differ. A causal model's states are equal up to there, so they only dilute a difference of means (by
    each side's length, not its content). A side with no token left keeps its last answer token: where it stopped."""
    (a, a_flags), (b, b_flags) = one, other
    start = next((t for t, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))

    def cut(flags: list[bool]) -> list[bool]:
        kept = [flag and t >= start for t, flag in enumerate(flags)]
        if not any(kept) and any(flags):
            kept[max(t for t, flag in enumerate(flags) if flag)] = True
        return kept

    return (a, cut(a_flags)), (b, cut(b_flags))


def base_states(model: Any, sequences: Sequence[Sequenced], layer: int, batch_size: int) -> np.ndarray:
    """(n, d) the base model's hidden states after `layer`, averaged over each sequence's answer tokens."""
    if not sequences:
        return np.zeros((0, 0))
    with model.disable_adapter():
        return mean_hidden_states(model, [ids for ids, _ in sequences], batch_size=batch_size, layer=layer,
                                  positions=[flags for _, flags in sequences])


def intended_pairs(failing: Sequence[Any], eval_examples: Sequence[Any], tokenizer: Any,
                   setup: Any) -> list[tuple[Sequenced, Sequenced]]:
    """Per failing eval row with a reference: (prompt + the fine-tune's answer, prompt + the reference), both
    rendered as training renders a completion."""
    by_id = {example.id: example for example in eval_examples}
    pairs = []
    for row in failing:
        if row.reference is None or row.id not in by_id:
            continue
        prompt, reference = answer_tokens(by_id[row.id], row.reference, tokenizer, setup)
        answer = list(row.finetuned.ids) if prompt == list(row.prompt_ids) else \
            answer_tokens(by_id[row.id], row.finetuned.text, tokenizer, setup)[1]  # the template renders differently
        pairs.append((answer_sequence(prompt, answer), answer_sequence(prompt, reference)))
    return pairs


def answerable(examples: Sequence[Any], rendered: Sequence[Any]) -> list[int]:
    """The training rows an own answer can be compared with: a prompt and at least one supervised answer token."""
    return [i for i, (example, row) in enumerate(zip(examples, rendered, strict=True))
            if example.prompt is not None and any(trained_sequence(row)[1])]


def answer_limit(trained: Sequence[Sequenced]) -> int:
    """The base answers' token limit: `ANSWER_ROOM` over the longest answer as trained."""
    return int(ANSWER_ROOM[0] * max(sum(flags) for _, flags in trained)) + ANSWER_ROOM[1]


def check_inputs(failing: Sequence[Any]) -> None:
    """`--rank activation` needs a failing eval row with a reference answer to contrast its failing answer with."""
    if not any(row.reference is not None for row in failing):
        raise InputError("--rank activation contrasts the fine-tune's failing answers with the eval rows' reference "
                         "answers, and no failing eval row has one; add reference answers (a completion) to the eval "
                         "rows, or use --rank gradient.")


@dataclass
class OwnAnswers:
    """The training rows an own answer can be compared with (`answerable`), and the base's greedy answer to each."""

    rows: list[int]  # indices into the run's rows
    trained: list[Sequenced]  # each row as trained
    prompts: list[list[int]]  # each row's prompt as rendered
    answers: list[GeneratedAnswer]  # the base model's answer to it, adapter off
    cached: bool  # the answers came from `out_dir`


def own_answers(model: Any, tokenizer: Any, audit: Any, out_dir: str | Path, *, max_new_tokens: int | None = None,
                batch_size: int = GENERATION_BATCH,
                progress: Callable[[int], Callable[[int], Any]] | None = None) -> OwnAnswers:
    """The base's own answers to the answerable training rows' prompts, kept in `out_dir` (`regression.base_answers`),
    up to `max_new_tokens` (else `answer_limit`); none generated when no row is answerable. `progress(total)`, called
    once before generating (never when the answers are kept), gives the callable that gets each batch's count."""
    rows = answerable(audit.examples, audit.rendered)
    if not rows:
        return OwnAnswers([], [], [], [], True)
    trained = [trained_sequence(audit.rendered[i]) for i in rows]
    prompts = [render_prompt(audit.examples[i], tokenizer, audit.setup) for i in rows]
    answers, cached = base_answers(model, tokenizer, prompts, out_dir,
                                   max_new_tokens=max_new_tokens or answer_limit(trained), batch_size=batch_size,
                                   progress=(lambda: progress(len(prompts))) if progress is not None else None)
    return OwnAnswers(rows, trained, prompts, answers, cached)


def activation_scores(model: Any, tokenizer: Any, audit: Any, failing: Sequence[Any], out_dir: str | Path, *,
                      max_new_tokens: int | None = None, batch_size: int = 16,
                      generation_batch_size: int = GENERATION_BATCH, from_departure: bool = False,
                      progress: Callable[[int], Callable[[int], Any]] | None = None) -> ActivationScores:
    """Each training row's cos(d_i, v) (module docstring); the base's answers to the training prompts are kept in
    `out_dir` (`regression.base_answers`); `progress(total)`, called once before generating (never when the answers
    are kept), gives the callable that gets the count of each batch generated. `from_departure`: each side of each
    difference averaged from where the two answers depart (`departed`), not over its whole answer."""
    check_inputs(failing)
    layer = activation_layer(model)
    pairs = intended_pairs(failing, audit.eval_examples or [], tokenizer, audit.setup)
    pairs = [departed(*pair) for pair in pairs] if from_departure else pairs
    start = time.perf_counter()
    found = own_answers(model, tokenizer, audit, out_dir, max_new_tokens=max_new_tokens,
                        batch_size=generation_batch_size, progress=progress)
    generated = time.perf_counter() - start
    if not found.rows:
        raise InputError("--rank activation compares each training row's completion with the base model's own "
                         "answer to its prompt, and no training row has a prompt with a supervised answer; use "
                         "--rank gradient.")
    rows, trained, prompts, answers = found.rows, found.trained, found.prompts, found.answers

    start = time.perf_counter()
    failing_states = base_states(model, [f for f, _ in pairs], layer, batch_size)  # (Q, d)
    intended_states = base_states(model, [r for _, r in pairs], layer, batch_size)  # (Q, d)
    direction = behaviour_direction(failing_states, intended_states)  # (d,)
    own_sequences = [answer_sequence(p, a.ids) for p, a in zip(prompts, answers, strict=True)]
    if from_departure:
        trained, own_sequences = map(list, zip(*(departed(t, o) for t, o in zip(trained, own_sequences, strict=True)),
                                               strict=True))
    own = base_states(model, own_sequences, layer, batch_size)  # (n, d)
    scores = np.zeros(len(audit.rendered))  # (N,) the rows with nothing to compare stay at 0
    scores[rows] = difference_cosines(base_states(model, trained, layer, batch_size), own, direction)
    return ActivationScores(scores, layer, len(pairs), len(rows), generated, time.perf_counter() - start,
                            found.cached)
