"""Tokens the base model never learned: an instruct chat template on a base model, a doubled BOS,
tokens added to the tokenizer without trained embeddings."""

from __future__ import annotations

import re
from typing import Any

from gradian.audit.context import AuditContext
from gradian.audit.finding import Finding
from gradian.audit.registry import check
from gradian.audit.wording import id_list, share

INSTRUCT_NAME = re.compile(r"(instruct|chat|-it\b|-it-|sft|dpo|rlhf|assistant)", re.I)
EMBEDDING_MODULES = ("embed_tokens", "lm_head", "wte", "embed_in", "embed_out", "word_embeddings")


def _model_name(ctx: AuditContext) -> str:
    names = [ctx.base_ref.spec if ctx.base_ref else "", getattr(ctx.base_config, "_name_or_path", "") or "",
             ctx.adapter_config.get("base_model_name_or_path") or ""]
    return " ".join(str(n) for n in names)


def _looks_instruct(ctx: AuditContext) -> bool:
    return bool(INSTRUCT_NAME.search(_model_name(ctx)))


def _added_token_ids(ctx: AuditContext) -> dict[int, str]:
    """Added tokens other than the usual specials (bos/eos/pad/unk), which every base model was trained with."""
    standard = {ctx.tokenizer.bos_token_id, ctx.tokenizer.eos_token_id, ctx.tokenizer.unk_token_id, ctx.tokenizer.pad_token_id,
                getattr(ctx.base_config, "bos_token_id", None), getattr(ctx.base_config, "pad_token_id", None)}
    standard |= ctx.end_ids
    decoder: dict[int, Any] = getattr(ctx.tokenizer, "added_tokens_decoder", {}) or {}
    return {i: str(t) for i, t in decoder.items() if i not in standard}


def _trains_embeddings(ctx: AuditContext) -> bool:
    config = ctx.adapter_config
    modules = " ".join(str(m) for m in (config.get("modules_to_save") or []))
    targets = str(config.get("target_modules") or "")
    return bool(config.get("trainable_token_indices")) or any(m in modules or m in targets for m in EMBEDDING_MODULES)


def _used_ids(ctx: AuditContext, wanted: set[int]) -> dict[int, list[str]]:
    used: dict[int, list[str]] = {}
    for row in ctx.rendered:
        for token in wanted.intersection(row.input_ids):
            used.setdefault(token, []).append(row.example_id)
    return used


@check("chat_template_on_base")
def chat_template_on_base(ctx: AuditContext) -> list[Finding]:
    """Chat rows rendered with special turn tokens on a model whose name says it is a base model."""
    chats = [e for e in ctx.examples if e.is_conversational]
    if not chats or _looks_instruct(ctx) or _trains_embeddings(ctx):
        return []
    added = _added_token_ids(ctx)
    used = _used_ids(ctx, set(added))
    if not used:
        return []
    tokens = sorted(added[i] for i in used)
    ids = ctx.in_order({e for rows in used.values() for e in rows})
    title = (f"chat template on a base model: {share(len(ids), len(ctx.examples))} use turn tokens "
             f"{', '.join(tokens[:5])} the base model never learned to read or emit")
    fix = ("start from the instruct model, or train the new tokens (LoraConfig(modules_to_save=['embed_tokens', "
           "'lm_head']) or trainable_token_indices=[" + ", ".join(str(i) for i in sorted(used)) + "]), or format "
           "rows as plain prompt/completion text")
    return [Finding("chat_template_on_base", "warning", title, fix, ids, {"tokens": tokens, "model": _model_name(ctx)})]


@check("double_bos")
def double_bos(ctx: AuditContext) -> list[Finding]:
    """Rows that start with two BOS tokens: the text/template has one and the tokenizer adds another."""
    bos = ctx.bos_id
    if bos is None:
        return []
    ids = [r.example_id for r in ctx.rendered if len(r.input_ids) > 1 and r.input_ids[0] == r.input_ids[1] == bos]
    if not ids:
        return []
    token = ctx.tokenizer.bos_token
    title = f"{share(len(ids), len(ctx.examples))} start with BOS twice ({token}{token})"
    fix = (f"remove the literal {token!r} from the start of those rows' text (the tokenizer adds it), or drop "
           f"{{{{ bos_token }}}} from a chat template used with add_special_tokens=True; rows {id_list(ids)}")
    return [Finding("double_bos", "warning", title, fix, ids, {"bos_token": token})]


@check("untrained_added_tokens")
def untrained_added_tokens(ctx: AuditContext) -> list[Finding]:
    """Rows using token ids the base model has no trained embedding for, while the adapter does not train them."""
    vocab_size = getattr(ctx.base_config, "vocab_size", None)
    beyond = set(range(vocab_size, len(ctx.tokenizer))) if isinstance(vocab_size, int) else set()
    added = set(_added_token_ids(ctx)) if not _looks_instruct(ctx) else set()
    if _trains_embeddings(ctx) or not (beyond | added):
        return []
    used = _used_ids(ctx, beyond | added)
    if not used or (not set(used) & beyond and any(e.is_conversational for e in ctx.examples)):
        return []  # chat tokens on a base model are reported by chat_template_on_base
    ids = ctx.in_order({e for rows in used.values() for e in rows})
    over = sorted(set(used) & beyond)
    severity = "critical" if over else "warning"
    tokens = [ctx.tokenizer.convert_ids_to_tokens(i) for i in sorted(used)]
    title = (f"{share(len(ids), len(ctx.examples))} use added tokens {', '.join(tokens[:5])} whose embeddings were "
             + ("never allocated in the base model" if over else "never trained") + " and the adapter does not train")
    fix = ("train them: LoraConfig(trainable_token_indices=[" + ", ".join(str(i) for i in sorted(used)) + "]) or "
           "modules_to_save=['embed_tokens', 'lm_head'] (after model.resize_token_embeddings(len(tokenizer)))")
    return [Finding("untrained_added_tokens", severity, title, fix, ids, {"tokens": tokens, "vocab_size": vocab_size})]
