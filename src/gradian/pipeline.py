"""`attribute`: audit → regression (and as served) → queries → gradients → scores → ranking → clusters → report, in `out`.

The stages (`gradian.stages`) called in order, nothing else: the CLI calls `attribute(settings, say=, bar=)`, so
can a notebook, and the stages run one by one give the same report. Each stage writes its artifact into the output
folder; a rerun reuses cached generations and the gradient store. Under `torchrun` / `accelerate launch` every
process runs the audit and its shard of the extraction; rank 0 alone holds the output lock, generates, scores,
ranks, clusters and reports (the others return None).
"""

from __future__ import annotations

from collections.abc import Callable

from gradian.gradients.distributed import Ranks, join
from gradian.gradients.point import adapter_point, gradient_point
from gradian.settings import AttributeSettings
from gradian.stages import (
    AttributeResult,
    attributes,
    check_projection,
    check_space,
    cluster,
    extract,
    load,
    output_folder,
    prepare,
    queries,
    rank,
    regression,
    report,
    run_audit,
    score,
    served,
    served_inputs,
    training_noise,
    weigh_renderings,
)
from gradian.stages.artifacts import Bar

__all__ = ["AttributeResult", "attribute"]

Say = Callable[[str], None]


def attribute(settings: AttributeSettings, *, say: Say | None = None, bar: Bar | None = None,
              ranks: Ranks | None = None) -> AttributeResult | None:
    """Run every stage; `say` reports the stage, `bar(iterable, label)` wraps long loops in a progress bar.

    Returns None on every rank but 0 under torch.distributed (`ranks`, else the launcher's environment).
    """
    ranks = ranks or join()
    say = say or (lambda _: None)
    with output_folder(settings, ranks):
        say("audit: rendering the rows as trained and running the checks")
        audit = run_audit(settings, write=ranks.is_main)
        given = ranks.main_only(lambda: served_inputs(settings, audit))  # a bad served file stops us before loading

        say("regression: generating with the base and the fine-tuned model")
        model, tokenizer = load(settings, audit, ranks)
        audit = weigh_renderings(settings, audit, model, write=ranks.is_main)  # EOS after the cut, by the fine-tune
        prepared = prepare(settings, audit, model)  # reads optimizer.pt and checkpoints now: a bad one stops us early
        check_projection(settings, model)  # before generating, as is the disk check
        check_space(settings, audit, len(prepared.checkpoints), len(audit.eval_examples or []))  # before generating
        measured = regression(settings, audit, model, tokenizer, bar=bar, ranks=ranks)
        if measured is not None and measured.cached:
            say("regression: the answers kept in the output folder were reused; only their scores were computed again")
        if settings.served_outputs is not None:
            say("served: scoring the served answers and diffing the served path with training's")
        as_served = served(settings, audit, measured, tokenizer, given, ranks)
        if not attributes(settings, measured, ranks):
            if not ranks.is_main:
                return None
            say("regression: inside the noise band; measuring the run's earlier checkpoint beside it, then stopping")
            noise = training_noise(settings, audit, measured, model, tokenizer, bar=bar) if measured is not None \
                else None
            return report(settings, audit, measured, served=as_served, training_noise=noise)

        point = gradient_point(settings, prepared.checkpoints)
        with adapter_point(model, point):  # the gradient stages read the adapter there (B × point)
            query = queries(settings, audit, measured, model, tokenizer, prepared, ranks=ranks)
            say((f"gradients: the gradients GradianCallback captured in training, {len(audit.rendered)} training rows"
                 if settings.checkpoints == "captured" else
                 f"gradients: per-example LoRA gradients of {len(audit.rendered)} training rows")
                + (f", read with the adapter's B × {point:g}" if point != 1.0 else "")
                + (f", {ranks.world} processes" if ranks.world > 1 else "")
                + (", with their harmful positions" if query.harm_direction is not None else "")
                + (", with their RepSim" if query.states is not None else ""))
            extraction = extract(settings, audit, model, ranks=ranks, bar=bar, prepared=prepared,
                                 query=query)
            if not ranks.is_main:
                return None  # rank 0 scores, ranks, clusters and reports

            over = (f", TracIn-CP over {len(extraction.checkpoints)} checkpoints" if extraction.checkpoints else
                    f", TracIn over {extraction.captured_steps} captured steps" if extraction.captured_steps else "")
            say(f"scores: {len(query.pairs)} failing eval rows, {settings.query} query, {settings.preconditioner} "
                f"preconditioner{over}")
            scores = score(settings, extraction, model, audit, query, bar=bar)
            if query.row_harm == "tokens":
                say("scores: each training row's harmful tokens, one forward-mode pass per batch")
            if settings.rank == "activation":
                say("ranking: the base model's answers to the training prompts and the rows' activation differences")
            ranking = rank(settings, scores, extraction, model, audit, query, bar=bar, tokenizer=tokenizer)
            say("clusters: grouping and naming the training rows")
            clusters = cluster(settings, audit, extraction.store, ranking.effects)
            return report(settings, audit, measured, query=query, ranking=ranking, clusters=clusters,
                          extraction=extraction, model=model, tokenizer=tokenizer, served=as_served)
