"""Robust ranking: the gradient's harm joined with how relevant each row is to the failing inputs, by one rule.

Text or representation similarity says which rows are *about* the failing inputs; the gradient says which rows
*push toward* the failure. Neither alone is enough where a category's rows are mostly cut and partly clean: the
gradient ranks some rows of other categories (large, unrelated gradients that happen to align with the queries)
above the culprits, and similarity cannot tell the culprits from their clean neighbours, which the gradient
ranks as the most helpful rows of all. Together they can. The rule, the same on every run:

    score_i = z(harm_i) + λ · R_i,        R_i = Σ_k w_k · s_k(i) / max(1, Σ_k w_k),        λ = 2

- harm_i = the row's harmful part along the queries' direction v: its positions' (Σ_s max(0, h_{i,s}),
  `token_harm.position_harms`, the default) or its tokens' (Σ_t max(0, vᵀ∇ℓ_{i,t}), `token_harm.row_harms`); with
  `--row-harm sum`, or TracIn-CP / another preconditioner / unit gradients: −(mean effect over the failing
  queries), every token summed. A culprit teaches one wrong decision (the early EOS, the opening fence) among many
  right ones, the rest of a valid answer its clean neighbours teach too; summed, the right tokens cancel the wrong
  one (a fenced row's JSON body pays back its fence), and the harmful part does not;
  z = robust z-score, (x − median) / (1.4826 · MAD), so every part sits on the scale of its own bulk whatever its
  units (cosines of hidden states all near 1, TF-IDF mostly near 0, effects of any size);
- s_k = z(relevance of kind k) (TF-IDF, RepSim), unbounded on purpose: where the failing prompts are about the
  culprits' topic, its rows stand many robust deviations above the bulk and so come before the other topics' rows
  whose large gradients happen to align with the queries, and the gradient then orders the rows within the topic,
  culprits above their clean neighbours;
- w_k in [0, 1], how much kind k counts, from one check that reads no ground truth: *does the relevance point
  where the gradient does?* Kind k's relevance must pick out the gradient's most harmful rows (the top 10%, at
  least 5) from the rest: w = 2·AUC − 1, clipped to [0, 1]. Where the failing prompts are about another topic than the
  culprits (a fence taught by one category's rows makes every other category fail; a format taught by rows about
  other topics), the relevant rows are not the harmful ones, AUC ≤ 0.5 and w = 0: relevance cannot drown the
  gradient there, and with w = 0 for every kind the ranking is the gradient's alone, exactly. The check looks at
  the top of the gradient's ranking, not at all rows: where a category is half clean, its clean rows are the most
  helpful of all, so a correlation over every row (tried: a one-sided Spearman test) turns relevance off where it
  is needed most; ρ(harm, relevance) is reported beside each weight;
- λ = 2 and the top 10%: at full weight one robust deviation of relevance counts as two of harm. Both chosen on
  the suite's dev half from λ in 1, 2, 3, 4, 6, 8, 16 and a top 5% or 10% by the highest dev mean (BENCHMARKS.md,
  "The ranking rule's constants"): λ = 4 and the top 5% on the summed harm, λ = 3 and 5% on the harmful tokens,
  λ = 2 and 10% on the harmful positions (each time the best grid points differ by a few thousandths: the dev
  half barely tells them apart). The rule's blind spot: where rows of other topics fill the gradient's whole top
  10%, relevance that would have helped gets no weight.

Tried before this rule, and replaced on the dev half (BENCHMARKS.md): weights from how well each kind tells the
failing eval prompts from the passing ones. That check passes wherever the passing prompts are one topic, and so
gave relevance weight on the fence families, whose failures lie away from the culprits' topic (dev 0.721 against
0.859 for this rule).

The effects the clusters and the verdict read keep which queries each row hurts and move, row by row, to its score
in effect units: e'_{q,i} = e_{q,i} − ē_i − (median + scale · score_i), median and scale the robust ones of −ē
(ē the mean effect), so mean_q e' = −(median + scale · score): ranking by e' is ranking by the score. Where the
harm is −ē this is e' = e − scale · λ · R, and a run whose relevance does not count keeps its effects unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.stats import spearmanr
from sklearn.metrics import roc_auc_score

from gradian.scores.activation import ActivationScores, ranking_agreement
from gradian.scores.scoring import distinct, total_effect

MAD_TO_SIGMA = 1.4826
RELEVANCE_AGGREGATE = "mean"  # a row's relevance: its mean over the failing queries (max fell to 0.36 on format-cluster)
RELEVANCE_SCALE = 2.0  # λ: robust deviations of harm that one of relevance counts as, at full weight (dev half)
AGREEMENT_TOP = 0.10  # the share of rows, the gradient's most harmful, that a relevance kind must pick out
AGREEMENT_MIN_ROWS = 5


@dataclass
class Relevance:
    """One relevance kind: per training row, aggregated over the failing queries."""

    kind: str
    train: np.ndarray  # (N,)


@dataclass
class Ranking:
    """The ranking attribution reports: `effects` (Q, N) for the clusters and the verdict, and the parts."""

    rank: str
    effects: np.ndarray  # (Q, N) what clusters, verdict and report read (negative = harmful)
    gradient_effect: np.ndarray  # (N,) the gradient's mean effect over the queries
    score: np.ndarray  # (N,) higher = more likely a culprit
    relevance: dict[str, np.ndarray] = field(default_factory=dict)  # kind -> (N,)
    checks: dict[str, dict[str, float]] = field(default_factory=dict)  # kind -> auc, rho, weight
    harm: np.ndarray | None = None  # (N,) the harmful positions' or tokens' part; None: the harm is −gradient_effect
    row_harm: str = "sum"  # which: positions, tokens or sum (`settings.row_harm_of`)
    row_effect: np.ndarray | None = None  # (N,) each row's mean effect as reported; None: gradient_effect
    note: str | None = None  # why the harm asked for was not used, when it was not
    activation: dict[str, Any] | None = None  # `--rank activation`: its layer, rows, queries and cost (seconds)
    agreement: dict[str, float] | None = None  # `--rank activation`: its top k's overlap with the gradient's

    @property
    def effect(self) -> np.ndarray:
        """(N,) each row's mean effect over the queries as clusters, verdict and report read it (negative =
        harmful): rows of equal score get exactly equal effects here, where the mean of `effects` may differ by a
        float step between processors."""
        return self.gradient_effect if self.row_effect is None else self.row_effect

    def row_fields(self) -> dict[str, np.ndarray]:
        """Per-row numbers for report.json beside `effect`: the gradient's effect, each relevance, the score."""
        fields = {"gradient_effect": self.gradient_effect, "rank_score": self.score}
        if self.harm is not None:
            fields["row_harm"] = self.harm
        return {**fields, **{f"relevance_{kind}": values for kind, values in self.relevance.items()}}

    def summary(self) -> dict[str, Any]:
        """How the rows were ranked, as report.json's `ranking` shows it."""
        extra = {name: value for name, value in (("activation", self.activation), ("agreement", self.agreement))
                 if value is not None}
        return {"rank": self.rank, "row_harm": self.row_harm, "checks": self.checks, **extra}

    def to_dict(self) -> dict[str, Any]:
        return {**self.summary(), "note": self.note,
                "rows": {name: values.tolist() for name, values in self.row_fields().items()}}


