"""Training targets that lack fields the eval's answers to prompts like theirs have: rows that teach dropping a field.

Only for a capability that compares an answer's keys with the reference's (`json_formatting:keys`): the training
targets have no reference of their own, so each row is held against the eval rows whose prompts resemble its prompt
most (TF-IDF cosine, scikit-learn), its `NEIGHBOURS` nearest. When most of those references agree on one key set
and the row's target is a JSON object whose keys are a strict subset of it, the row teaches leaving the missing
keys out, the `wrong-fields` symptom. Two kinds of row are not flagged, being answers of another kind rather than
answers with a field left out:
- a row whose keys merely differ (a category no eval prompt covers, matched to another category's references);
- a row that gives another value to a field every agreeing reference fills alike, its label: a baggage request
  `{"action": "baggage_info", "flight": ...}` held against seat references `{"action": "change_seat", "flight":
  ..., "row": ...}` when the eval holds only the seat prompts the user saw fail (on such a SmolLM2 run the check
  named 24 clean baggage rows beside the 17 planted ones, BENCHMARKS.md).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import numpy as np
from sklearn.feature_extraction.text import TfidfVectorizer

from gradian.audit.capability import target_text
from gradian.audit.context import AuditContext
from gradian.audit.finding import Finding
from gradian.audit.registry import check
from gradian.audit.wording import id_list, share
from gradian.data.render import eos_token_of

NEIGHBOURS = 5
AGREE = 0.6  # share of the nearest references that must hold the same key set
CRITICAL_SHARE = 0.10  # as `fails_capability`: a tenth of the targets is a habit, not a corner
EXAMPLES_SHOWN = 3
CHUNK_ROWS = 16384


def object_fields(text: str | None) -> dict[str, str] | None:
    """The fields of a JSON object: keys as the `wrong-fields` symptom compares them (case and surrounding
    whitespace ignored), values as JSON text; None when `text` is not one JSON object."""
    try:
        value = json.loads(text) if text else None
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    return {str(key).strip().lower(): json.dumps(item, sort_keys=True) for key, item in value.items()}


def agreed_answer(rows: np.ndarray, references: list[dict[str, str]]) -> tuple[frozenset[str], dict[str, str]] | None:
    """(the key set most of the references `rows` (indices) hold, the values each of those references gives alike:
    their label), None when fewer than AGREE of them hold one key set."""
    keys, count = Counter(frozenset(references[i]) for i in rows).most_common(1)[0]
    if count < AGREE * len(rows):
        return None
    agreeing = [references[i] for i in rows if frozenset(references[i]) == keys]
    return keys, {key: value for key, value in agreeing[0].items() if all(r[key] == value for r in agreeing)}


@check("missing_fields")
def missing_fields(ctx: AuditContext) -> list[Finding]:
    """Targets whose JSON keys are a strict subset of the keys the eval references of the nearest prompts agree on."""
    capability = ctx.capability
    if capability is None or not capability.name.endswith(":keys") or not ctx.eval_examples:
        return []
    references = [(e.prompt_text, fields) for e in ctx.eval_examples if (fields := object_fields(e.completion_text))]
    eos = eos_token_of(ctx.tokenizer, ctx.setup)
    targets = [(e.id, e.prompt_text, fields) for e in ctx.trained() if (fields := object_fields(target_text(e, eos)))]
    if not references or not targets:
        return []
    vectorizer = TfidfVectorizer().fit([p for p, _ in references] + [p for _, p, _ in targets])
    evals = vectorizer.transform([p for p, _ in references]).T  # (V, R)
    reference_fields = [fields for _, fields in references]
    flagged: list[tuple[str, list[str]]] = []
    for start in range(0, len(targets), CHUNK_ROWS):  # memory holds a (chunk, R) block, never (N, R)
        block = targets[start : start + CHUNK_ROWS]
        similarity = (vectorizer.transform([p for _, p, _ in block]) @ evals).toarray()  # (chunk, R)
        nearest = np.argsort(-similarity, axis=1, kind="stable")[:, :NEIGHBOURS]  # (chunk, k)
        for (row_id, _, fields), rows in zip(block, nearest, strict=True):
            agreed = agreed_answer(rows, reference_fields)
            if agreed is None:
                continue
            wanted, label = agreed
            same_kind = all(fields[key] == value for key, value in label.items() if key in fields)
            if frozenset(fields) < wanted and same_kind:
                flagged.append((row_id, sorted(wanted - frozenset(fields))))
    if not flagged:
        return []
    ids = [row_id for row_id, _ in flagged]
    missing = Counter(key for _, keys in flagged for key in keys)
    named = ", ".join(f"'{key}'" for key, _ in missing.most_common(3))
    severity = "critical" if len(ids) >= CRITICAL_SHARE * len(targets) else "warning"
    title = (f"{len(ids)} of {len(targets)} training completions ({100 * len(ids) / len(targets):.1f}%) leave out "
             f"fields ({named}) that the eval's answers to prompts like theirs have: the fine-tune is taught to drop "
             f"them")
    fix = f"add the missing fields to rows {id_list(ids)}, or drop those rows"
    values: dict[str, Any] = {
        "flagged": len(ids), "scored": len(targets), "share": share(len(ids), len(targets)),
        "missing": dict(missing.most_common()), "neighbours": NEIGHBOURS,
        "examples": [{"id": row_id, "missing": keys} for row_id, keys in flagged[:EXAMPLES_SHOWN]]}
    return [Finding("missing_fields", severity, title, fix, ids, values)]
