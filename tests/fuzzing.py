"""What every fuzz test of a reader shares: the example budget, the time limit per input, and the two checks.

The property (issue 42, "nothing lost, nothing silent"): whatever the bytes, a reader returns a valid result or raises
`InputError` with one sentence (exit code 2 at the CLI); never another exception, never a hang, never a changed input.

CI runs `GRADIAN_FUZZ_EXAMPLES` (default 60) inputs per reader, derandomized so a run is repeatable; a benchmark run
sets thousands (`GRADIAN_FUZZ_EXAMPLES=2000`, see BENCHMARKS.md). An input that takes longer than
`GRADIAN_FUZZ_LIMIT_S` seconds (default 20) fails its test as a hang.
"""

from __future__ import annotations

import functools
import hashlib
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings

from gradian.errors import InputError

EXAMPLES = int(os.environ.get("GRADIAN_FUZZ_EXAMPLES", "60"))
LIMIT_S = float(os.environ.get("GRADIAN_FUZZ_LIMIT_S", "20"))
# deadline=None: hypothesis' deadline only times inputs that finish, and flakes on a busy machine; `bounded` stops hangs
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck),
                database=None)


class Hang(Exception):
    """An input the reader did not finish within `LIMIT_S` seconds."""


@contextmanager
def time_limit(seconds: float = LIMIT_S) -> Iterator[None]:
    def expire(signum: int, frame: Any) -> None:
        raise Hang(f"the reader took more than {seconds} s on one input")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def bounded(test: Callable[..., Any]) -> Callable[..., Any]:
    """Run each example of `test` under `time_limit` (put it under `@given`)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> Any:
        with time_limit():
            return test(*args, **kwargs)

    return run


def fingerprint(*paths: Path) -> dict[str, tuple[str, int]]:
    """sha256 and mtime of every file under `paths`: equal before and after a read, or the reader changed an input."""
    prints = {}
    for root in paths:
        for path in [root] if root.is_file() else sorted(root.rglob("*")):
            if path.is_file() and not path.is_symlink():
                prints[str(path)] = (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
    return prints


def answer(read: Callable[[], Any], *inputs: Path, names: str | None = None) -> Any:
    """`read()`'s result, or None when it raised `InputError` with one sentence (naming `names` when given); any other
    exception propagates (the fuzz failure), and a changed input fails the test."""
    before = fingerprint(*inputs)
    try:
        return read()
    except InputError as error:
        text = str(error)
        assert text and "\n" not in text and "Traceback" not in text, text
        assert names is None or names in text, text
        return None
    finally:
        assert fingerprint(*inputs) == before, "the reader changed its input"
