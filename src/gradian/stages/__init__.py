"""The stages of `attribute`, in order: plain objects in, plain objects out, each a resumable artifact in `out`.

    with output_folder(settings):  # created and locked for the run
        audit = run_audit(settings)  # findings.json
        given = served_inputs(settings, audit)  # the served answers and folder, with --served-*: checked early
        model, tokenizer = load(settings, audit)
        prepared = prepare(settings, audit, model)  # optimizer.pt and checkpoints, read before anything long
        measured = regression(settings, audit, model, tokenizer)  # generations.jsonl
        as_served = served(settings, audit, measured, tokenizer, given)  # the served regression and differences
        query = queries(settings, audit, measured, model, tokenizer, prepared)  # failing rows' pairs, v, states
        extraction = extract(settings, audit, model, prepared=prepared, query=query)  # gradients/
        scores = score(settings, extraction, model, audit, query)  # scores.npy (memory map)
        ranking = rank(settings, scores, extraction, model, audit, query)  # ranking.json
        clusters = cluster(settings, audit, extraction.store, ranking.effects)
        result = report(settings, audit, measured, query=query, ranking=ranking, clusters=clusters,
                        extraction=extraction, model=model, tokenizer=tokenizer,
                        served=as_served)  # report.json / .md / .html

`gradian.attribute` calls exactly these, in this order (and stops after `regression` inside the noise band:
`report(settings, audit, measured, served=as_served, training_noise=training_noise(settings, audit, measured, model,
tokenizer))`, the run's earlier checkpoint measured beside the refusal); run one by one they give the same report.

Under torch.distributed (`gradients.distributed`, the `ranks` argument) every process runs the audit and its shard
of `extract`; `regression` and `queries` compute on rank 0 and share with the others what extraction needs; the
stages after `extract` run on rank 0 alone.
"""

from gradian.stages.artifacts import AttributeResult, Clusters, Extraction, Prepared, Scores
from gradian.stages.extraction import captured_extraction, check_projection, check_space, extract
from gradian.stages.failures import (
    ServedInputs,
    attributes,
    queries,
    regression,
    served,
    served_inputs,
    training_noise,
)
from gradian.stages.ranking import harm_of_rows, rank, score
from gradian.stages.reporting import cluster, harm_tokens, report
from gradian.stages.run import (
    adapter_dir,
    load,
    output_folder,
    parameter_scale,
    prepare,
    run_audit,
    tokenizer_source,
    tracin_checkpoints,
    weigh_renderings,
)

__all__ = ["AttributeResult", "Clusters", "Extraction", "Prepared", "Scores", "ServedInputs", "adapter_dir", "attributes",
           "captured_extraction", "check_projection", "check_space", "cluster", "extract", "harm_of_rows",
           "harm_tokens", "load", "output_folder", "parameter_scale", "prepare", "queries", "rank", "regression",
           "report", "run_audit", "score", "served", "served_inputs", "tokenizer_source", "tracin_checkpoints",
           "training_noise", "weigh_renderings"]
