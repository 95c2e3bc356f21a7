"""Robust ranking: the gradient's harm joined with how relevant each row is to the failing inputs, by one rule.

Text or representation similarity says which rows are *about* the failing inputs; the gradient says which rows
*push toward* the failure. Neither alone is enough where a category's rows are mostly cut and partly clean: the
gradient ranks some rows of other categories (large, unrelated gradients that happen to align with the queries)
above the culprits, and similarity cannot tell the culprits from their clean neighbours, which the gradient
ranks as the most helpful rows of all. Together they can. The rule, the same on every run:

    score_i = z(harm_i) + R_i,        R_i = Σ_k w_k · s_k(i) / max(1, Σ_k w_k)

- harm_i = −(mean effect over the failing queries); z = robust z-score, (x − median) / (1.4826 · MAD), so every
  part sits on the scale of its own bulk whatever its units (cosines of hidden states all near 1, TF-IDF mostly
  near 0, effects of any size);
- s_k = z(relevance of kind k) (TF-IDF, RepSim), unbounded on purpose: where the failing prompts are about one
  topic, the rows about it stand many robust deviations above the bulk and so come before the other topics' rows
  whose large gradients happen to align with the queries (ranks bounded at ±3, tried first, let those rows win),
  and the gradient then orders the rows within the topic, culprits above their clean neighbours;
- w_k in [0, 1], how much kind k counts, from one check that reads no ground truth: *does it separate?* On the
  eval prompts, kind k's vectors tell the failing prompts from the passing ones with a leave-one-out AUC (each
  prompt's similarity to the other failing prompts minus its similarity to the passing ones): w = 2·AUC − 1,
  clipped to [0, 1]. Failures spread over every topic (a format taught by rows about other topics) give
  AUC ≈ 0.5 and w ≈ 0, so relevance cannot drown the gradient there; with w = 0 for every kind the ranking is
  the gradient's alone, exactly.

Not a check: whether the gradient agrees with the relevance. Where a category is half clean, or its culprits'
gradients are weak beside other rows' (a 5% cluster), the relevant rows look no more harmful than the rest on
average (their clean rows are the most helpful of all), so an agreement test drops relevance where it is needed
most (tried: a one-sided Spearman test turned it off on a half-clean synthetic world). ρ(harm, relevance) is
reported beside each weight instead. The price: failing prompts about one topic whose culprits are rows about
another would push that topic's clean rows up; the suite's benchmark says whether that happens.

The effects the clusters and the verdict read are shifted by the same amount in effect units,
e'_{q,i} = e_{q,i} − scale · R_i (scale = 1.4826 · MAD of harm), so mean_q e' = −(median + scale · score): ranking
by e' is ranking by the score, and a run whose relevance does not count keeps its effects unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.stats import spearmanr
from sklearn.metrics import roc_auc_score

from gradian.scores.scoring import total_effect

MAD_TO_SIGMA = 1.4826
RELEVANCE_AGGREGATE = "mean"  # a row's relevance: its mean over the failing queries (max fell to 0.36 on format-cluster)


@dataclass
class Relevance:
    """One relevance kind: per training row (aggregated over the failing queries), and the eval prompts' vectors
    in the same representation with which of them fail (for the separation check)."""

    kind: str
    train: np.ndarray  # (N,)
    eval_vectors: np.ndarray  # (E, d), any scale: compared by cosine
    failing: np.ndarray  # (E,) bool


@dataclass
class Ranking:
    """The ranking attribution reports: `effects` (Q, N) for the clusters and the verdict, and the parts."""

    rank: str
    effects: np.ndarray  # (Q, N) what clusters, verdict and report read (negative = harmful)
    gradient_effect: np.ndarray  # (N,) the gradient's mean effect over the queries
    score: np.ndarray  # (N,) higher = more likely a culprit
    relevance: dict[str, np.ndarray] = field(default_factory=dict)  # kind -> (N,)
    checks: dict[str, dict[str, float]] = field(default_factory=dict)  # kind -> auc, rho, p, weight

    def row_fields(self) -> dict[str, np.ndarray]:
        """Per-row numbers for report.json beside `effect`: the gradient's effect, each relevance, the score."""
        fields = {"gradient_effect": self.gradient_effect, "rank_score": self.score}
        return {**fields, **{f"relevance_{kind}": values for kind, values in self.relevance.items()}}

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "checks": self.checks,
                "rows": {name: values.tolist() for name, values in self.row_fields().items()}}


def robust_z(values: np.ndarray) -> tuple[np.ndarray, float, float]:
    """(z, median, scale): (x − median) / (1.4826 · MAD); the standard deviation when MAD is 0, else 1."""
    values = np.asarray(values, dtype=np.float64)
    median = float(np.median(values))
    scale = MAD_TO_SIGMA * float(np.median(np.abs(values - median)))
    scale = scale if scale > 0 else (float(values.std()) or 1.0)
    return (values - median) / scale, median, scale


