"""The clusters, the verdict and the report files."""

from __future__ import annotations

from typing import Any

import numpy as np

from gradian.audit import DiagnoseResult
from gradian.capabilities import get_capability
from gradian.clusters.cluster import fit_clusters
from gradian.clusters.groups import candidate_groups
from gradian.clusters.naming import name_clusters
from gradian.clusters.summary import summarize_clusters
from gradian.data.columns import ids_of, positions_of, texts_of
from gradian.data.setup import preparation
from gradian.gradients.store import FeatureStore
from gradian.regression.measure import RegressionResult
from gradian.regression.slices import worse_slice
from gradian.regression.stricter import stricter_drop
from gradian.regression.symptoms import classify_failures
from gradian.report.rows import ExampleRows
from gradian.report.schema import Attribution, Context, build_report
from gradian.report.writers import write_report
from gradian.scores.combine import Ranking
from gradian.scores.query import Query
from gradian.scores.token_harm import harm_token, token_harms
from gradian.settings import AttributeSettings
from gradian.stages.artifacts import AttributeResult, Clusters, Extraction
from gradian.stages.run import rows_source, tokenizer_source
from gradian.verdict import decide

FIT_CLUSTER_ROWS = 20000  # rows the clusters are fitted on; every row is then assigned (clusters.cluster)


def cluster(settings: AttributeSettings, audit: DiagnoseResult, features: FeatureStore | np.ndarray | None,
            effects: np.ndarray) -> Clusters:
    """Clusters fitted on a sample of the rows (text and gradient features), named on it, every row assigned."""
    texts = texts_of(audit.examples)  # two string columns, read a chunk of rows at a time
    fitted = fit_clusters(texts, features, n_clusters=settings.n_clusters, seed=settings.seed,
                          fit_rows=FIT_CLUSTER_ROWS)
    sample = fitted.embedding.sample
    names = name_clusters([texts[i] for i in sample], fitted.labels[sample])  # c-TF-IDF on the sample
    summaries = summarize_clusters(ids_of(audit.examples), fitted.labels, effects, names, audit.findings,
                                   seed=settings.seed)
    return Clusters(fitted.labels, summaries, fitted.embedding)


def report(settings: AttributeSettings, audit: DiagnoseResult, measured: RegressionResult | None, *,
           query: Query | None = None, ranking: Ranking | None = None, clusters: Clusters | None = None,
           extraction: Extraction | None = None, model: Any = None, tokenizer: Any = None,
           served: dict[str, Any] | None = None, training_noise: dict[str, Any] | None = None) -> AttributeResult:
    """The verdict and the report files (report.json / .md / .html, examples.jsonl, culprits) of `attribute`:
    the regression alone inside the noise band (with `training_noise`, `stages.failures.training_noise`, when the
    run keeps an earlier checkpoint), else the ranking's effects, the clusters and, given the model and its
    tokenizer, the token where each top row does most harm along `query.direction`; `served` is the served
    regression's block (`stages.failures.served`), which the verdict weighs first."""
    ids = ids_of(audit.examples)  # a StringColumn: no list of N ids
    summary = measured.summary.to_dict() if measured is not None else {}
    summary |= {"training_noise": training_noise} if training_noise is not None else {}
    capability = get_capability(settings.capability)
    if measured is not None and not summary.get("significant"):
        summary["stricter"] = stricter_drop(measured.rows, capability)
        summary["slice"] = worse_slice(measured.rows, audit.eval_examples or [], binary=measured.summary.binary)
    effects = ranking.effects if ranking is not None else None  # (Q, N)
    effect = None if ranking is None else ranking.effect  # (N,)
    labels = clusters.labels if clusters is not None else None
    failing = measured.failures() if measured is not None else []
    symptoms = classify_failures(failing, capability) if measured is not None else None
    shown = None  # (Q,) the symptom of each query's failing answer, in the effects' row order
    if symptoms is not None and query is not None and effects is not None and len(query.pairs) == len(effects):
        shown = [symptoms.by_id.get(pair.eval_id) for pair in query.pairs]
    groups = candidate_groups(audit.examples, audit.findings, effects, clusters.summaries if clusters else None,
                              [row.prompt for row in failing], seed=settings.seed, query_symptoms=shown)
    summaries = groups.clusters  # the same clusters, each with where the failures sit
    verdict = decide(summary, audit.findings, summaries, effect, list(ids), symptoms=symptoms, groups=groups.groups,
                     served=served, rank=ranking.rank if ranking is not None else settings.rank,
                     texts=texts_of(audit.examples))
    attribution = None if effects is None else Attribution(
        effects, labels, summaries or [], clusters.embedding if clusters is not None else None, ranking=ranking)
    run = {"setup": audit.setup.to_dict(), "preparation": preparation(audit.setup), "queries": [p.eval_id for p in query.pairs] if query else [],
           "tracin_cp": extraction.tracin if extraction is not None else None,
           "gradient_check": extraction.check.to_dict() if extraction is not None and extraction.check else None,
           "tokenizer_source": tokenizer_source(audit), "rows_source": rows_source(audit),
           "rendering_evidence": audit.rendering_evidence}
    built = build_report(summary, verdict, audit.findings, audit.examples, attribution=attribution,
                         symptoms=symptoms, groups=groups, served=served,
                         context=Context(settings=settings.to_dict(), run=run, seed=settings.seed))
    if query is not None and query.direction is not None and model is not None and built["top_rows"]:
        found = harm_tokens(settings, audit, query.direction, model, tokenizer, [row["id"] for row in built["top_rows"]])
        for row in built["top_rows"]:
            row["harm_token"] = found[row["id"]]
    rows = ExampleRows.of(ids, effect, labels, audit.findings, verdict.culprit_ids,
                          ranking.row_fields() if ranking is not None else None)
    paths = write_report(settings.out_dir, built, audit.examples, rows)
    return AttributeResult(verdict, built, paths)


def harm_tokens(settings: AttributeSettings, audit: DiagnoseResult, direction: Any, model: Any, tokenizer: Any,
                ids: list[str]) -> dict[str, dict[str, Any] | None]:
    """The token where each of these rows does most harm along `direction` (`scores.token_harm`)."""
    rows = [audit.rendered[int(i)] for i in positions_of(ids_of(audit.examples), ids)]
    harms = token_harms(model, rows, direction, batch_size=settings.batch_size)
    return {row.example_id: harm_token(tokenizer, row, harm) for row, harm in zip(rows, harms, strict=True)}
