"""Rows seen twice: exact and near duplicates in train (MinHash LSH), and eval rows that are also train rows."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from itertools import chain

import numpy as np
from datasketch import MinHashLSH

from gradian.audit.context import AuditContext
from gradian.audit.finding import Finding
from gradian.audit.registry import check
from gradian.audit.wording import id_list, share
from gradian.data.examples import Example

NUM_PERM = 64
NEAR = 0.8  # Jaccard over 4-token shingles, verified exactly after the LSH lookup
SEED = 1
ESTIMATE_SLACK = 0.2
LSH_THRESHOLD = 0.6  # candidates are looser than NEAR so that pairs just above NEAR are rarely missed


def normalised(text: str) -> str:
    return " ".join(text.lower().split())


def _key(example: Example) -> str:
    return normalised(example.prompt_text) + "\x00" + normalised(example.completion_text)


def _train_keys(ctx: AuditContext) -> list[str]:
    """`_key` of every train row, computed once per audit (both duplicate checks use it)."""
    if "duplicate_keys" not in ctx.options:
        ctx.options["duplicate_keys"] = [_key(e) for e in ctx.examples]
    return ctx.options["duplicate_keys"]


@check("duplicate")
def exact_duplicates(ctx: AuditContext) -> list[Finding]:
    """Rows whose prompt and completion equal an earlier row's (case and whitespace ignored)."""
    first: dict[str, str] = {}
    copies: dict[str, str] = {}
    for example, key in zip(ctx.examples, _train_keys(ctx), strict=True):
        if example.id in ctx.untrained_ids:  # never trained: not trained twice
            continue
        if key in first:
            copies[example.id] = first[key]
        else:
            first[key] = example.id
    if not copies:
        return []
    ids = list(copies)
    title = f"{share(len(ids), len(ctx.examples))} are exact copies of earlier rows (trained twice as often)"
    fix = f"drop rows {id_list(ids)} (each repeats the row named in values.copy_of)"
    return [Finding("duplicate", "warning", title, fix, ids, {"copy_of": copies})]


@check("near_duplicate")
def near_duplicates(ctx: AuditContext) -> list[Finding]:
    """Rows ≥ 80% similar (Jaccard of 4-token shingles of the rendered rows) to an earlier row: MinHash LSH
    finds candidates, the exact Jaccard of the two rows confirms them."""
    keys = _train_keys(ctx)
    grams = shingle_hashes([r.input_ids for r in ctx.rendered])
    near: dict[str, tuple[str, float]] = {}
    exact_seen: set[str] = set()
    signatures = minhash_signatures(grams)
    candidates = lsh_candidates(signatures)
    untrained = {i for i, e in enumerate(ctx.examples) if e.id in ctx.untrained_ids}  # never trained: no twin
    for index, example in enumerate(ctx.examples):
        if index in untrained or keys[index] in exact_seen:
            continue  # an exact copy: reported by `duplicate`
        exact_seen.add(keys[index])
        likely = [i for i in _likely(candidates.get(index), signatures, index) if i not in untrained]
        best = _best_match(likely, grams, index, keys)
        if best is not None:
            near[example.id] = (ctx.examples[best[0]].id, round(best[1], 3))
    if not near:
        return []
    ids = list(near)
    title = f"{share(len(ids), len(ctx.examples))} are near duplicates (≥ {NEAR:.0%} similar) of earlier rows"
    fix = f"deduplicate: drop or rewrite rows {id_list(ids)} (values.similar_to names each row's twin)"
    return [Finding("near_duplicate", "info", title, fix, ids, {"similar_to": near, "threshold": NEAR})]


def _likely(candidates: set[int] | None, signatures: np.ndarray, index: int) -> list[int]:
    """Candidates whose MinHash estimate of the Jaccard is within reach of NEAR (64 permutations: sd ≈ 0.05),
    so the exact comparison runs on few pairs."""
    if not candidates:
        return []
    others = np.fromiter(candidates, dtype=np.int64)
    estimate = (signatures[others] == signatures[index]).mean(axis=1)  # (C,)
    return others[estimate >= NEAR - ESTIMATE_SLACK].tolist()


def _best_match(
    candidates: Iterable[int], grams: tuple[np.ndarray, np.ndarray], index: int, keys: list[str]
) -> tuple[int, float] | None:
    if not candidates:
        return None
    best: tuple[int, float] | None = None
    mine = row_shingles(grams, index)
    for other in candidates:
        if keys[other] == keys[index]:
            continue
        theirs = row_shingles(grams, other)
        score = len(mine & theirs) / max(len(mine | theirs), 1)
        if score >= NEAR and (best is None or score > best[1]):
            best = (other, score)
    return best


