"""Progress bars and stage messages for long steps: the only place the CLI draws them (rich, on stderr)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

T = TypeVar("T")

console = Console(stderr=True)


def say(message: str) -> None:
    console.print(f"[dim]›[/dim] {message}")


def bar(items: Iterable[T], label: str) -> Iterator[T]:
    """Wrap `items` in a progress bar labelled `label` (total from len() when there is one)."""
    total = len(items) if hasattr(items, "__len__") else None  # type: ignore[arg-type]
    columns = (TextColumn("  {task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(label, total=total)
        for item in items:
            yield item
            progress.advance(task)
