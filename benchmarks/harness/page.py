"""BENCHMARKS.md is written by several scripts: each owns the region between its two markers and nothing else."""

from __future__ import annotations

from pathlib import Path


def region(path: Path, name: str) -> tuple[str, str, str]:
    """(before, inside, after) the region NAME of `path`: between `<!-- NAME: begin -->` and `<!-- NAME: end -->`."""
    begin, end = f"<!-- {name}: begin -->", f"<!-- {name}: end -->"
    page = path.read_text(encoding="utf-8")
    if page.count(begin) != 1 or page.count(end) != 1 or page.index(begin) > page.index(end):
        raise SystemExit(f"{path}: needs one '{begin}' line and, after it, one '{end}' line around the region "
                         f"{name} writes; add them where its tables belong.")
    head, rest = page.split(begin)
    inside, tail = rest.split(end)
    return f"{head}{begin}\n", inside, f"{end}{tail}"


def replace_region(path: Path, name: str, text: str) -> None:
    """Replace what stands in the region NAME of `path` with `text`."""
    head, _, tail = region(path, name)
    path.write_text(f"{head}{text.strip()}\n{tail}", encoding="utf-8")
