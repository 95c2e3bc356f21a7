"""Write the report folder: report.json, report.md, report.html, and for a data-cluster verdict culprits.jsonl (every
named row, with the cause it belongs to) and train.cleaned.jsonl (the dataset without any of them).

The Markdown and HTML are rendered by jinja2 templates from the report dict alone, so they show no number that
report.json lacks. User text (prompts, completions, ids, names) is escaped: HTML by autoescaping, Markdown by
`markdown_cell`.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from gradian.data.columns import ExampleColumns, ids_of, positions_of
from gradian.data.examples import Example
from gradian.files import atomic_write
from gradian.report import charts
from gradian.report.rows import EXAMPLES_FILE, ExampleRows
from gradian.report.wording import not_told_apart, number, pct, ranked_by
from gradian.verdict.types import cause_by_row

CHECK_TITLES_MAX = 3  # flags shown per cluster in the Markdown table
DEPARTURES_SHOWN = 3  # where the failing answers depart: the most common, under the symptoms
REPORT_FILES = ("report.json", "report.md", "report.html", EXAMPLES_FILE, "culprits.jsonl", "train.cleaned.jsonl")


def write_report(out_dir: str | Path, report: dict[str, Any], examples: Sequence[Example],
                 rows: ExampleRows | None = None) -> dict[str, Path]:
    """Write every report file into `out_dir` (created if needed); returns `{name: path}` of what was written.

    `rows` are the per-row results written to examples.jsonl (without them: ids and flags only, no effects).
    `examples` may be `data.columns.ExampleColumns`: only the culprit rows are ever built as `Example`s.
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
    ids = ids_of(examples)
    rows = rows if rows is not None else ExampleRows.of(ids, None, None, [], sorted(culprits))
    written[EXAMPLES_FILE] = rows.write(out / EXAMPLES_FILE)
    if culprits:
        found = positions_of(ids, culprits)
        chosen = np.sort(found[found >= 0])  # culprit rows in dataset order
        known = {int(i): rows.row(int(i)) for i in chosen}
        cause = cause_by_row(report["verdict"].get("causes") or [])
        written["culprits.jsonl"] = atomic_write(out / "culprits.jsonl",
                                                 _culprit_lines(examples, chosen, known, cause))
        written["train.cleaned.jsonl"] = write_cleaned(out / "train.cleaned.jsonl", examples, chosen)
    return written


def _culprit_lines(examples: Sequence[Example], chosen: np.ndarray, known: dict[int, dict[str, Any]],
                   cause: dict[str, str]) -> str:
    """Each culprit's original row plus what Gradian knows about it under `_gradian`, with the cause that names it
    (`cause`: {row id: the cause's name in report.json's `verdict.causes`})."""
    lines = []
    for i in chosen:
        example, row = examples[int(i)], known[int(i)]
        extra = {"id": example.id, "line": example.line, "cause": cause.get(example.id), "effect": row.get("effect"),
                 "cluster": row.get("cluster"), "flags": row.get("flags", [])}
        lines.append(json.dumps({**example.raw, "_gradian": extra}, ensure_ascii=False))
    return "".join(line + "\n" for line in lines)


def write_cleaned(path: Path, examples: Sequence[Example], culprits: np.ndarray) -> Path:
    """The training file minus the culprit rows (`culprits`: their positions), every other line byte-for-byte.

    When the examples' source file is JSONL whose lines still hold the same rows, its lines are copied; otherwise
    (a JSON array, gzip-compressed JSONL, Parquet, a saved dataset folder, a file changed or gone) each kept row is
    written back as one JSON line. Written a line at a time through a temporary file.
    """
    source = _unchanged_source(examples)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "w", encoding="utf-8", newline="") as stream:
        if source is not None:
            drop = {examples[int(i)].line for i in culprits}
            for number, line in enumerate(_lines(source), start=1):
                if number not in drop:
                    stream.write(line if line.endswith("\n") else line + "\n")
        else:
            skip = set(int(i) for i in culprits)
            for index, example in enumerate(examples):
                if index not in skip:
                    stream.write(json.dumps(example.raw, ensure_ascii=False) + "\n")
    os.replace(temporary, path)
    return path


def _unchanged_source(examples: Sequence[Example]) -> Path | None:
    """The one JSONL file every example was read from, when each example's line there still holds its row."""
    sources = examples.sources if isinstance(examples, ExampleColumns) else list({e.source for e in examples})
    if len(sources) != 1 or not sources[0] or not Path(sources[0]).is_file():
        return None
    try:
        with open(sources[0], encoding="utf-8-sig", newline="") as stream:
            number, line = 0, ""
            for example in examples:  # dataset order is line order for a JSONL file
                if example.line <= number:
                    return None
                while number < example.line:
                    line = stream.readline()
                    if not line:
                        return None
                    number += 1
                if not _same_row(line, example.raw):
                    return None
    except UnicodeDecodeError:  # gzip-compressed JSONL, Parquet, or a file re-encoded since: rows are written back
        return None
    return Path(sources[0])


def _lines(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8-sig", newline="") as stream:
        yield from stream


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
                               level=lambda v: f"{100 * v:g}%", by_gap=flags_by_gap,
                               quoted=quoted, md_code=markdown_code, ranked_by=ranked_by,
                               not_told_apart=not_told_apart, most_common=most_common,
                               code=code_span)
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


def most_common(values: dict[str, str], n: int = DEPARTURES_SHOWN) -> list[str]:
    """The `n` values most often in `values` (`symptoms.departures`: where the failing answers depart)."""
    return [value for value, _ in Counter(values.values()).most_common(n)]


def flags_by_gap(flag_rates: dict[str, dict[str, float]]) -> list[tuple[str, dict[str, float]]]:
    """The checks flagging rows of a cluster, the largest inside-vs-outside gap first (report.json has them all)."""
    present = [(check, rates) for check, rates in flag_rates.items() if rates["inside"] > 0]
    return sorted(present, key=lambda item: (-(item[1]["inside"] - item[1]["outside"]), item[0]))


def quoted(token: str) -> str:
    """A token as a quoted string, whitespace and control characters escaped ("\\n"), `<` and `>` kept as they are:
    the HTML template's autoescape makes them `&lt;eos&gt;` (jinja's `tojson` wrote `\\u003ceos\\u003e`)."""
    return json.dumps(token, ensure_ascii=False)


def markdown_code(token: str) -> str:
    """A token as a Markdown code span in one table cell: shown as it is (`"<eos>"`, not `&lt;eos&gt;`), safe because
    nothing inside a code span is HTML; the fence is longer than any run of backticks inside, and `|` is escaped
    for the table."""
    return code_span(quoted(token))


def code_span(text: str) -> str:
    """Text as a Markdown code span in one table cell (`markdown_code` without the quotes)."""
    text = text.replace("|", "\\|")
    longest = max((len(run) for run in re.findall("`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def markdown_cell(value: Any, limit: int = 160) -> str:
    """User text made safe for one Markdown table cell: one line, no HTML, no table breaks, no code spans."""
    text = " ".join(str(value).split())
    if len(text) > limit:
        text = text[: limit - 1] + "\u2026"
    for raw, escaped in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ("|", "\\|"), ("`", "\\`"), ("*", "\\*"),
                         ("_", "\\_"), ("[", "\\["), ("]", "\\]")):
        text = text.replace(raw, escaped)
    return text
