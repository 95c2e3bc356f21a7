"""The capability the fine-tune lost, applied to the training targets themselves: rows that teach the failure.

A model trained on completions that fail the capability learns to fail it. Only capabilities that score an
answer on its own (`needs_reference` false: `json_formatting`, `regex:`, `json_schema:`, most plug-ins) can
judge a training completion; `exact_match` and friends compare with a reference and are skipped.
"""

from __future__ import annotations

from gradian.audit.context import AuditContext
from gradian.audit.finding import Finding
from gradian.audit.registry import check
from gradian.audit.wording import id_list, share
from gradian.data.examples import Example
from gradian.data.render import eos_token_of

# A tenth of the targets failing is no longer a corner of the data: the run teaches the failure as a habit.
CRITICAL_SHARE = 0.10
EXAMPLES_SHOWN = 3


def target_text(example: Example, eos: str | None) -> str | None:
    """What the row teaches the model to answer, as the capability reads an answer: the completion (or the
    assistant's content), without a literal EOS at its end; None for `text` rows, which have no answer part."""
    if example.shape == "text":
        return None
    completion = example.completion
    if isinstance(completion, list):
        completion = "\n".join(str(m.get("content") or "") for m in completion if m.get("role") == "assistant")
    if completion is None:
        return None
    text = completion.strip()
    return text.removesuffix(eos).rstrip() if eos else text


@check("fails_capability")
def fails_capability(ctx: AuditContext) -> list[Finding]:
    """Training completions that fail the capability being measured (the audit is given one)."""
    capability = ctx.capability
    if capability is None or capability.needs_reference:
        return []
    eos = eos_token_of(ctx.tokenizer, ctx.setup)
    targets = [(e.id, text) for e in ctx.trained() if (text := target_text(e, eos)) is not None]
    failing = [(row_id, text) for row_id, text in targets if not capability.passes(text, None)]
    if not failing:
        return []
    ids = [row_id for row_id, _ in failing]
    severity = "critical" if len(ids) >= CRITICAL_SHARE * len(targets) else "warning"
    title = (f"{len(ids)} of {len(targets)} training completions fail {capability.name} "
             f"({100 * len(ids) / len(targets):.1f}%): the fine-tune is taught the failure it shows")
    fix = (f"fix or drop rows {id_list(ids)} so that every completion passes {capability.name} "
           f"(check them with the same capability before training)")
    values = {"capability": capability.name, "failing": len(ids), "scored": len(targets),
              "share": share(len(ids), len(targets)),
              "examples": [{"id": row_id, "completion": text[:200]} for row_id, text in failing[:EXAMPLES_SHOWN]]}
    return [Finding("fails_capability", severity, title, fix, ids, values)]
