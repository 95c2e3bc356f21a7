"""Which token rows were never trained, judged from the rows themselves.

A row that training never touched is still where initialisation put it: zeros, the mean of the other rows
(transformers' `resize_token_embeddings` puts new rows there, give or take 1e-5 of their covariance), or one
vector shared by several new tokens. Trained rows lie about the median distance `spread` from their mean (in
hundreds of dimensions, almost never much closer), so a row within TOLERANCE x spread of such a point stands
apart from every trained row. A row drawn at random like the pretrained ones cannot be told from them and is
not reported.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gradian.data.embeddings import Matrix

TOLERANCE = 0.05
MAX_PEERS = 1024  # other added tokens' rows read to find a vector several new tokens share


@dataclass(frozen=True)
class RowVerdict:
    """Token `token_id`'s `role` row (input embedding or output head), read from `where`, is at its init."""

    token_id: int
    role: str
    where: str
    reason: str  # "zeros" | "the mean of the other rows" | "the same vector as token <id>"
    distance: float  # to that point, in units of the trained rows' spread


def untrained_rows(candidates: dict[str, set[int]], matrices: list[Matrix], exclude: set[int]) -> list[RowVerdict]:
    """The rows of `candidates` (role -> token ids) left at their initial values. Each token's row is read from
    the first matrix in `matrices` that holds it (adapter rows before the base model's); tokens no matrix holds
    are not judged. `exclude` (the added tokens) is left out of the trained rows the judgment compares with, and
    its rows are the peers a candidate's row may be the same vector as."""
    verdicts: list[RowVerdict] = []
    for role, ids in candidates.items():
        groups: dict[Matrix, list[int]] = {}
        for token in sorted(ids):
            holder = next((m for m in matrices if m.role == role and m.holds(token)), None)
            if holder is not None:
                groups.setdefault(holder, []).append(token)
        for matrix, tokens in groups.items():
            reference = _reference(matrix, matrices)
            if reference is None:
                continue
            peers = sorted(t for t in exclude if matrix.holds(t) and t not in ids)[:MAX_PEERS]
            try:
                rows = matrix.read(tokens + peers)  # (n + peers, d): a new token may share its init with another
                trained = reference.sample(exclude)  # (m, d)
            except Exception:  # weights damaged past their header: nothing can be shown from them
                continue
            judged = judge(rows, trained, tokens + peers)[: len(tokens)]
            for token, (reason, distance) in zip(tokens, judged, strict=True):
                if reason is not None:
                    verdicts.append(RowVerdict(token, role, matrix.where, reason, distance))
    return verdicts


def judge(rows: np.ndarray, reference: np.ndarray, tokens: list[int]) -> list[tuple[str | None, float]]:
    """For each of `rows` (n, d): why it is at an initial value, and how close (in spreads), or (None, nearest)."""
    if reference.shape[0] < 2 or rows.shape[1:] != reference.shape[1:]:
        return [(None, float("nan"))] * len(rows)
    mean = reference.mean(axis=0)  # (d,)
    spread = float(np.median(np.linalg.norm(reference - mean, axis=1)))
    if not spread > 0:
        return [(None, float("nan"))] * len(rows)
    out: list[tuple[str | None, float]] = []
    apart = np.linalg.norm(rows[:, None, :] - rows[None, :, :], axis=2) / spread  # (n, n)
    np.fill_diagonal(apart, np.inf)
    for i, row in enumerate(rows):
        zero, centre = float(np.linalg.norm(row)) / spread, float(np.linalg.norm(row - mean)) / spread
        twin = int(np.argmin(apart[i])) if len(rows) > 1 else None
        if zero <= TOLERANCE:
            out.append(("zeros", zero))
        elif centre <= TOLERANCE:
            out.append(("the mean of the other rows", centre))
        elif twin is not None and apart[i, twin] <= TOLERANCE:
            out.append((f"the same vector as token {tokens[twin]}", float(apart[i, twin])))
        else:
            out.append((None, min(zero, centre)))
    return out


def _reference(matrix: Matrix, matrices: list[Matrix]) -> Matrix | None:
    """Where trained rows of the same role are read: the matrix itself, or for trainable-token rows (which hold
    only the tokens trained) the full matrix they replace rows of."""
    if matrix.ids is None:
        return matrix
    return next((m for m in matrices if m.role == matrix.role and m.ids is None), None)
