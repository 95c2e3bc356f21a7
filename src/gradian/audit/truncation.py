"""Completions that training never saw whole: cut by the run's max length, or cut in the data itself."""

from __future__ import annotations

import itertools
import json
import math
import re
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from gradian.audit.context import AuditContext
from gradian.audit.finding import Finding
from gradian.audit.registry import check
from gradian.audit.wording import id_list, p99, share
from gradian.capabilities.json_text import json_depth
from gradian.data.examples import Example
from gradian.data.render import IGNORE, Rendered, eos_token_of

CRITICAL_SHARE = 0.05  # a cut affecting ≥ 5% of rows is a run-wide problem
SHORT_RATIO = 0.5  # "much shorter than its cluster": ≤ half the median of rows sharing its key prompt word
MIN_GROUP = 5
WORD = re.compile(r"[a-z]{3,}")


def _severity(count: int, total: int) -> str:
    return "critical" if count >= CRITICAL_SHARE * total else "warning"


@check("truncation")
def truncated_by_max_length(ctx: AuditContext) -> list[Finding]:
    """Rows longer than `max_length`: with keep_start their completion end and EOS are cut off."""
    limit = ctx.setup.max_length
    if limit is None:
        return []
    over = [r for r in ctx.rendered if r.over_limit == "truncated"]  # dropped rows: audit/dropped.py
    if not over:
        return []
    need = p99([r.full_length for r in ctx.rendered])
    longest = max(r.full_length for r in over)  # over every row: the rows past the limit hold the longest
    ids = [r.example_id for r in over]
    name = "cutoff_len" if ctx.setup.framework == "llamafactory" else "max_length"  # the run's own setting's name
    setting = (f"raise {name} to ≥ {longest} (the longest row as trained, so no row is cut; the p99 of {need} "
               f"would still cut some)" if need < longest else
               f"raise {name} to ≥ {longest} (the longest row as trained, so no row is cut)")
    values = {"max_length": limit, "rows": len(over), "p99_length": need, "longest": longest,
              "tokens_over": {r.example_id: r.full_length - limit for r in over},
              "assumed_max_length": "max_length" in ctx.setup.assumed,
              "fix_settings": {"max_length": longest}, "setting_fix": setting}
    if ctx.setup.eos_after_truncation and ctx.setup.truncation_mode == "keep_start" and not ctx.setup.drop_overlong:
        return [eos_after_cut_finding(ids, len(ctx.rendered), limit, longest)]
    eos = ctx.tokenizer.convert_tokens_to_ids(eos_token_of(ctx.tokenizer, ctx.setup))
    if ctx.setup.framework == "llamafactory" and all(r.labels and r.labels[-1] == eos for r in over):
        return [eos_after_cut_finding(ids, len(ctx.rendered), limit, longest, name)]  # its efficient_eos templates
    assumed = f" ({name} assumed: the framework default)" if values["assumed_max_length"] else ""
    where = "their completion's end and EOS" if ctx.setup.truncation_mode == "keep_start" else "their prompt's start"
    if ctx.setup.framework == "llamafactory":
        where = "prompt and answer cut in proportion (LLaMA-Factory's infer_seqlen), so the answer's end and EOS are"
    verb = "dropped from training" if ctx.setup.drop_overlong else f"truncated: {where} never trained"
    title = f"{share(len(over), len(ctx.rendered))} exceed {name}={limit}{assumed} and are {verb}"
    fix = f"{setting}, or shorten/drop rows {id_list(ids)}"
    return [Finding("truncated_completion", _severity(len(over), len(ctx.rendered)), title, fix, ids, values)]


