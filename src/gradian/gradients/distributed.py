"""Processes started by `torchrun` or `accelerate launch`: which one this is, and how they wait for each other.

Every process extracts its block of the feature store (`store.owned_files`); rank 0 alone writes everything
else (generations, scores, the report) and takes decisions (is the regression significant? the projection
shares?) that it broadcasts, so the other ranks never compute them again. The launcher's environment names the
process (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`); without it, a run is one process
and every call here is a no-op. NCCL when the processes have GPUs, gloo on CPUs.

An error on rank 0 inside `main_only` reaches every rank, so no process waits forever at the next barrier.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist

from gradian.errors import InputError

T = TypeVar("T")
# Rank 0 generates before the others extract, and scores, clusters and reports after: minutes to hours.
TIMEOUT = timedelta(hours=6)


@dataclass(frozen=True)
class Ranks:
    """This process's place among the run's processes: `rank` of `world` (0 of 1 without a launcher)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def shard(self) -> tuple[int, int]:
        return self.rank, self.world

    @property
    def active(self) -> bool:
        return self.world > 1 and dist.is_available() and dist.is_initialized()

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def broadcast(self, value: T | None) -> T:
        """Rank 0's `value` on every rank (pickled between Gradian's own processes, never read from a file)."""
        if not self.active:
            return value  # type: ignore[return-value]
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]  # type: ignore[return-value]

    def main_only(self, compute: Callable[[], T], *, share: bool = False) -> T | None:
        """`compute()` on rank 0; None elsewhere, or rank 0's result with `share`. Rank 0's error stops every rank."""
        result: T | None = None
        failure: tuple[bool, str] | None = None
        if self.is_main:
            try:
                result = compute()
            except Exception as caught:
                if self.active:
                    self.broadcast((isinstance(caught, InputError), str(caught)))
                raise
        failure = self.broadcast(failure)
        if failure is not None:  # only the other ranks get here with one: rank 0 raised above
            is_input, message = failure
            raise InputError(message) if is_input else RuntimeError(f"rank 0 stopped: {message}")
        return self.broadcast(result) if share else result

    def device(self, requested: str | None) -> str | None:
        """The device this rank computes on: its own GPU under a launcher (`cuda:LOCAL_RANK`), else as requested."""
        if self.world > 1 and torch.cuda.is_available() and requested in (None, "cuda"):
            return f"cuda:{self.local_rank}"
        return requested


def join() -> Ranks:
    """The process group the launcher set up in the environment, initialised once; one process without it."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Ranks()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=TIMEOUT)
    return Ranks(rank, world, local_rank)


def leave(ranks: Ranks) -> None:
    """End the process group `join` started."""
    if ranks.active:
        dist.destroy_process_group()