def robust_z(values: np.ndarray) -> tuple[np.ndarray, float, float]:
    """(z, median, scale): (x − median) / (1.4826 · MAD); the standard deviation when MAD is 0, else 1."""
    values = np.asarray(values, dtype=np.float64)
    median = float(np.median(values))
    scale = MAD_TO_SIGMA * float(np.median(np.abs(values - median)))
    scale = scale if scale > 0 else (float(values.std()) or 1.0)
    return (values - median) / scale, median, scale


def agreement_auc(relevance: np.ndarray, harm: np.ndarray, top: float = AGREEMENT_TOP) -> float:
    """AUC of `relevance` (N,) telling the `top` share of rows by `harm` (N,) (at least 5) from the rest; 0.5 when
    there are too few rows to split."""
    n_rows = len(harm)
    k = max(AGREEMENT_MIN_ROWS, round(top * n_rows))
    if k >= n_rows:
        return 0.5
    harmful = np.zeros(n_rows, dtype=bool)
    harmful[np.argsort(-np.asarray(harm), kind="stable")[:k]] = True
    return float(roc_auc_score(harmful, relevance))


def relevance_check(relevance: Relevance, harm: np.ndarray, top: float = AGREEMENT_TOP) -> dict[str, float]:
    """auc (`agreement_auc`), the weight w = 2·AUC − 1 in [0, 1], and (reported only) Spearman ρ(harm, relevance)."""
    auc = agreement_auc(relevance.train, harm, top)
    constant = np.ptp(relevance.train) == 0 or np.ptp(harm) == 0
    rho = 0.0 if constant else float(np.nan_to_num(spearmanr(harm, relevance.train)[0]))
    return {"auc": auc, "rho": rho, "weight": float(np.clip(2 * auc - 1, 0.0, 1.0))}


