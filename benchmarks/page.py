"""BENCHMARKS.md is written by several scripts: each owns the region between its two markers and nothing else."""

from __future__ import annotations

from pathlib import Path


def replace_region(path: Path, name: str, text: str) -> None:
    """Replace what stands between `<!-- NAME: begin -->` and `<!-- NAME: end -->` in `path` with `text`."""
    begin, end = f"<!-- {name}: begin -->", f"<!-- {name}: end -->"
    page = path.read_text(encoding="utf-8")
    if page.count(begin) != 1 or page.count(end) != 1 or page.index(begin) > page.index(end):
        raise SystemExit(f"{path}: needs one '{begin}' line and, after it, one '{end}' line around the region "
                         f"{name} writes; add them where its tables belong.")
    head, rest = page.split(begin)
    _, tail = rest.split(end)
    path.write_text(f"{head}{begin}\n{text.strip()}\n{end}{tail}", encoding="utf-8")
