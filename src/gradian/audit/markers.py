"""Answers that carry another chat template's turn markers as plain text.

Rows rendered for one template and merged into a run on another keep that template's markers in their text: an
answer closed by `</s>` (Llama and Mistral end a turn with it), `<|eot_id|>` (Llama 3), `<end_of_turn>` (Gemma),
`<|end|>` (Phi-3)... Where the run's tokenizer has no such special token, the marker is a few plain tokens that
carry loss like the answer, and the trainer's own end token follows them. The fine-tune learns to write the marker
after (or before) its answer, and the answer then fails a check that reads it whole, though every row's content is
right: the fix is removing the marker, not the rows.

A marker counts where it opens or closes an answer the row trains (each trained assistant turn, a completion, a
text row's structured tail: `truncation.trained_answers`, as `cut_in_data` reads them), at the turn's edges, where
templates put it: text inside an answer (an HTML `<s>...</s>`) is left alone. A marker this tokenizer reads as one of its special tokens is not
plain text, so it is not reported here.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from gradian.audit.context import AuditContext
from gradian.audit.finding import Finding
from gradian.audit.registry import check
from gradian.audit.truncation import trained_answers
from gradian.audit.wording import id_list, share
from gradian.data.render import eos_token_of

# Turn markers of common chat templates, longest first so `<|end_of_text|>` is not read as a shorter one.
MARKERS = tuple(sorted((
    "</s>", "<s>", "[INST]", "[/INST]", "<|eot_id|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>",
    "<start_of_turn>", "<end_of_turn>", "<eos>", "<|END_OF_TURN_TOKEN|>", "<|eom_id|>",
), key=len, reverse=True))
CRITICAL_SHARE = 0.10  # as `fails_capability`: a tenth of the answers is a habit the fine-tune learns
EXAMPLES_SHOWN = 3


def plain_markers(tokenizer: Any) -> tuple[str, ...]:
    """The markers this tokenizer reads as plain text: none of their tokens is one of its special or added tokens."""
    special = set(getattr(tokenizer, "all_special_ids", []) or []) | set(
        (getattr(tokenizer, "added_tokens_decoder", {}) or {}).keys())
    plain = []
    for marker in MARKERS:
        ids = tokenizer(marker, add_special_tokens=False)["input_ids"]
        if ids and not special & set(ids):
            plain.append(marker)
    return tuple(plain)


def edge_marker(text: str, markers: tuple[str, ...]) -> str | None:
    """The marker that opens or closes `text` (whitespace aside), else None."""
    body = text.strip()
    return next((m for m in markers if body.endswith(m) or body.startswith(m)), None)


@check("foreign_turn_marker")
def foreign_turn_marker(ctx: AuditContext) -> list[Finding]:
    """Trained answers opened or closed by another template's turn marker that this tokenizer reads as plain text."""
    markers = plain_markers(ctx.tokenizer)
    if not markers:
        return []
    eos = eos_token_of(ctx.tokenizer, ctx.setup)  # a literal own EOS after the marker is taken off first
    found: dict[str, tuple[str, str]] = {}  # row id -> (marker, the answer it edges), in dataset order
    n_answers = 0
    for example, rendered in ctx.rows:
        if rendered.dropped:
            continue
        answers = [text.strip().removesuffix(eos or "") for text in trained_answers(example, rendered, ctx.tokenizer)]
        n_answers += bool(answers)
        edged = next(((m, text) for text in answers if (m := edge_marker(text, markers)) is not None), None)
        if edged is not None:
            found[example.id] = edged
    if not found:
        return []
    ids, counts = list(found), Counter(marker for marker, _ in found.values())
    named = ", ".join(f"`{m}` ({n})" for m, n in counts.items())
    tokens = {m: len(ctx.tokenizer(m, add_special_tokens=False)["input_ids"]) for m in counts}
    end = f", which ends each turn with its own {eos}" if eos else ""
    title = (f"{share(len(ids), n_answers)} have trained answers that open or close with another chat template's turn "
             f"marker, which this tokenizer reads as plain text: {named}. The fine-tune learns to write it beside "
             "the answer")
    fix = (f"remove {', '.join(f'`{m}`' for m in counts)} from the answers of rows {id_list(ids)} (render rows with "
           f"the run's own chat template{end}): this keeps the rows, whose answers are right without it")
    values = {"markers": dict(counts), "marker_tokens": tokens, "answers": n_answers,
              "examples": [{"id": i, "answer": text[-200:]} for i, (_, text) in list(found.items())[:EXAMPLES_SHOWN]]}
    severity = "critical" if len(ids) >= CRITICAL_SHARE * n_answers else "warning"
    return [Finding("foreign_turn_marker", severity, title, fix, ids, values)]