def combine(effects: np.ndarray, relevances: list[Relevance], *, harm: np.ndarray | None = None,
            row_harm: str = "sum", gated: bool = True, scale: float = RELEVANCE_SCALE,
            top: float = AGREEMENT_TOP) -> Ranking:
    """The combined ranking of (Q, N) gradient effects and the relevance kinds (see the module docstring).

    `harm` (N,): each row's harm where it is not −(mean effect), its harmful positions' or tokens' part, as
    `row_harm` names it;
    `gated=False` counts every kind fully (w = 1): the ablation the benchmark measures the checks against; `scale`
    (λ) and `top` are the rule's two constants, arguments for the benchmark that chose them.
    """
    effects = np.atleast_2d(effects)  # (Q, N); a memory map stays one
    effect = total_effect(effects)  # (N,), read in chunks
    given, note = _informative(harm, row_harm)  # (N,) or None
    harm = -effect if given is None else given
    checks = {r.kind: relevance_check(r, harm, top) for r in relevances}
    if not gated:
        checks = {kind: {**check, "weight": 1.0} for kind, check in checks.items()}
    weights = np.array([checks[r.kind]["weight"] for r in relevances])
    shift = np.zeros_like(effect)  # (N,) λ · R_i
    for relevance, weight in zip(relevances, weights, strict=True):
        shift += weight * robust_z(relevance.train)[0]
    shift *= scale / max(1.0, float(weights.sum()))
    score = robust_z(harm)[0] + shift
    leveled, target = _level(effects, effect, score)
    return Ranking(rank="combined", effects=leveled, gradient_effect=effect, score=score,
                   relevance={r.kind: np.asarray(r.train, dtype=np.float64) for r in relevances}, checks=checks,
                   harm=given, row_harm=row_harm if given is not None else "sum", row_effect=target, note=note)


def gradient_ranking(effects: np.ndarray, *, harm: np.ndarray | None = None, row_harm: str = "sum") -> Ranking:
    """The gradient's ranking alone, the score its robust z of harm: the effects as given (a memory map stays one)
    where `harm` is −(mean effect), else moved to `harm`'s order as `_level` does."""
    effects = np.atleast_2d(effects)  # (Q, N)
    effect = total_effect(effects)  # (N,)
    given, note = _informative(harm, row_harm)  # (N,) or None
    if given is None:
        return Ranking(rank="gradient", effects=effects, gradient_effect=effect, score=robust_z(-effect)[0],
                       note=note)
    score = robust_z(given)[0]
    leveled, target = _level(effects, effect, score)
    return Ranking(rank="gradient", effects=leveled, gradient_effect=effect, score=score, harm=given,
                   row_harm=row_harm, row_effect=target)


def activation_ranking(effects: np.ndarray, scores: ActivationScores, *, harm: np.ndarray | None = None,
                       row_harm: str = "sum") -> Ranking:
    """The rows ranked by the activation cosine (`scores.activation`): the score is the cosine, the effects the
    gradient's leveled to its robust z (a cosine is not in the harm's units: leveled to the raw cosine, every row
    would sit within one robust deviation of the harm's median), and `agreement` how far its top agrees with the
    gradient's own ranking (`gradient_ranking` with this `harm`)."""
    gradient = gradient_ranking(effects, harm=harm, row_harm=row_harm)
    effect = gradient.gradient_effect  # (N,)
    leveled, target = _level(effects, effect, robust_z(scores.cosine)[0])
    return Ranking(rank="activation", effects=leveled, gradient_effect=effect, score=np.asarray(scores.cosine),
                   harm=gradient.harm, row_harm=gradient.row_harm, row_effect=target, note=gradient.note,
                   activation=scores.to_dict(), agreement=ranking_agreement(scores.cosine, gradient.score, effect))


