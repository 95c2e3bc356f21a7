"""The feature store: memory-mapped shards of per-example features, resumable, with settings beside them.

Layout of a store folder:

    settings.json                     what the features mean (gradient settings, projection, scaling, rows)
    ids.json                          example ids, row order of the features
    shard-<key>-<rank>-of-<world>.npy         (rows of this shard, dim) features, memory-mapped
    shard-<key>-<rank>-of-<world>.done.npy    one flag per row (one byte each), memory-mapped too

Rows are written into the features' memory map, then their flags are set in the flags' memory map: a crash
leaves unflagged rows that a rerun recomputes (one byte per flag is written whole; no flush or fsync: the page
cache outlives a killed process).
`<key>` hashes settings.json, so files from other settings are never read and are removed on rewrite.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from gradian.errors import InputError
from gradian.files import atomic_write


def fingerprint(meta: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:12]


def shard_bounds(n_rows: int, rank: int, world: int) -> tuple[int, int]:
    """Contiguous block of rows that shard `rank` of `world` owns."""
    return n_rows * rank // world, n_rows * (rank + 1) // world


def _shard_name(key: str, rank: int, world: int) -> str:
    return f"shard-{key}-{rank:05d}-of-{world:05d}"


class ShardWriter:
    """Writes the rows of one shard; opening an existing shard with the same settings resumes it."""

    def __init__(self, root: Path, meta: dict[str, Any], ids: list[str], rank: int, world: int, dim: int) -> None:
        self.root, self.key = Path(root), fingerprint(meta)
        self.root.mkdir(parents=True, exist_ok=True)
        self.start, stop = shard_bounds(len(ids), rank, world)
        name = _shard_name(self.key, rank, world)
        self.features_path, self.done_path = self.root / f"{name}.npy", self.root / f"{name}.done.npy"
        for stale in self.root.glob(f"shard-*-{rank:05d}-of-{world:05d}*.npy"):
            if not stale.name.startswith(name):
                stale.unlink()
        payload = json.dumps(meta, indent=2, sort_keys=True).encode()
        atomic_write(self.root / "settings.json", payload)
        atomic_write(self.root / "ids.json", json.dumps(ids))
        resumed = self._resume(stop - self.start, dim)
        if resumed is not None:
            self.features, self.done = resumed
        else:  # flags first, all False, so a crash between the two files leaves nothing that reads as done
            self.done = np.lib.format.open_memmap(self.done_path, mode="w+", dtype=bool, shape=(stop - self.start,))
            self.features = np.lib.format.open_memmap(
                self.features_path, mode="w+", dtype=meta["gradient"]["store_dtype"], shape=(stop - self.start, dim)
            )

    def _resume(self, rows: int, dim: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The shard's features and done flags from a stopped run; None when absent or damaged (then recomputed)."""
        if not (self.features_path.exists() and self.done_path.exists()):
            return None
        try:
            features = np.load(self.features_path, mmap_mode="r+")
            done = np.load(self.done_path, mmap_mode="r+", allow_pickle=False)
        except (ValueError, OSError, EOFError):
            return None
        if features.shape != (rows, dim) or done.shape != (rows,) or done.dtype != bool:
            return None
        return features, done

    def is_done(self, rows: list[int]) -> bool:
        return bool(self.done[np.asarray(rows) - self.start].all())

    def write(self, rows: list[int], features: np.ndarray) -> None:
        """Store features (len(rows), dim) of global rows `rows`, then flag them done."""
        local = np.asarray(rows) - self.start
        self.features[local] = features.astype(self.features.dtype, copy=False)  # in the page cache before the flags
        self.done[local] = True


class FeatureStore:
    """Read side of a store: rows in `ids` order, read in chunks so memory stays flat."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        settings_path = self.root / "settings.json"
        if not settings_path.exists():
            raise InputError("no feature store here (settings.json missing); run gradient extraction first", root)
        self.meta = json.loads(settings_path.read_text())
        self.ids: list[str] = json.loads((self.root / "ids.json").read_text())
        key, world = fingerprint(self.meta), self.meta["world_size"]
        self._shards = []
        for rank in range(world):
            start, stop = shard_bounds(len(self.ids), rank, world)
            name = _shard_name(key, rank, world)
            path, done = self.root / f"{name}.npy", self.root / f"{name}.done.npy"
            flags = np.load(done) if done.exists() else np.zeros(stop - start, dtype=bool)
            self._shards.append((start, stop, path if path.exists() else None, flags))

    @property
    def dim(self) -> int:
        return int(self.meta["projection"]["dim"])

    @property
    def n_rows(self) -> int:
        return len(self.ids)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n_rows, self.dim)

    @property
    def done(self) -> np.ndarray:
        return np.concatenate([flags for *_, flags in self._shards]) if self._shards else np.zeros(0, bool)

    @property
    def complete(self) -> bool:
        return bool(self.done.all())

    def rows(self, start: int, stop: int) -> np.ndarray:
        """Features of rows [start, stop) as float32; raises if any of them is not computed yet."""
        parts = []
        for first, last, path, flags in self._shards:
            lo, hi = max(start, first), min(stop, last)
            if lo >= hi:
                continue
            if path is None or not flags[lo - first : hi - first].all():
                raise InputError(f"feature rows {lo}..{hi} are not extracted yet; rerun extraction", self.root)
            parts.append(np.asarray(np.load(path, mmap_mode="r")[lo - first : hi - first], dtype=np.float32))
        return np.concatenate(parts) if parts else np.zeros((0, self.dim), np.float32)

    def chunks(self, chunk_rows: int = 4096) -> Iterator[tuple[int, np.ndarray]]:
        for start in range(0, self.n_rows, chunk_rows):
            yield start, self.rows(start, min(start + chunk_rows, self.n_rows))

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        array = self.rows(0, self.n_rows)
        return array if dtype is None else array.astype(dtype)