@check("packing_split")
def split_by_packing(ctx: AuditContext) -> list[Finding]:
    """Rows TRL's packing cuts across blocks (`packing_strategy` wrapped, or bfd_split's overflow): the part after the
    cut trains without the row's start (its prompt) as context."""
    if not ctx.setup.packing or ctx.setup.framework == "axolotl":
        return []
    split = [r for r in ctx.rendered if r.over_limit == "split"]
    if not split:
        return []
    strategy = ctx.setup.packing_strategy
    ids = [r.example_id for r in split]
    how = ("packing_strategy='wrapped' cuts a block every max_length tokens across rows" if strategy == "wrapped" else
           f"packing_strategy='{strategy}' trains what runs past max_length as a row of its own")
    title = (f"{share(len(split), len(ctx.rendered))} are cut across packed blocks ({how}): the part after the cut "
             f"trains without the row's start as context")
    fix = ("set packing_strategy='bfd' (TRL's default: every row kept whole in one block) and max_length ≥ the "
           f"longest row ({max(r.full_length for r in ctx.rendered)} tokens as trained), or turn packing off; "
           f"rows {id_list(ids)}")
    values = {"rows": len(split), "packing_strategy": strategy, "max_length": ctx.setup.max_length,
              "fix_settings": {"packing_strategy": "bfd"}}
    return [Finding("packing_split", _severity(len(split), len(ctx.rendered)), title, fix, ids, values,
                    category="setup")]


def eos_after_cut_finding(ids: list[str], total: int, limit: int, longest: int | None,
                          name: str = "max_length") -> Finding:
    """Rows cut at `limit` tokens that still end in a supervised EOS (EOS appended after truncating: the model learns
    to stop mid-answer), out of `total`; `longest`, the longest row whole, when known. A setting, not rows: the audit
    makes it from the run's settings, preflight from the trainer's own tokens."""
    title = (f"{share(len(ids), total)} are cut at {limit} tokens and still end in EOS (EOS is appended after "
             f"truncating): the model learns to stop mid-answer")
    if longest is not None:
        fix = f"raise {name} to ≥ {max(longest, limit + 1)} (the longest row whole: then no row is cut)"
        setting = fix
    else:
        fix = (f"raise {name} to ≥ the longest row whole (the dataset holds only the cut tokens, so Gradian cannot "
               "tell how long that is: tokenize once without truncation and take the longest)")
    fix += f", or append EOS only to rows that were not cut; rows {id_list(ids)}"
    values: dict[str, Any] = {"max_length": limit, "rows": len(ids), "longest": longest}
    if longest is not None:  # the fix verify retrains with
        values.update(fix_settings={"max_length": max(longest, limit + 1)}, setting_fix=setting)
    return Finding("eos_after_cut", _severity(len(ids), total), title, fix, ids, values, category="setup")


@check("cut_in_data")
def cut_in_data(ctx: AuditContext) -> list[Finding]:
    """Completions already cut in the dataset: broken JSON, a dangling end, or far shorter than their cluster. Rows
    the trainer dropped (`dropped_overlong`) are not read: they taught nothing."""
    eos = eos_token_of(ctx.tokenizer, ctx.setup) or "\0"
    completions = [_completion_string(e).strip().removesuffix(eos) for e in ctx.examples]
    reasons: dict[str, str] = {}
    for example, rendered in ctx.rows:
        if rendered.dropped:
            continue
        answers = [text.strip().removesuffix(eos) for text in trained_answers(example, rendered, ctx.tokenizer)]
        for turn, text in enumerate(answers, start=1):
            reason = json_cut(text) if text[:1] in ("{", "[", "`") else None
            if reason:
                reasons[example.id] = f"assistant turn {turn} of {len(answers)}: {reason}" if len(answers) > 1 \
                    else reason
                break
    for example_id, reason in _short_for_cluster(ctx.examples, completions).items():
        if example_id not in ctx.untrained_ids:
            reasons.setdefault(example_id, reason)
    if not reasons:
        return []
    ids = [e.id for e in ctx.examples if e.id in reasons]
    title = f"{share(len(ids), len(ctx.examples))} have completions cut in the data itself (stopping early is trained)"
    fix = f"complete or drop rows {id_list(ids)}; the model learns to stop where these rows stop"
    return [Finding("cut_in_data", _severity(len(ids), len(ctx.examples)), title, fix, ids, {"reasons": reasons})]


def trained_answers(example: Example, rendered: Rendered | None = None, tokenizer: Any = None) -> list[str]:
    """Every answer a row trains, to check for a cut: each assistant turn of a conversation whose text carries loss
    in `rendered` (not only the last; whatever the trainer's rule: OpenAI's `weight: 0`, LLaMA-Factory's
    `mask_history`, assistant-only loss), a completion, or a text row's structured tail (from its first `{`, `[` or
    code fence: the prompt before it is plain words)."""
    if example.shape == "messages":
        answers = [str(m.get("content") or "") for m in example.fields["messages"] if m.get("role") == "assistant"]
        if len(answers) < 2 or rendered is None or tokenizer is None:
            return answers
        return _trained_turns(answers, rendered, tokenizer)
    completion = example.completion
    if isinstance(completion, list):
        return [str(m.get("content") or "") for m in completion if m.get("role") == "assistant"]
    if example.shape == "text":
        text = completion or ""
        starts = [i for i in (text.find("{"), text.find("["), text.find("```")) if i >= 0]
        return [text[min(starts):]] if starts else []
    return [completion or ""]


