"""Does the model ever learn to stop? EOS must be the last supervised token of every row."""

from __future__ import annotations

from typing import Any

from gradian.audit.context import AuditContext
from gradian.audit.finding import Finding
from gradian.audit.registry import check
from gradian.audit.wording import id_list, share
from gradian.data.render import Rendered


def _supervises(row: Rendered, end_ids: set[int]) -> bool:
    """Some end token carries loss (not necessarily the last label: chat templates add "\\n" after EOS)."""
    return not end_ids.isdisjoint(row.labels)  # IGNORE is never a token id


def _eos_masked_by_collator(row: Rendered, ctx: AuditContext) -> bool:
    """The row holds EOS, but a collator that masks pad ids (pad == eos) hid every EOS label."""
    return bool(ctx.setup.collator_masks_pad) and ctx.pad_id == ctx.eos_id and ctx.eos_id in row.input_ids \
        and not _supervises(row, {ctx.eos_id})


@check("missing_eos")
def missing_eos(ctx: AuditContext) -> list[Finding]:
    """Rows in which no end token carries loss (rows cut by max_length are reported by truncation)."""
    trained = [r for r in ctx.rendered if not r.dropped and not r.tail_cut]
    missing = [r for r in trained if not _supervises(r, ctx.end_ids) and not _eos_masked_by_collator(r, ctx)]
    if not missing:
        return []
    ids = [r.example_id for r in missing]
    stops = sorted(ctx.tokenizer.convert_ids_to_tokens(i) for i in ctx.end_ids)
    severity = "critical" if len(missing) >= 0.5 * max(len(trained), 1) else "warning"
    values: dict[str, Any] = {"model_eos": stops, "configured_eos_token": ctx.setup.eos_token, "eos_id": ctx.eos_id}
    if ctx.setup.eos_token is not None:  # the fix verify retrains with: the model's own EOS
        values["fix_settings"] = {"eos_token": None}
    if ctx.setup.eos_token is not None and ctx.eos_id not in ctx.end_ids:
        title = (f"the run's eos_token={ctx.setup.eos_token!r} (config or saved tokenizer) replaced the model's EOS "
                 f"{stops[0]!r}: "
                 f"{share(len(missing), len(trained))} never supervise {stops[0]!r}, so the model does not learn to stop")
        fix = (f"remove eos_token from the training config, or set SFTConfig(eos_token={stops[0]!r}), "
               f"the token the model stops on")
        return [Finding("missing_eos", severity, title, fix, ids, values)]
    title = f"{share(len(missing), len(trained))} never supervise EOS ({stops[0]!r}): the model does not learn to stop"
    fix = (f"end every answer with {stops[0]!r}: for messages data use a chat template that emits "
           f"{{{{ eos_token }}}} after each assistant turn inside {{% generation %}}; for strings let TRL append it, "
           f"or set SFTConfig(eos_token=...) to the token the model generates; rows {id_list(ids)}")
    return [Finding("missing_eos", severity, title, fix, ids, values)]


@check("pad_eos_masking")
def pad_eos_masking(ctx: AuditContext) -> list[Finding]:
    """pad == eos: a collator that masks pad ids also masks every real EOS."""
    if ctx.pad_id is None or ctx.pad_id != ctx.eos_id:
        return []
    masks = ctx.setup.collator_masks_pad
    if masks is False:
        return []
    token = ctx.tokenizer.convert_ids_to_tokens(ctx.eos_id)
    ids = [r.example_id for r in ctx.rendered if _eos_masked_by_collator(r, ctx)] if masks else []
    fix = ("give the tokenizer a distinct pad token (tokenizer.pad_token = an unused token such as "
           "'<|finetune_right_pad_id|>' or '<pad>', and SFTConfig(pad_token=...)), or use TRL ≥ 0.17's own "
           "collator, which pads labels by position")
    values = {"pad_token": token, "pad_id": ctx.pad_id, "collator_masks_pad": masks}
    if masks:
        title = (f"pad == eos ({token!r}) and the collator masks pad ids: EOS is masked in "
                 f"{share(len(ids), len(ctx.rendered))}, so the model never learns to stop")
        return [Finding("pad_eos_masking", "critical", title, fix, ids, values)]
    title = (f"pad == eos ({token!r}); if the collator masks pad ids (transformers' DataCollatorForLanguageModeling, "
             f"TRL < 0.17) every EOS label is hidden")
    fix += "; add `data_collator: <class name>` to the config so Gradian can tell"
    return [Finding("pad_eos_masking", "warning", title, fix, [], values)]
