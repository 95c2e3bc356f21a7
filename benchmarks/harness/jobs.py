"""The suite's steps run one independent job per run folder: `run_jobs` spreads them over worker processes.

Every job is a tiny model on one thread (two threads on a tiny model are slower than one), so on a machine with
C cores, C workers do C runs at once; `--jobs 1` runs them in this process, in order.
"""

from __future__ import annotations

import ctypes
import json
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, TypeVar

from gradian.files import atomic_write

T = TypeVar("T")


def default_jobs() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)


def _worker(parent: int) -> None:
    """A pool worker: one torch thread, and it dies with the harness (a killed harness must not leave workers
    writing into the cache and holding its locks while a rerun starts): Linux's parent-death signal, and a check
    that the parent is still there, for a parent that died before the signal was set."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)
    _one_thread()


def run_jobs(call: Callable[..., T], argument_lists: Sequence[Sequence[Any]], jobs: int,
             done: Callable[[T], None] | None = None) -> list[T]:
    """[call(*args) for args in argument_lists], `jobs` at a time in fresh processes; `done(result)` as each ends.

    One torch thread a job, inline too: two threads per job beside other jobs on the same cores wait on each other
    (beside two single-thread jobs on 2 cores, a SmolLM2 generation batch took 3.4 min with two threads, 1 min
    with one)."""
    if jobs <= 1 or len(argument_lists) <= 1:
        _one_thread()
        results = []
        for args in argument_lists:
            results.append(call(*args))
            if done:
                done(results[-1])
        return results
    context = multiprocessing.get_context("spawn")  # no forked copy of this process's torch threads
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_worker,
                             initargs=(os.getpid(),)) as pool:
        futures = {pool.submit(call, *args): i for i, args in enumerate(argument_lists)}
        slots: list[Any] = [None] * len(argument_lists)
        for future in as_completed(futures):
            slots[futures[future]] = future.result()
            if done:
                done(slots[futures[future]])
    return slots


def merge_records(path: Path, records: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """One results file over several invocations: `records` replace the file's records of the same `key` (a run
    measured again), the others are kept; written to `path` and returned, the kept ones first."""
    measured = {r[key] for r in records}
    kept = [r for r in json.loads(path.read_text()) if r[key] not in measured] if path.is_file() else []
    atomic_write(path, json.dumps(kept + records, indent=2) + "\n")
    return kept + records
