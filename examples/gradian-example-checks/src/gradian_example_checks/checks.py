"""An audit check: training answers that still hold a placeholder ("TODO", "TBD", "lorem ipsum")."""

from __future__ import annotations

import re

from gradian import AuditContext, Finding, check

PLACEHOLDER = re.compile(r"\b(TODO|TBD|FIXME|lorem ipsum)\b", re.I)


@check("todo_in_answer", category="per-row")
def todo_in_answer(ctx: AuditContext) -> list[Finding]:
    """Rows whose answer the model would learn to leave unfinished."""
    ids = [e.id for e in ctx.examples if PLACEHOLDER.search(e.completion_text)]
    if not ids:
        return []
    title = f"{len(ids)} of {len(ctx.examples)} training answers hold a placeholder (TODO, TBD, ...)"
    return [Finding("todo_in_answer", "warning", title, "write those answers out or drop the rows", ids,
                    {"rows": len(ids)})]
