"""Where the loss falls: on the prompt (it should not), or on nothing at all (the row is dead)."""

from __future__ import annotations

import numpy as np

from gradian.audit.context import AuditContext
from gradian.audit.finding import Finding
from gradian.audit.registry import check
from gradian.audit.wording import id_list, share
from gradian.data import openai_format
from gradian.data.examples import Example
from gradian.data.render import IGNORE, Rendered
from gradian.data.setup import trainer_name


def _prompt_trained(example: Example, row: Rendered) -> bool:
    """Prompt tokens carry loss: inside the prompt span for prompt/completion rows, or every token of a chat
    that has non-assistant turns."""
    if example.shape in ("prompt_completion", "conversational_prompt_completion"):
        kept_front = row.truncated_tokens if not row.tail_cut else 0  # keep_end cut the row's start away
        span = row.labels[: max(row.prompt_length - kept_front, 0)]
        return span.count(IGNORE) != len(span)
    if example.shape == "messages":
        has_prompt = any(m.get("role") != "assistant" for m in example.fields["messages"])
        return has_prompt and row.supervised == len(row.labels)
    return False


@check("prompt_loss")
def prompt_loss(ctx: AuditContext) -> list[Finding]:
    """Rows whose prompt is trained as if it were the answer."""
    hits = [(e, r) for e, r in ctx.rows if not r.dropped and _prompt_trained(e, r)]
    if not hits:
        return []
    ids = [e.id for e, _ in hits]
    fractions = np.array([r.label_fraction for _, r in hits], dtype=np.float64)
    chats = sum(e.shape == "messages" for e, _ in hits)
    plain = len(hits) - chats
    severity = "critical" if plain >= 0.5 * len(ctx.examples) else "warning"
    fixes = []
    if plain:
        fixes.append("set SFTConfig(completion_only_loss=True) (or leave it unset for prompt/completion rows); "
                     "axolotl: train_on_inputs: false")
    if chats:
        fixes.append("set SFTConfig(assistant_only_loss=True) with a chat template that marks assistant turns "
                     "with {% generation %}")
    title = (f"{share(len(hits), len(ctx.examples))} train on their prompt "
             f"(median {np.median(fractions):.0%} of tokens carry loss)")
    values = {"median_label_fraction": float(np.median(fractions)), "messages_rows": chats, "prompt_rows": plain,
              "fix_settings": {"completion_only_loss": True}}
    return [Finding("prompt_loss", severity, title, "; ".join(fixes), ids, values)]


@check("no_loss")
def no_loss(ctx: AuditContext) -> list[Finding]:
    """Rows with no supervised token: the trainer drops them (or, in older versions, trains on nothing)."""
    dead = [(e, r) for e, r in ctx.rows if r.dropped and r.over_limit != "held_out"
            and not (ctx.setup.drop_overlong and r.truncated_tokens)]
    if not dead:
        return []
    ids = [e.id for e, _ in dead]
    by_truncation = [r for _, r in dead if r.truncated_tokens > 0]
    severity = "critical" if len(dead) >= 0.5 * len(ctx.examples) else "warning"
    fixes = []
    if by_truncation:
        need = max(r.prompt_length for r in by_truncation) + 1
        fixes.append(f"the prompt alone fills max_length={ctx.setup.max_length}: raise it to ≥ {need} "
                     f"or shorten those prompts")
    if len(by_truncation) < len(dead) and ctx.setup.framework == openai_format.FRAMEWORK:
        fixes.append("every assistant turn carries weight 0: set weight 1 on the turns to train, or drop the rows")
    elif len(by_truncation) < len(dead):
        fixes.append("no token is marked as answer: with assistant_only_loss=True the chat template needs "
                     "{% generation %} around assistant turns; empty completions must be filled or dropped")
    title = f"{share(len(dead), len(ctx.examples))} carry no loss at all and train nothing"
    fix = "; ".join(fixes) + f" (rows {id_list(ids)})"
    values = {"by_truncation": len(by_truncation), "no_answer_tokens": len(dead) - len(by_truncation)}
    return [Finding("no_loss", severity, title, fix, ids, values)]


@check("weight_ignored")
def weight_ignored(ctx: AuditContext) -> list[Finding]:
    """Rows whose assistant turns carry OpenAI's `weight: 0`, trained by a trainer that ignores the key."""
    if ctx.setup.framework == openai_format.FRAMEWORK:
        return []
    hits = [(e, turns) for e in openai_format.weighted_rows(ctx.examples)
            if (turns := openai_format.untrained_turns(e))]
    if not hits:
        return []
    ids = [e.id for e, _ in hits]
    turns = sum(n for _, n in hits)
    trainer = trainer_name(ctx.setup.framework, ctx.setup.framework_version)
    title = (f"{share(len(ids), len(ctx.examples))} mark {turns} assistant turns `weight: 0` (OpenAI's format), "
             f"which {trainer} ignores: those turns were trained")
    fix = (f"remove the weight-0 turns from rows {id_list(ids)} (or end each conversation before them) if they should "
           "not be trained: only OpenAI's service reads the key")
    return [Finding("weight_ignored", "warning", title, fix, ids, {"rows": len(ids), "turns": turns})]
