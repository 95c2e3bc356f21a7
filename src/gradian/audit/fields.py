"""Training targets that lack fields the eval's answers to prompts like theirs have: rows that teach dropping a field,
or naming it otherwise.

Only for a capability that compares an answer's keys with the reference's (`json_formatting:keys`): the training
targets have no reference of their own, so each row is held against the eval rows whose prompts resemble its prompt
most (TF-IDF cosine, scikit-learn), its `NEIGHBOURS` nearest. When most of those references agree on one key set,
the row's target is a JSON object that lacks some of those keys, and it answers the same kind of request, the row
teaches leaving the missing keys out, the `wrong-fields` symptom:
- its keys are a strict subset of the agreed ones (a field dropped); or
- it holds as many other keys as it lacks, and every field the agreeing references fill alike (their label) with
  the same value (a field renamed: a music row `{"device": "speaker", ..., "target": 42}` held against references
  `{"device": "speaker", ..., "volume": 42}`; schema drift in real data, `qty` for `quantity`).
Two kinds of row are not flagged, being answers of another kind rather than answers with a field left out:
- a row whose keys merely differ from references that share no label with it, or agree on none (a category no eval
  prompt covers, matched to another category's references);
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
    """Targets that lack keys the eval references of the nearest prompts agree on, dropped or renamed (module
    docstring)."""
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
    flagged: list[tuple[str, list[str], list[str]]] = []  # (row id, keys it lacks, keys it holds instead)
    for start in range(0, len(targets), CHUNK_ROWS):  # memory holds a (chunk, R) block, never (N, R)
        block = targets[start : start + CHUNK_ROWS]
        similarity = (vectorizer.transform([p for _, p, _ in block]) @ evals).toarray()  # (chunk, R)
        nearest = np.argsort(-similarity, axis=1, kind="stable")[:, :NEIGHBOURS]  # (chunk, k)
        for (row_id, _, fields), rows in zip(block, nearest, strict=True):
            agreed = agreed_answer(rows, reference_fields)
            if agreed is None:
                continue
            wanted, label = agreed
            lacks, instead = wanted - frozenset(fields), frozenset(fields) - wanted
            same_kind = all(fields[key] == value for key, value in label.items() if key in fields)
            kept = label.keys() - lacks  # the label's fields a renamed row must hold, with the same values
            renamed = len(instead) == len(lacks) and bool(kept) and kept <= fields.keys()
            if lacks and same_kind and (not instead or renamed):
                flagged.append((row_id, sorted(lacks), sorted(instead)))
    if not flagged:
        return []
    ids = [row_id for row_id, _, _ in flagged]
    missing = Counter(key for _, keys, _ in flagged for key in keys)
    others = Counter(key for _, _, keys in flagged for key in keys)
    named = ", ".join(f"'{key}'" for key, _ in missing.most_common(3))
    n_renamed = sum(1 for _, _, keys in flagged if keys)
    severity = "critical" if len(ids) >= CRITICAL_SHARE * len(targets) else "warning"
    title = (f"{len(ids)} of {len(targets)} training completions ({100 * len(ids) / len(targets):.1f}%) leave out "
             f"fields ({named}) that the eval's answers to prompts like theirs have"
             + (f", {n_renamed} of them under another name ({', '.join(f'{k!r}' for k, _ in others.most_common(3))})"
                if n_renamed else "") + ": the fine-tune is taught to drop them")
    renames = Counter(f"'{other[0]}' to '{keys[0]}'" for _, keys, other in flagged if len(other) == 1)
    if renames:
        fix = f"rename {', '.join(r for r, _ in renames.most_common(3))} in rows {id_list(ids)}"
        fix += " and add the missing fields where they lack them" if sum(renames.values()) < len(ids) else ""
    else:
        fix = f"add the missing fields to rows {id_list(ids)}"
    fix += ", or drop those rows"
    values: dict[str, Any] = {
        "flagged": len(ids), "scored": len(targets), "share": share(len(ids), len(targets)),
        "missing": dict(missing.most_common()), "instead": dict(others.most_common()), "renamed": n_renamed,
        "neighbours": NEIGHBOURS,
        "examples": [{"id": row_id, "missing": keys, "instead": other} for row_id, keys, other in
                     flagged[:EXAMPLES_SHOWN]]}
    return [Finding("missing_fields", severity, title, fix, ids, values)]
