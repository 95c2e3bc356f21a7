"""Tokens the base model never learned: an instruct chat template on a base model, a doubled BOS,
tokens added to the tokenizer whose embedding rows were never trained."""

from __future__ import annotations

import re
from typing import Any

from gradian.audit.context import AuditContext
from gradian.audit.embedding_rows import untrained_rows
from gradian.audit.finding import Finding
from gradian.audit.registry import check
from gradian.audit.wording import id_list, share
from gradian.data.embeddings import INPUT_NAMES, OUTPUT_NAMES, Matrix, adapter_matrices, base_matrices

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
    """Chat rows rendered with special turn tokens on a model whose name says it is a base model, when the
    weights cannot tell: where the tokens' embedding rows can be read, `untrained_added_tokens` decides from them
    (a base model pretrained with its turn tokens has trained rows for them)."""
    chats = [e for e in ctx.examples if e.is_conversational]
    if not chats or _looks_instruct(ctx) or _trains_embeddings(ctx):
        return []
    added = _added_token_ids(ctx)
    used = _used_ids(ctx, set(added))
    matrices = _matrices(ctx)
    if not used or all(any(m.role == "input" and m.holds(t) for m in matrices) for t in used):
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
    ids = [r.example_id for r in ctx.rendered
           if not r.dropped and len(r.input_ids) > 1 and r.input_ids[0] == r.input_ids[1] == bos]
    if not ids:
        return []
    token = ctx.tokenizer.bos_token
    title = f"{share(len(ids), len(ctx.examples))} start with BOS twice ({token}{token})"
    fix = (f"remove the literal {token!r} from the start of those rows' text (the tokenizer adds it), or drop "
           f"{{{{ bos_token }}}} from a chat template used with add_special_tokens=True; rows {id_list(ids)}")
    return [Finding("double_bos", "warning", title, fix, ids, {"bos_token": token})]


@check("untrained_added_tokens")
def untrained_added_tokens(ctx: AuditContext) -> list[Finding]:
    """Rows using added tokens whose rows in the weights were never trained: the input embedding of a token the
    rows contain, or the output row of a token they supervise, left at its initial value (decided from the rows,
    see `embedding_rows`), or never allocated at all (an id past the base model's vocabulary). A base model
    pretrained with its special tokens has trained rows for them and gets no finding."""
    added = set(getattr(ctx.tokenizer, "added_tokens_decoder", {}) or {})
    vocab_size = getattr(ctx.base_config, "vocab_size", None)
    if isinstance(vocab_size, int):
        added |= set(range(vocab_size, len(ctx.tokenizer)))
    used = _used_ids(ctx, added)
    if not used:
        return []
    matrices = _matrices(ctx)
    adapter = [m for m in matrices if m.where == "adapter"]
    config_trained = _config_trained(ctx)
    in_adapter = {t for t in used if any(m.holds(t) for m in adapter)}
    never = {t for t in used if isinstance(vocab_size, int) and t >= vocab_size and t not in in_adapter}
    never -= config_trained["input"]
    candidates = {"input": set(used) - never, "output": _supervised_ids(ctx, added) - never}
    for role, ids in candidates.items():  # what the config trains but the adapter did not save: trust the config
        saved = {t for t in ids if any(m.role == role and m.holds(t) for m in adapter)}
        candidates[role] = {t for t in ids if t not in config_trained[role] or t in saved}
    verdicts = untrained_rows(candidates, matrices, exclude=added)
    bad = sorted(never | {v.token_id for v in verdicts})
    if not bad:
        return []
    row_ids = ctx.in_order({e for t in bad for e in used.get(t, [])})
    tokens = [ctx.tokenizer.convert_ids_to_tokens(i) for i in bad]
    emitted = {v.token_id for v in verdicts if v.role == "output"}
    severity = "critical" if never or emitted else "warning"
    parts = []
    if never:
        parts.append(f"{len(never)} never allocated in the base model (ids ≥ vocab_size {vocab_size})")
    for reason in sorted({v.reason.split(" token ")[0] for v in verdicts}):
        rows = sorted({v.token_id for v in verdicts if v.reason.startswith(reason)})
        parts.append(f"{len(rows)} left at their initial value ({reason})")
    title = (f"{share(len(row_ids), len(ctx.examples))} use added tokens {', '.join(tokens[:5])} whose embedding rows "
             f"were never trained: {'; '.join(parts)}" + (", so the model cannot learn to emit them" if emitted else ""))
    fix = ("train them: LoraConfig(trainable_token_indices=[" + ", ".join(str(i) for i in bad) + "]) or "
           "modules_to_save=['embed_tokens', 'lm_head'] (after model.resize_token_embeddings(len(tokenizer)))")
    rows_seen = [{"token": ctx.tokenizer.convert_ids_to_tokens(v.token_id), "id": v.token_id, "row": v.role,
                  "read_from": v.where, "at": v.reason, "distance_in_spreads": round(v.distance, 5)} for v in verdicts]
    values = {"tokens": tokens, "vocab_size": vocab_size, "never_allocated": sorted(never), "untrained_rows": rows_seen}
    return [Finding("untrained_added_tokens", severity, title, fix, row_ids, values)]


def _matrices(ctx: AuditContext) -> list[Matrix]:
    """The embedding matrices training ended with: the adapter's saved rows first, then the base model's."""
    run = ctx.run.adapter_dir if ctx.run is not None else None
    adapter = adapter_matrices(run, ctx.adapter_config.get("trainable_token_indices"))
    return adapter + (base_matrices(ctx.base_ref.path) if ctx.base_ref is not None and not ctx.base_ref.gguf_file
                      else [])


def _supervised_ids(ctx: AuditContext, wanted: set[int]) -> set[int]:
    return {label for row in ctx.rendered for label in wanted.intersection(row.labels)}


def _config_trained(ctx: AuditContext) -> dict[str, set[int]]:
    """Token ids whose input / output rows the adapter config trains: every id of an embedding layer it names in
    `modules_to_save` or `target_modules`, and the `trainable_token_indices` (a list trains the input embedding,
    and the head too when the two are tied; a dict names its layers)."""
    config, every = ctx.adapter_config, set(range(len(ctx.tokenizer)))
    named = " ".join(str(m) for m in (config.get("modules_to_save") or [])) + " " + str(config.get("target_modules") or "")
    out = {"input": every if any(n in named for n in INPUT_NAMES) else set(),
           "output": every if any(n in named for n in OUTPUT_NAMES) else set()}
    indices = config.get("trainable_token_indices")
    tied = bool(getattr(ctx.base_config, "tie_word_embeddings", False))
    layers = indices if isinstance(indices, dict) else {"embed_tokens": indices} if isinstance(indices, list) else {}
    for layer, ids in layers.items():
        if not isinstance(ids, list):
            continue
        roles = ["output"] if any(n in str(layer) for n in OUTPUT_NAMES) else ["input", "output"] if tied else ["input"]
        for role in roles:
            out[role] = out[role] | {int(i) for i in ids}
    return out
