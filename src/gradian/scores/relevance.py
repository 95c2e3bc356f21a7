"""Relevance of training rows to the failing eval rows, without gradients: the baselines attribution must beat.

Each similarity is an (N, Q) matrix, training rows × failing eval queries (higher = more alike); `aggregate` turns
it into one score per row. Two kinds, one job each (the combined rank uses both):

- TF-IDF cosine of a training row's text (prompt + completion) to a failing eval prompt;
- RepSim: cosine of mean last-layer hidden states of the fine-tuned model, attention-masked mean over every
  token of the sequence (prompt + answer), as the representation-similarity baselines of LLM data-attribution
  benchmarks compute it; a training row is the sequence as trained, a query the failing prompt with the fine-tuned
  model's own (failing) answer.

Baselines only the benchmarks rank with live with them (BM25: `benchmarks/harness/baselines.py`); the two references
that are not methods, random order and the category oracle, read a scenario's ground truth and live with the culprit
metrics in `gradian.scenarios.evaluate`.

Words are runs of letters (digits and punctuation dropped): ids and amounts differ in every row and would make
every row look unlike every other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from scipy import sparse
from sklearn.feature_extraction.text import TfidfVectorizer

from gradian.gradients.sides import cosine

WORDS = r"(?u)\b[^\W\d_]+\b"
AGGREGATES = ("max", "mean")


def tfidf_vectors(train_texts: Sequence[str], query_texts: Sequence[str]) -> tuple[sparse.csr_matrix, ...]:
    """(N, V) and (Q, V) l2-normalised TF-IDF vectors, the vocabulary and IDF fitted on both sets together."""
    vectorizer = TfidfVectorizer(token_pattern=WORDS).fit([*train_texts, *query_texts])
    return vectorizer.transform(train_texts), vectorizer.transform(query_texts)


def tfidf_similarity(train_texts: Sequence[str], query_texts: Sequence[str]) -> np.ndarray:
    """(N, Q) cosine of TF-IDF vectors."""
    train, queries = tfidf_vectors(train_texts, query_texts)
    return np.asarray((train @ queries.T).toarray(), dtype=np.float64)


@torch.no_grad()
def mean_hidden_states(model: Any, sequences: Sequence[Sequence[int]], *, batch_size: int = 16, layer: int = -1,
                       positions: Sequence[Sequence[bool]] | None = None) -> np.ndarray:
    """(n, d) float64: each sequence's hidden states after `layer` (`hidden_states[layer]`: 0 the embeddings, -1 the
    last layer's, after the final norm) averaged over its tokens, padding masked out; with `positions` (one flag per
    token of each sequence) over the flagged tokens only, and a sequence with none flagged gets zeros.

    Sequences are sorted by length and right-padded a batch at a time, so little compute goes to padding; a PEFT
    model is run with its adapter on (the fine-tuned model) unless the caller disabled it.
    """
    device = next(model.parameters()).device
    order = np.argsort([len(s) for s in sequences], kind="stable")
    out = np.zeros((len(sequences), 0))
    for start in range(0, len(order), batch_size):
        chosen = order[start : start + batch_size]
        batch = [list(sequences[i]) for i in chosen]
        width = max(max(len(s) for s in batch), 1)
        ids = torch.zeros((len(batch), width), dtype=torch.long)  # (B, T) pad id 0: masked anyway
        mask = torch.zeros((len(batch), width), dtype=torch.long)  # (B, T) the real tokens
        counted = torch.zeros((len(batch), width))  # (B, T) the tokens averaged over
        for row, (index, sequence) in enumerate(zip(chosen, batch, strict=True)):
            ids[row, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
            mask[row, : len(sequence)] = 1
            counted[row, : len(sequence)] = 1.0 if positions is None else torch.tensor(
                [float(flag) for flag in positions[index]])
        hidden = model(input_ids=ids.to(device), attention_mask=mask.to(device), output_hidden_states=True,
                       use_cache=False).hidden_states[layer]  # (B, T, d)
        weights = counted.to(hidden.device, hidden.dtype).unsqueeze(-1)  # (B, T, 1)
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)  # (B, d)
        if out.shape[1] == 0:
            out = np.zeros((len(sequences), pooled.shape[1]))
        out[chosen] = pooled.double().cpu().numpy()
    return out


def repsim(model: Any, train_sequences: Sequence[Sequence[int]], query_sequences: Sequence[Sequence[int]], *,
           batch_size: int = 16) -> np.ndarray:
    """(N, Q) RepSim: cosine of the mean last-layer hidden states of each training row and each query sequence."""
    train = mean_hidden_states(model, train_sequences, batch_size=batch_size)
    queries = mean_hidden_states(model, query_sequences, batch_size=batch_size)
    return cosine(train, queries)


def aggregate(similarity: np.ndarray, how: str) -> np.ndarray:
    """(N,) one relevance per training row from (N, Q): its best match (`max`) or its mean over the queries."""
    if how not in AGGREGATES:
        raise ValueError(f"aggregate must be one of {AGGREGATES}, not {how!r}")
    similarity = np.atleast_2d(np.asarray(similarity, dtype=np.float64))
    if similarity.shape[1] == 0:
        return np.zeros(similarity.shape[0])
    return similarity.max(axis=1) if how == "max" else similarity.mean(axis=1)
