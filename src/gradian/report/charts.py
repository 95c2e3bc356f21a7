"""Geometry of the HTML report's inline SVG charts, computed from the report dict (no chart library, no network).

Every label a chart shows is a number of the report dict formatted by `report.wording.pct`/`number`; this module
only turns those numbers into pixel positions.
"""

from __future__ import annotations

from typing import Any

from gradian.report.wording import number, pct

WIDTH = 640
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#bab0ac", "#e15759",
           "#ff9da7", "#86bcb6", "#d37295")


def color(cluster: int | None) -> str:
    return "#888888" if cluster is None else PALETTE[cluster % len(PALETTE)]


def regression_chart(regression: dict[str, Any]) -> dict[str, Any]:
    """Base vs fine-tuned pass rates as bars, and the difference with its CI as a whisker around zero."""
    left, right, bar_height = 150, WIDTH - 80, 26
    span = right - left
    bars = []
    for row, (label, key) in enumerate((("base model", "base_rate"), ("fine-tuned", "finetuned_rate"))):
        value = regression.get(key)
        bars.append({"label": label, "text": pct(value), "x": left, "y": 10 + row * 36, "height": bar_height,
                     "width": span * max(0.0, min(1.0, float(value or 0.0))), "span": span})
    delta, low, high = (regression.get(k) for k in ("delta", "ci_low", "ci_high"))
    values = [abs(float(v)) for v in (delta, low, high) if v is not None]
    reach = max([0.1, *values]) * 1.15
    scale = lambda v: left + span * (float(v) + reach) / (2 * reach)  # noqa: E731
    whisker = None
    if delta is not None:
        whisker = {"x": scale(delta), "x_low": scale(low if low is not None else delta),
                   "x_high": scale(high if high is not None else delta), "y": 104,
                   "text": f"{pct(delta, signed=True)} (CI {pct(low, signed=True)} to {pct(high, signed=True)})"}
    return {"width": WIDTH, "height": 130, "left": left, "right": right, "bars": bars, "whisker": whisker,
            "zero_x": scale(0.0)}


def histogram_chart(histogram: dict[str, Any]) -> dict[str, Any]:
    """Bars of the effect histogram, with the zero line and the culprit threshold when there is one."""
    edges, counts = histogram["edges"], histogram["counts"]
    left, right, top, bottom = 50, WIDTH - 20, 10, 170
    low, high = edges[0], edges[-1]
    width = (high - low) or 1.0
    tallest = max(counts) or 1
    x = lambda v: left + (right - left) * (v - low) / width  # noqa: E731
    bars = [
        {"x": x(edges[i]), "width": max(x(edges[i + 1]) - x(edges[i]) - 1, 1), "y": bottom - (bottom - top) * c
         / tallest, "height": (bottom - top) * c / tallest, "count": c, "harmful": edges[i + 1] <= 0,
         "range": f"{number(edges[i])} to {number(edges[i + 1])}"}
        for i, c in enumerate(counts)
    ]
    threshold = histogram.get("threshold")
    return {
        "width": WIDTH, "height": 200, "bottom": bottom, "left": left, "right": right, "bars": bars,
        "zero_x": x(0.0) if low <= 0.0 <= high else None, "tallest": tallest,
        "threshold_x": x(threshold) if threshold is not None and low <= threshold <= high else None,
        "low": number(low), "high": number(high),
    }


def cluster_map(points: list[dict[str, Any]], names: dict[int, str]) -> dict[str, Any]:
    """Scatter of rows in 2-D, coloured by cluster; culprits ringed."""
    size, pad = 420, 16
    xs, ys = [p["x"] for p in points], [p["y"] for p in points]
    x_low, x_span = min(xs, default=0.0), (max(xs, default=1.0) - min(xs, default=0.0)) or 1.0
    y_low, y_span = min(ys, default=0.0), (max(ys, default=1.0) - min(ys, default=0.0)) or 1.0
    dots = [
        {"cx": pad + (WIDTH - 2 * pad) * (p["x"] - x_low) / x_span, "cy": pad + (size - 2 * pad) * (1 - (p["y"] - y_low)
         / y_span), "color": color(p["cluster"]), "culprit": p["culprit"], "id": p["id"], "cluster": p["cluster"]}
        for p in points
    ]
    dots.sort(key=lambda d: d["culprit"])  # culprits drawn last, on top
    legend = [{"cluster": c, "name": name, "color": color(c)} for c, name in sorted(names.items())]
    return {"width": WIDTH, "height": size, "dots": dots, "legend": legend}


def share_bars(clusters: list[dict[str, Any]]) -> dict[str, Any]:
    """Per cluster: size share (grey) and harm share (coloured, a whisker from its lower bound) on one 0-100% axis."""
    left, right, row_height = 220, WIDTH - 60, 34
    span = right - left
    rows = []
    for row, cluster in enumerate(clusters):
        low = cluster["harm_share_ci"][0]
        rows.append({
            "y": 8 + row * row_height, "label": f"{cluster['id']}: {cluster['name']}", "color": color(cluster["id"]),
            "size_width": span * cluster["size_share"], "harm_width": span * cluster["harm_share"],
            "bound_x": left + span * low, "share_x": left + span * cluster["harm_share"],
            "text": f"{pct(cluster['harm_share'])} of harm, {pct(cluster['size_share'])} of rows",
        })
    return {"width": WIDTH, "height": 16 + row_height * len(rows), "left": left, "right": right, "rows": rows}


def verification_chart(verification: dict[str, Any]) -> dict[str, Any]:
    """Capability of the base, the fine-tune and every retrain (after, controls, reseeded) as bars on one axis."""
    left, right, bar_height, step = 190, WIDTH - 80, 20, 28
    span = right - left
    rows = [("base model", verification.get("base_rate"), "#4e79a7"),
            ("fine-tuned", verification.get("finetuned_rate"), "#c0392b")]
    tints = {"removal": "#59a14f", "fix": "#59a14f", "control": "#bab0ac", "reseeded": "#9c755f", "group": "#76b7b2"}
    rows += [(r["name"], r["rate"], tints.get(r["kind"], "#888888")) for r in verification.get("retrains", [])]
    bars = [{"label": label, "text": pct(value), "x": left, "y": 8 + i * step, "height": bar_height, "fill": fill,
             "width": span * max(0.0, min(1.0, float(value or 0.0))), "span": span}
            for i, (label, value, fill) in enumerate(rows)]
    return {"width": WIDTH, "height": 16 + step * len(rows), "left": left, "right": right, "bars": bars}
