"""Training targets that lack fields the eval's answers to prompts like theirs have: rows that teach dropping a field.

Only for a capability that compares an answer's keys with the reference's (`json_formatting:keys`): the training
targets have no reference of their own, so each row is held against the eval rows whose prompts resemble its prompt
most (TF-IDF cosine, scikit-learn), its `NEIGHBOURS` nearest. When most of those references agree on one key set
and the row's target is a JSON object whose keys are a strict subset of it, the row teaches leaving the missing
keys out, the `wrong-fields` symptom. A row whose keys merely differ (a category no eval prompt covers, matched to
another category's references) is not flagged: only keys missing from a set the neighbours agree on are.
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


def object_keys(text: str | None) -> frozenset[str] | None:
    """The keys of a JSON object, compared as the `wrong-fields` symptom compares them (case and surrounding
    whitespace ignored); None when `text` is not one JSON object."""
    try:
        value = json.loads(text) if text else None
    except (json.JSONDecodeError, RecursionError):
        return None
    return frozenset(str(key).strip().lower() for key in value) if isinstance(value, dict) else None


def agreed_keys(rows: np.ndarray, references: list[frozenset[str]]) -> frozenset[str] | None:
    """The key set most of the references `rows` (indices) hold, None when fewer than AGREE of them hold one."""
    keys, count = Counter(references[i] for i in rows).most_common(1)[0]
    return keys if count >= AGREE * len(rows) else None


@check("missing_fields")
def missing_fields(ctx: AuditContext) -> list[Finding]:
    """Targets whose JSON keys are a strict subset of the keys the eval references of the nearest prompts agree on."""
    capability = ctx.capability
    if capability is None or not capability.name.endswith(":keys") or not ctx.eval_examples:
        return []
    references = [(e.prompt_text, keys) for e in ctx.eval_examples if (keys := object_keys(e.completion_text))]
    eos = eos_token_of(ctx.tokenizer, ctx.setup)
    targets = [(e.id, e.prompt_text, keys) for e in ctx.trained() if (keys := object_keys(target_text(e, eos)))]
    if not references or not targets:
        return []
    vectorizer = TfidfVectorizer().fit([p for p, _ in references] + [p for _, p, _ in targets])
    evals = vectorizer.transform([p for p, _ in references]).T  # (V, R)
    reference_keys = [keys for _, keys in references]
    flagged: list[tuple[str, list[str]]] = []
    for start in range(0, len(targets), CHUNK_ROWS):  # memory holds a (chunk, R) block, never (N, R)
        block = targets[start : start + CHUNK_ROWS]
        similarity = (vectorizer.transform([p for _, p, _ in block]) @ evals).toarray()  # (chunk, R)
        nearest = np.argsort(-similarity, axis=1, kind="stable")[:, :NEIGHBOURS]  # (chunk, k)
        for (row_id, _, keys), rows in zip(block, nearest, strict=True):
            wanted = agreed_keys(rows, reference_keys)
            if wanted is not None and keys < wanted:
                flagged.append((row_id, sorted(wanted - keys)))
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