def _informative(harm: np.ndarray | None, row_harm: str) -> tuple[np.ndarray | None, str | None]:
    """(harm as float64, None), or (None, why) when the harm tells no row apart (every row's the same, e.g. no
    row touches a harmful position): leveling the effects to it would give every row one mean effect and erase
    the gradient's own differences, so the rows are ranked by their mean effect instead."""
    if harm is None:
        return None, None
    harm = np.asarray(harm, dtype=np.float64)
    if distinct(harm):
        return harm, None
    return None, (f"every row's {row_harm} harm is {float(harm.flat[0]) if harm.size else 0.0:.6g}: it tells no "
                  "row apart, so the rows are ranked by their mean effect")


def _level(effects: np.ndarray, effect: np.ndarray, score: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(Q, N) the effects with each row's mean moved to its score in effect units, keeping which queries it hurts,
    and (N,) that mean: e'_{q,i} = e_{q,i} − ē_i − (median + scale · score_i), median and scale the robust ones of
    −ē, so that mean_q e' = −(median + scale · score) (to a float step): ranking by e' is ranking by the score;
    where score is z(−ē), e' = e."""
    _, median, harm_scale = robust_z(-effect)
    target = -(median + harm_scale * score)  # (N,) exactly equal for rows of equal score
    return np.asarray(effects, dtype=np.float64) + (target - effect)[None, :], target


def repsim_relevance(model: Any, rendered: Sequence[Any], queries: Sequence[Any], *, batch_size: int = 16) -> np.ndarray:
    """(N, Q) RepSim of each training row as trained to each failing prompt with the fine-tuned model's own answer
    (`queries`: regression rows, with `prompt_ids` and `finetuned.ids`); `attribute` takes the same from its
    extraction's forward instead (`gradients.sides`, given `query.query_states`)."""
    from gradian.gradients.sides import cosine
    from gradian.scores.query import query_states
    from gradian.scores.relevance import mean_hidden_states

    return cosine(mean_hidden_states(model, [r.input_ids for r in rendered], batch_size=batch_size),
                  query_states(model, queries, batch_size=batch_size))


def relevance_parts(
    model: Any, examples: Sequence[Any], rendered: Sequence[Any], queries: Sequence[Any], *, batch_size: int = 16,
    repsim: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Per kind, the (N, Q) similarity of every training row to the failing eval rows the queries come from:
    TF-IDF of a training row's text to the failing prompts, and `repsim_relevance` (`repsim` when already taken)."""
    from gradian.scores.relevance import tfidf_similarity

    return {"tfidf": tfidf_similarity([e.text for e in examples], [row.prompt for row in queries]),
            "repsim": repsim if repsim is not None else repsim_relevance(model, rendered, queries,
                                                                        batch_size=batch_size)}


def relevances_from(parts: dict[str, np.ndarray], how: str) -> list[Relevance]:
    """One `Relevance` per kind of `relevance_parts`, each row's similarities aggregated over the queries (`how`)."""
    from gradian.scores.relevance import aggregate

    return [Relevance(kind, aggregate(sim, how)) for kind, sim in parts.items()]


def rank_rows(rank: str, effects: np.ndarray, model: Any, audit: Any, failing: list[Any], *,
              harm: np.ndarray | None = None, row_harm: str = "sum", repsim: np.ndarray | None = None,
              activation: ActivationScores | None = None, batch_size: int = 16) -> Ranking:
    """`attribute`'s ranking: the gradient's alone, combined with the relevances of its failing eval rows
    (`failing`: their regression rows, `query.failing_queries`), or by the activation differences `activation`
    (`scores.activation.activation_scores`, taken by the caller: it generates, and keeps its answers in the output
    folder); `harm` (N,) and `row_harm` as `combine` takes them, `repsim` (N, Q) as `relevance_parts`."""
    if rank == "gradient":
        return gradient_ranking(effects, harm=harm, row_harm=row_harm)
    if rank == "activation":
        if activation is None:
            raise ValueError("rank activation needs the rows' activation scores (scores.activation)")
        return activation_ranking(effects, activation, harm=harm, row_harm=row_harm)
    parts = relevance_parts(model, audit.examples, audit.rendered, failing, batch_size=batch_size, repsim=repsim)
    return combine(effects, relevances_from(parts, RELEVANCE_AGGREGATE), harm=harm, row_harm=row_harm)
