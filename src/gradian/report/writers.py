"""Write the report folder: report.json, report.md, report.html, and for a data-cluster verdict culprits.jsonl and
train.cleaned.jsonl.

The Markdown and HTML are rendered by jinja2 templates from the report dict alone, so they show no number that
report.json lacks. User text (prompts, completions, ids, names) is escaped: HTML by autoescaping, Markdown by
`markdown_cell`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from gradian.data.examples import Example
from gradian.files import atomic_write
from gradian.report import charts
from gradian.report.rows import EXAMPLES_FILE, ExampleRows
from gradian.report.verdict import number, pct

CHECK_TITLES_MAX = 3  # flags shown per cluster in the Markdown table


def write_report(out_dir: str | Path, report: dict[str, Any], examples: list[Example],
                 rows: ExampleRows | None = None) -> dict[str, Path]:
    """Write every report file into `out_dir` (created if needed); returns `{name: path}` of what was written.

    `rows` are the per-row results written to examples.jsonl (without them: ids and flags only, no effects).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = {
        "report.json": atomic_write(out / "report.json", json.dumps(report, indent=2, ensure_ascii=False,
                                                                    allow_nan=False) + "\n"),
        "report.md": atomic_write(out / "report.md", render_markdown(report)),
        "report.html": atomic_write(out / "report.html", render_html(report)),
    }
    culprits = set(report["verdict"].get("culprit_ids") or [])
    rows = rows if rows is not None else ExampleRows.of([e.id for e in examples], None, None, [], sorted(culprits))
    written[EXAMPLES_FILE] = rows.write(out / EXAMPLES_FILE)
    if culprits:
        by_id = {row["id"]: row for row in rows if row["culprit"]}
        written["culprits.jsonl"] = atomic_write(out / "culprits.jsonl", _culprit_lines(examples, culprits, by_id))
        written["train.cleaned.jsonl"] = atomic_write(out / "train.cleaned.jsonl", cleaned_text(examples, culprits))
    return written


def _culprit_lines(examples: list[Example], culprits: set[str], by_id: dict[str, dict[str, Any]]) -> str:
    """Each culprit's original row plus what Gradian knows about it under `_gradian`."""
    lines = []
    for example in examples:
        if example.id in culprits:
            known = by_id.get(example.id, {})
            extra = {"id": example.id, "line": example.line, "effect": known.get("effect"),
                     "cluster": known.get("cluster"), "flags": known.get("flags", [])}
            lines.append(json.dumps({**example.raw, "_gradian": extra}, ensure_ascii=False))
    return "".join(line + "\n" for line in lines)


def cleaned_text(examples: list[Example], culprits: set[str]) -> str:
    """The training file minus the culprit rows, every other line byte-for-byte as it was.

    When the examples' source file is JSONL whose lines still hold the same rows, its lines are copied; otherwise
    (a JSON array, a file changed or gone) each kept row is written back as one JSON line.
    """
    source_lines = _source_lines(examples)
    if source_lines is not None:
        drop = {e.line for e in examples if e.id in culprits}
        return "".join(line for number_, line in enumerate(source_lines, start=1) if number_ not in drop)
    return "".join(json.dumps(e.raw, ensure_ascii=False) + "\n" for e in examples if e.id not in culprits)


def _source_lines(examples: list[Example]) -> list[str] | None:
    sources = {e.source for e in examples}
    if len(sources) != 1 or not next(iter(sources)) or not Path(next(iter(sources))).is_file():
        return None
    with open(next(iter(sources)), encoding="utf-8-sig", newline="") as stream:
        lines = stream.readlines()
    for example in examples:
        if not 1 <= example.line <= len(lines) or not _same_row(lines[example.line - 1], example.raw):
            return None
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    return lines


def _same_row(line: str, raw: dict[str, Any]) -> bool:
    try:
        return json.loads(line) == raw
    except json.JSONDecodeError:
        return False


def _environment(autoescape: bool) -> Environment:
    environment = Environment(
        loader=PackageLoader("gradian.report", "templates"),
        autoescape=select_autoescape(["html", "j2"]) if autoescape else False,
        undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
    )
    environment.filters.update(pct=pct, signed=lambda v: pct(v, signed=True), number=number, md=markdown_cell,
                               level=lambda v: f"{100 * v:g}%", by_gap=flags_by_gap)
    return environment


def render_markdown(report: dict[str, Any]) -> str:
    """report.md: verdict, regression with its CI, clusters, top culprits and findings, pasteable in a PR."""
    return _environment(False).get_template("report.md.j2").render(report=report, max_flags=CHECK_TITLES_MAX)


def render_html(report: dict[str, Any]) -> str:
    """report.html: one self-contained page (inline CSS, inline SVG, a few lines of inline script)."""
    figures = {"regression": charts.regression_chart(report["regression"])}
    chart_data = report.get("charts") or {}
    if "effect_histogram" in chart_data:
        figures["histogram"] = charts.histogram_chart(chart_data["effect_histogram"])
    if "cluster_map" in chart_data:
        names = {c["id"]: c["name"] for c in report["clusters"]}
        figures["map"] = charts.cluster_map(chart_data["cluster_map"]["points"], names)
    if report["clusters"]:
        figures["shares"] = charts.share_bars(report["clusters"])
    if report.get("verification"):
        figures["verification"] = charts.verification_chart(report["verification"])
    template = _environment(True).get_template("report.html.j2")
    return template.render(report=report, figures=figures, color=charts.color)


def flags_by_gap(flag_rates: dict[str, dict[str, float]]) -> list[tuple[str, dict[str, float]]]:
    """The checks flagging rows of a cluster, the largest inside-vs-outside gap first (report.json has them all)."""
    present = [(check, rates) for check, rates in flag_rates.items() if rates["inside"] > 0]
    return sorted(present, key=lambda item: (-(item[1]["inside"] - item[1]["outside"]), item[0]))


def markdown_cell(value: Any, limit: int = 160) -> str:
    """User text made safe for one Markdown table cell: one line, no HTML, no table breaks, no code spans."""
    text = " ".join(str(value).split())
    if len(text) > limit:
        text = text[: limit - 1] + "\u2026"
    for raw, escaped in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ("|", "\\|"), ("`", "\\`"), ("*", "\\*"),
                         ("_", "\\_"), ("[", "\\["), ("]", "\\]")):
        text = text.replace(raw, escaped)
    return text
