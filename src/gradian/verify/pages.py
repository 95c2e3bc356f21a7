"""`DIR/verification.html` and `DIR/verification.md`: the verification on its own page, with the recovery curve.

Both are rendered from verification.json alone (every number they show is in it). The HTML is one self-contained file:
inline CSS and SVG, no script, a Content-Security-Policy that forbids any network request.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Any

import jinja2

from gradian.files import atomic_write
from gradian.report.wording import pct

HTML = "verification.html"
MARKDOWN = "verification.md"
WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 640, 280, 56, 20, 16, 40
Y_LOW, Y_HIGH = -0.5, 1.25  # recovery axis; values beyond are drawn at the edge


def curve_chart(verification: dict[str, Any]) -> dict[str, Any] | None:
    """SVG geometry of recovery vs k: the ranking's top k (and the named rows) beside random sets of the same size."""
    curve = verification.get("curve")
    if not curve or not curve.get("points"):
        return None
    columns = [(f"{p['share'] * 100:g}% ({p['size']})", p["recovery"], p["recovery_ci"], p["random_recovery"],
                p["random_recovery_ci"]) for p in curve["points"]]
    if verification.get("recovery") is not None and verification.get("removed"):
        columns.append((f"named ({verification['removed']})", verification["recovery"], verification["recovery_ci"],
                        verification.get("random_recovery"), verification.get("random_recovery_ci")))
    span_x = (WIDTH - LEFT - RIGHT) / len(columns)

    def y(value: float) -> float:
        clamped = min(Y_HIGH, max(Y_LOW, value))
        return TOP + (Y_HIGH - clamped) / (Y_HIGH - Y_LOW) * (HEIGHT - TOP - BOTTOM)

    def mark(x: float, value: float | None, ci: list[float] | None, fill: str, label: str) -> dict[str, Any] | None:
        if value is None:
            return None
        low, high = ci if ci else (value, value)
        return {"x": round(x, 1), "y": round(y(value), 1), "y_low": round(y(low), 1), "y_high": round(y(high), 1),
                "fill": fill, "title": f"{label}: {pct(value)} (CI {pct(low)} to {pct(high)})"}

    marks, ticks = [], []
    for i, (label, value, ci, random, random_ci) in enumerate(columns):
        centre = LEFT + (i + 0.5) * span_x
        ticks.append({"x": round(centre, 1), "label": label})
        marks += [m for m in (mark(centre - 8, value, ci, "#59a14f", f"top {label}"),
                              mark(centre + 8, random, random_ci, "#9e9e9e", f"random {label}")) if m]
    grid = [{"y": round(y(v), 1), "label": pct(v)} for v in (-0.5, 0.0, 0.5, 1.0)]
    path = " ".join(f"{m['x']},{m['y']}" for m in marks if m["fill"] == "#59a14f")
    return {"width": WIDTH, "height": HEIGHT, "left": LEFT, "right": WIDTH - RIGHT, "bottom": HEIGHT - BOTTOM,
            "marks": marks, "ticks": ticks, "grid": grid, "path": path, "ranking": curve.get("ranking")}


def render_page(verification: dict[str, Any], template: str) -> str:
    environment = jinja2.Environment(autoescape=template.endswith(".html.j2"), trim_blocks=True, lstrip_blocks=True,
                                     undefined=jinja2.StrictUndefined)
    environment.filters["pct"] = pct
    environment.filters["p"] = lambda value: "n/a" if value is None else f"{value:.2g}"
    source = files("gradian.verify").joinpath("templates", template).read_text(encoding="utf-8")
    return environment.from_string(source).render(v=verification, chart=curve_chart(verification))


def write_pages(report_dir: Path, verification: dict[str, Any]) -> dict[str, Path]:
    """verification.html and verification.md beside verification.json."""
    return {HTML: atomic_write(report_dir / HTML, render_page(verification, "verification.html.j2")),
            MARKDOWN: atomic_write(report_dir / MARKDOWN, render_page(verification, "verification.md.j2"))}