def separation_auc(eval_vectors: np.ndarray, failing: np.ndarray) -> float:
    """Leave-one-out AUC of telling the failing eval prompts from the passing ones by similarity; 0.5 if undefined.

    Each prompt scores mean cosine to the other failing prompts minus mean cosine to the other passing ones.
    """
    failing = np.asarray(failing, dtype=bool)
    if failing.sum() < 2 or (~failing).sum() < 2:
        return 0.5
    vectors = np.asarray(eval_vectors, dtype=np.float64)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit = np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)
    sims = unit @ unit.T  # (E, E)
    np.fill_diagonal(sims, 0.0)
    to_failing = sims[:, failing].sum(axis=1) / (failing.sum() - failing)  # leave the prompt itself out
    to_passing = sims[:, ~failing].sum(axis=1) / ((~failing).sum() - ~failing)
    return float(roc_auc_score(failing, to_failing - to_passing))


def relevance_check(relevance: Relevance, harm: np.ndarray) -> dict[str, float]:
    """auc, the weight w = 2·AUC − 1 in [0, 1], and (reported only) Spearman ρ(harm, relevance) of one kind."""
    auc = separation_auc(relevance.eval_vectors, relevance.failing)
    rho = spearmanr(harm, relevance.train)[0]
    rho = float(rho) if np.isfinite(rho) else 0.0
    return {"auc": auc, "rho": rho, "weight": float(np.clip(2 * auc - 1, 0.0, 1.0))}


def combine(effects: np.ndarray, relevances: list[Relevance], *, gated: bool = True) -> Ranking:
    """The combined ranking of (Q, N) gradient effects and the relevance kinds (see the module docstring).

    `gated=False` counts every kind fully (w = 1): the ablation the benchmark measures the checks against.
    """
    effects = np.atleast_2d(effects)  # (Q, N); a memory map stays one
    effect = total_effect(effects)  # (N,), read in chunks
    harm_z, _, scale = robust_z(-effect)  # (N,)
    checks = {r.kind: relevance_check(r, -effect) for r in relevances}
    if not gated:
        checks = {kind: {**check, "weight": 1.0} for kind, check in checks.items()}
    weights = np.array([checks[r.kind]["weight"] for r in relevances])
    shift = np.zeros_like(effect)  # (N,) R_i
    for relevance, weight in zip(relevances, weights, strict=True):
        shift += weight * robust_z(relevance.train)[0]
    shift /= max(1.0, float(weights.sum()))
    return Ranking(
        rank="combined", effects=np.asarray(effects, dtype=np.float64) - scale * shift[None, :],  # (Q, N)
        gradient_effect=effect, score=harm_z + shift,
        relevance={r.kind: np.asarray(r.train, dtype=np.float64) for r in relevances}, checks=checks,
    )


def gradient_ranking(effects: np.ndarray) -> Ranking:
    """The gradient's ranking alone: the effects as given (a memory map stays one), the score its robust z of harm."""
    effects = np.atleast_2d(effects)  # (Q, N)
    effect = total_effect(effects)  # (N,)
    return Ranking(rank="gradient", effects=effects, gradient_effect=effect, score=robust_z(-effect)[0])


def relevance_parts(
    model: Any, examples: list[Any], rendered: list[Any], rows: list[Any], query_ids: list[str], *,
    batch_size: int = 16,
) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per kind (tfidf, repsim): the (N, Q) similarity of every training row to the failing eval rows the queries
    come from, the (E, d) eval prompts' vectors and which of them fail (E,).

    `rows` are the regression's rows (every eval prompt, passing or failing: the separation check needs both);
    `query_ids` the failing ones that became queries. TF-IDF compares a training row's text to the failing
    prompts; RepSim a training row as trained to the failing prompt with the fine-tuned model's own answer; the
    separation check reads the prompts alone in both representations (what the failing inputs are about).
    """
    from gradian.scores.relevance import cosine, mean_hidden_states, tfidf_vectors

    chosen = set(query_ids)
    queries = [row for row in rows if row.id in chosen]
    failing = np.array([row.id in chosen for row in rows])  # (E,)
    train_text, eval_text = tfidf_vectors([e.text for e in examples], [row.prompt for row in rows])
    tfidf = np.asarray((train_text @ eval_text[np.flatnonzero(failing)].T).toarray())  # (N, Q)
    train_states = mean_hidden_states(model, [r.input_ids for r in rendered], batch_size=batch_size)  # (N, d)
    answers = mean_hidden_states(model, [list(r.prompt_ids) + list(r.finetuned.ids) for r in queries],
                                 batch_size=batch_size)  # (Q, d)
    prompts = mean_hidden_states(model, [list(r.prompt_ids) for r in rows], batch_size=batch_size)  # (E, d)
    return {"tfidf": (tfidf, eval_text.toarray(), failing),
            "repsim": (cosine(train_states, answers), prompts, failing)}


def relevances_from(parts: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]], how: str) -> list[Relevance]:
    """One `Relevance` per kind of `relevance_parts`, each row's similarities aggregated over the queries (`how`)."""
    from gradian.scores.relevance import aggregate

    return [Relevance(kind, aggregate(sim, how), vectors, failing) for kind, (sim, vectors, failing) in parts.items()]


def rank_rows(rank: str, effects: np.ndarray, model: Any, audit: Any, regression: Any, pairs: list[Any], *,
              batch_size: int = 16) -> Ranking:
    """`attribute`'s ranking: the gradient's alone, or combined with the relevances of its failing eval rows."""
    if rank == "gradient":
        return gradient_ranking(effects)
    parts = relevance_parts(model, audit.examples, audit.rendered, regression.rows, [pair.eval_id for pair in pairs],
                            batch_size=batch_size)
    return combine(effects, relevances_from(parts, RELEVANCE_AGGREGATE))