@check("train_eval_overlap")
def train_eval_overlap(ctx: AuditContext) -> list[Finding]:
    """Train rows whose prompt is also an eval prompt (case and whitespace ignored): the eval then measures
    memory, not skill. `same_answer_ids` are the rows whose completion equals the eval reference too."""
    if not ctx.eval_examples:
        return []
    eval_by_prompt: dict[str, list[str]] = defaultdict(list)
    eval_keys = set()
    for example in ctx.eval_examples:
        eval_by_prompt[normalised(example.prompt_text or example.text)].append(example.id)
        eval_keys.add(_key(example))
    pairs = {e.id: eval_by_prompt[p] for e in ctx.trained()
             if (p := normalised(e.prompt_text or e.text)) in eval_by_prompt}
    if not pairs:
        return []
    ids = list(pairs)
    same = [e.id for e in ctx.examples if e.id in pairs and _key(e) in eval_keys]
    eval_ids = sorted({i for found in pairs.values() for i in found}, key=_natural)
    title = (f"{share(len(ids), len(ctx.examples))} of train ask an eval prompt ({len(same)} with the eval answer "
             f"too), covering {len(eval_ids)} of {len(ctx.eval_examples)} eval rows")
    fix = f"drop train rows {id_list(ids)} (or remove eval rows {id_list(eval_ids)}) so the eval is held out"
    values = {"eval_ids": eval_ids, "same_answer_ids": same, "pairs": pairs}
    return [Finding("train_eval_overlap", "warning", title, fix, ids, values)]


def _natural(example_id: str) -> tuple[int, str]:
    return (int(example_id), "") if example_id.isdigit() else (1 << 62, example_id)


def shingle_hashes(token_rows: list[list[int]], width: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """64-bit hashes of every `width`-token window of every row (from the rendered ids: no re-tokenizing),
    concatenated, and where each row's windows start. Each row is padded with `width - 1` sentinels, so a row
    of n tokens has max(n, 1) windows."""
    sentinel = [2**62]
    counts = np.array([max(len(t), 1) for t in token_rows], dtype=np.int64)  # (N,) windows per row
    padded = np.fromiter(chain.from_iterable((t or sentinel) + sentinel * (width - 1) for t in token_rows),
                         dtype=np.uint64, count=int(counts.sum()) + (width - 1) * len(token_rows))  # (L,)
    windows = np.zeros(len(padded) - width + 1, dtype=np.uint64)
    for offset in range(width):  # polynomial hash of each window; uint64 wraps, which is fine for hashing
        windows = windows * np.uint64(1_000_003) + padded[offset:len(padded) - width + 1 + offset]
    row_starts = np.r_[0, np.cumsum(counts + width - 1)[:-1]]  # (N,) in padded
    keep = np.concatenate([np.arange(start, start + count) for start, count in zip(row_starts, counts, strict=True)])
    return windows[keep], np.r_[0, np.cumsum(counts)[:-1]]


def row_shingles(grams: tuple[np.ndarray, np.ndarray], index: int) -> set[int]:
    hashes, starts = grams
    end = starts[index + 1] if index + 1 < len(starts) else len(hashes)
    return set(hashes[starts[index]:end].tolist())


def minhash_signatures(grams: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """MinHash signatures (N, NUM_PERM): per permutation k, the min over a row's shingles of (a_k h + b_k) >> 32
    (seeded multiply-shift hashing), one vectorised pass over every shingle of every row per permutation."""
    rng = np.random.default_rng(SEED)
    a = rng.integers(1, 2**63, NUM_PERM, dtype=np.uint64) | np.uint64(1)  # (P,) odd multipliers
    b = rng.integers(0, 2**63, NUM_PERM, dtype=np.uint64)  # (P,)
    hashes, starts = grams  # (S,) every shingle of every row, (N,) where each row's shingles start
    out = np.empty((NUM_PERM, len(starts)), dtype=np.uint64)
    permuted = np.empty_like(hashes)
    for k in range(NUM_PERM):
        np.multiply(hashes, a[k], out=permuted)
        permuted += b[k]
        permuted >>= np.uint64(32)
        out[k] = np.minimum.reduceat(permuted, starts)  # (N,)
    return out.T


def lsh_candidates(signatures: np.ndarray) -> dict[int, set[int]]:
    """For each row, earlier rows sharing an LSH band with it: the first row of each shared bucket and the
    row just before it there. Bands are sized by datasketch's `MinHashLSH` for `LSH_THRESHOLD`."""
    lsh = MinHashLSH(threshold=LSH_THRESHOLD, num_perm=NUM_PERM)
    rows, partners = [], []
    for start, end in lsh.hashranges:
        band = np.ascontiguousarray(signatures[:, start:end]).view(f"V{8 * (end - start)}").ravel()  # (N,)
        _, bucket = np.unique(band, return_inverse=True)
        order = np.argsort(bucket, kind="stable")  # rows grouped by bucket, in file order inside a bucket
        grouped = bucket[order]
        same = np.flatnonzero(grouped[1:] == grouped[:-1]) + 1  # positions whose previous row shares the bucket
        first = np.maximum.accumulate(np.where(np.r_[True, grouped[1:] != grouped[:-1]], np.arange(len(order)), 0))
        rows += [order[same], order[same]]
        partners += [order[same - 1], order[first[same]]]
    candidates: dict[int, set[int]] = defaultdict(set)
    if rows:
        for row, partner in zip(np.concatenate(rows).tolist(), np.concatenate(partners).tolist(), strict=True):
            candidates[row].add(partner)
    return candidates