def _trained_turns(answers: list[str], rendered: Rendered, tokenizer: Any) -> list[str]:
    """The turns among `answers` whose text carries loss: each found in turn order in the row as decoded (the last
    may run to where the length limit cut the row), and kept when its first character is in a trained stretch."""
    text, trained = "", list[bool]()
    for carries_loss, run in itertools.groupby(range(len(rendered.labels)), key=lambda i: rendered.labels[i] != IGNORE):
        piece = _squeezed(tokenizer.decode([rendered.input_ids[i] for i in run]))
        text, trained = text + piece, trained + [carries_loss] * len(piece)
    kept, cursor = [], 0
    for answer in answers:
        turn = _as_decoded(answer, tokenizer)
        at = text.find(turn, cursor) if turn else -1
        if at < 0 and rendered.truncated_tokens > 0:  # cut by the length limit: the row ends inside it
            at = next((i for i in range(max(cursor, len(text) - len(turn)), len(text)) if turn.startswith(text[i:])), -1)
        if at >= 0:
            if trained[at]:
                kept.append(answer)
            cursor = at + min(len(turn), len(text) - at)
    return kept


def _squeezed(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _as_decoded(text: str, tokenizer: Any) -> str:
    """`text` as the tokenizer decodes it back (a token it cannot spell comes back as its unknown token)."""
    return _squeezed(tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)))


def _completion_string(example: Example) -> str:
    completion = example.completion
    if isinstance(completion, list):
        return "\n".join(str(m.get("content") or "") for m in completion if m.get("role") == "assistant")
    return completion or ""


def json_cut(text: str) -> str | None:
    """Why a completion that looks like JSON is cut, or None when it is whole (or not JSON at all)."""
    body = text.strip()
    fenced = re.search(r"```(?:json)?\s*(.*?)(```|$)", body, re.S)
    if fenced and body.startswith("```"):
        if not fenced.group(2):
            return "code fence never closed"
        body = fenced.group(1).strip()
    if not body.startswith(("{", "[")):
        return None
    try:
        json.loads(body)
        return None
    except (json.JSONDecodeError, RecursionError):  # nested too deeply to parse: the depth scan below reads it
        pass
    depth, in_string = json_depth(body)
    if in_string:
        return "ends inside a JSON string"
    if depth > 0:
        return f"unbalanced JSON ({depth} unclosed bracket{'s' if depth > 1 else ''})"
    return None  # balanced but invalid (single quotes, ...): a format problem, not a cut


def _short_for_cluster(examples: Sequence[Example], completions: list[str]) -> dict[str, str]:
    """Rows ending abruptly (a letter, digit, comma or colon) at ≤ half the median length of rows whose
    prompts share their most distinctive word."""
    words = [set(WORD.findall(e.prompt_text.lower())) for e in examples]
    frequency: dict[str, int] = defaultdict(int)
    for row in words:
        for word in row:
            frequency[word] += 1
    groups: dict[str, list[int]] = defaultdict(list)
    for index, row in enumerate(words):
        candidates = [w for w in row if MIN_GROUP <= frequency[w] <= 0.5 * len(examples)]
        if candidates:
            groups[min(candidates, key=lambda w: (frequency[w], w))].append(index)
    found: dict[str, str] = {}
    for word, members in groups.items():
        if len(members) < MIN_GROUP:
            continue
        lengths = np.array([len(completions[i]) for i in members], dtype=np.float64)
        median = float(np.median(lengths))
        for i, length in zip(members, lengths, strict=True):
            text = completions[i]
            if length <= SHORT_RATIO * median and text and re.search(r"[\w,:;(\-]$", text):
                found[examples[i].id] = (f"{int(length)} characters, ≤ {SHORT_RATIO:.0%} of the median "
                                         f"{math.floor(median)} of rows about {word!r}, ending mid-sentence")
    return found
