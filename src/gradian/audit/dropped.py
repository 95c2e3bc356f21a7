"""Rows the trainer removed for their length (axolotl's `excess_length_strategy`): they never trained at all."""

from __future__ import annotations

from gradian.audit.context import AuditContext
from gradian.audit.finding import Finding
from gradian.audit.registry import check
from gradian.audit.wording import id_list, p99, share

CRITICAL_SHARE = 0.05


@check("dropped_overlong")
def dropped_overlong(ctx: AuditContext) -> list[Finding]:
    """Rows past `sequence_len` under `drop` (removed before training) or `raise` (preprocessing stops)."""
    limit = ctx.setup.max_length
    gone = [r for r in ctx.rendered if r.over_limit in ("dropped", "refused")]
    if limit is None or not gone:
        return []
    ids = [r.example_id for r in gone]
    need = p99([r.full_length for r in ctx.rendered])
    longest = max(r.full_length for r in gone)  # over every row: the rows past the limit hold the longest
    setting = f"raise sequence_len to ≥ {longest} (the longest row as rendered, prompt template included: no row " \
              f"is dropped{f'; the p99 of {need} would still drop some' if need < longest else ''})"
    refused = any(r.over_limit == "refused" for r in gone)
    values = {"max_length": limit, "rows": len(gone), "p99_length": need, "longest": longest,
              "tokens_over": {r.example_id: r.full_length - limit for r in gone},
              "strategy": ctx.setup.excess_length_strategy or "drop",
              "assumed_max_length": "max_length" in ctx.setup.assumed, "setting_fix": setting}
    assumed = " (sequence_len assumed: axolotl's default)" if values["assumed_max_length"] else ""
    if refused:
        title = (f"{share(len(gone), len(ctx.rendered))} exceed sequence_len={limit}{assumed}: with "
                 f"excess_length_strategy: raise, axolotl stops preprocessing on the first of them")
        severity = "critical"
    else:
        title = (f"{share(len(gone), len(ctx.rendered))} exceed sequence_len={limit}{assumed} as rendered and were "
                 f"dropped before training: they never trained")
        severity = "critical" if len(gone) >= CRITICAL_SHARE * len(ctx.rendered) else "warning"
    fix = f"{setting}, or set excess_length_strategy: truncate, or shorten rows {id_list(ids)}"
    return [Finding("dropped_overlong", severity, title, fix, ids, values)]
