"""The feature store: memory-mapped files of per-example features, resumable, with settings beside them.

Layout of a store folder:

    settings.json                  what the features mean (gradient settings, projection, scaling, rows)
    ids.json                       example ids, row order of the features
    shard-<key>-<file>.npy         (rows of this file, dim) features, memory-mapped; `shard_rows` rows per file
    shard-<key>-<file>.done.npy    one flag per row (one byte each), memory-mapped too

The files cut the rows into fixed blocks of `shard_rows`, whatever the number of processes: process `rank` of
`world` writes the contiguous block of files `shard_bounds(n_files, rank, world)`, each file has one writer,
and one process or many write the same bytes (batches are planned inside a file, so a row's batch, and with it
its floating-point rounding, does not depend on the number of processes). A store begun by 8 processes can be
finished by 1. settings.json and ids.json are written by rank 0 only.

Rows are written into the features' memory map, then their flags are set in the flags' memory map: a crash
leaves unflagged rows that a rerun recomputes (one byte per flag is written whole; no flush or fsync: the page
cache outlives a killed process). A new file's bytes are reserved on disk when it is created (`space.preallocate`):
a full disk is an `OSError` (ENOSPC) there, from which a rerun resumes, not a SIGBUS in the middle of a write.
`<key>` hashes settings.json, so files from other settings are never read and are removed on rewrite.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from gradian.data.columns import StringColumn
from gradian.errors import InputError
from gradian.files import atomic_write
from gradian.space import preallocate

LAYOUT_VERSION = 2  # 1: one file per process (rank-of-world); 2: fixed blocks of shard_rows


def fingerprint(meta: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:12]


def shard_bounds(n_rows: int, rank: int, world: int) -> tuple[int, int]:
    """Contiguous block [start, stop) of `n_rows` items that part `rank` of `world` owns."""
    return n_rows * rank // world, n_rows * (rank + 1) // world


def file_bounds(n_rows: int, shard_rows: int, index: int) -> tuple[int, int]:
    """Rows [start, stop) held by store file `index`."""
    return index * shard_rows, min((index + 1) * shard_rows, n_rows)


def n_files(n_rows: int, shard_rows: int) -> int:
    return max(1, -(-n_rows // shard_rows))


def owned_files(n_rows: int, shard_rows: int, rank: int, world: int) -> range:
    """The store files that process `rank` of `world` writes: a contiguous block, one writer per file."""
    return range(*shard_bounds(n_files(n_rows, shard_rows), rank, world))


def _file_name(key: str, index: int) -> str:
    return f"shard-{key}-{index:05d}"


class ShardFile:
    """One file of the store and its done flags; opening an existing one with the same settings resumes it."""

    def __init__(self, root: Path, key: str, index: int, start: int, stop: int, dim: int, dtype: str) -> None:
        self.start, self.stop = start, stop
        name = _file_name(key, index)
        self.features_path, self.done_path = root / f"{name}.npy", root / f"{name}.done.npy"
        resumed = self._resume(stop - start, dim)
        if resumed is not None:
            self.features, self.done = resumed
        else:  # flags first, all False, so a crash between the two files leaves nothing that reads as done
            self.done = np.lib.format.open_memmap(self.done_path, mode="w+", dtype=bool, shape=(stop - start,))
            self.features = np.lib.format.open_memmap(self.features_path, mode="w+", dtype=dtype,
                                                      shape=(stop - start, dim))
            for path in (self.done_path, self.features_path):  # a full disk: ENOSPC here, not SIGBUS mid-write
                preallocate(path, path.stat().st_size)
        self.remaining = int((~np.asarray(self.done)).sum())  # rows still to write

    def written(self, local: np.ndarray, features: np.ndarray) -> None:
        """Store `features` at local rows `local`, then flag them done; a file complete is mapped afresh, so its
        written pages leave this process's memory (they stay in the page cache): resident memory holds the files
        being written, not the whole store."""
        new = int((~self.done[local]).sum())
        self.features[local] = features.astype(self.features.dtype, copy=False)  # before the flags
        self.done[local] = True
        self.remaining -= new
        if self.remaining == 0 and new:  # the shared mapping's pages are the page cache's: no flush needed
            self.features = np.load(self.features_path, mmap_mode="r+")
            self.done = np.load(self.done_path, mmap_mode="r+", allow_pickle=False)

    def _resume(self, rows: int, dim: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The file's features and done flags from a stopped run; None when absent or damaged (then recomputed)."""
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


class ShardWriter:
    """Writes the store files of process `rank` of `world`; an existing store with the same settings resumes."""

    def __init__(self, root: Path, meta: dict[str, Any], ids: list[str], rank: int, world: int, dim: int) -> None:
        self.root, self.key = Path(root), fingerprint(meta)
        self.root.mkdir(parents=True, exist_ok=True)
        for stale in self.root.glob("shard-*.npy"):  # other settings' files: every writer may remove them
            if not stale.name.startswith(f"shard-{self.key}-"):
                stale.unlink(missing_ok=True)
        if rank == 0:  # one writer per file
            atomic_write(self.root / "settings.json", json.dumps(meta, indent=2, sort_keys=True).encode())
            atomic_write(self.root / "ids.json", json.dumps(ids))
        shard_rows, dtype = meta["gradient"]["shard_rows"], meta["gradient"]["store_dtype"]
        self.files = [ShardFile(self.root, self.key, index, *file_bounds(len(ids), shard_rows, index), dim, dtype)
                      for index in owned_files(len(ids), shard_rows, rank, world)]
        self.start = self.files[0].start if self.files else 0
        self.stop = self.files[-1].stop if self.files else 0
        self.shard_rows = shard_rows

    def file_of(self, row: int) -> ShardFile:
        return self.files[(row - self.start) // self.shard_rows]

    def is_done(self, rows: list[int]) -> bool:
        return all(bool(self.file_of(row).done[row - self.file_of(row).start]) for row in rows)

    def write(self, rows: list[int], features: np.ndarray) -> None:
        """Store features (len(rows), dim) of global rows `rows` (this process's), then flag them done."""
        rows_array = np.asarray(rows)
        for file in self.files:
            inside = (rows_array >= file.start) & (rows_array < file.stop)
            if not inside.any():
                continue
            file.written(rows_array[inside] - file.start, features[inside])


class FeatureStore:
    """Read side of a store: rows in `ids` order, read in chunks so memory stays flat."""

    def __init__(self, root: str | Path, *, meta: dict[str, Any] | None = None, ids: list[str] | None = None) -> None:
        """Open the store at `root`; a writer passes the `meta` and `ids` it wrote (rank 0 may not have yet)."""
        self.root = Path(root)
        settings_path = self.root / "settings.json"
        if meta is None and not settings_path.exists():
            raise InputError("no feature store here (settings.json missing); run gradient extraction first", root)
        self.meta = meta if meta is not None else json.loads(settings_path.read_text())
        # the ids as one Arrow string column, not N Python strings held for the whole run
        self.ids = StringColumn.of(ids if ids is not None else json.loads((self.root / "ids.json").read_text()))
        key, shard_rows = fingerprint(self.meta), int(self.meta["gradient"]["shard_rows"])
        self._files: list[tuple[int, int, Path | None, np.ndarray]] = []
        for index in range(n_files(len(self.ids), shard_rows)):
            start, stop = file_bounds(len(self.ids), shard_rows, index)
            name = _file_name(key, index)
            path, done = self.root / f"{name}.npy", self.root / f"{name}.done.npy"
            flags = np.load(done) if done.exists() else np.zeros(stop - start, dtype=bool)
            self._files.append((start, stop, path if path.exists() else None, flags))

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
    def files(self) -> list[Path]:
        """The feature files, in row order (the done flags sit beside each, `.done.npy`)."""
        return [path for *_, path, _ in self._files if path is not None]

    @property
    def done(self) -> np.ndarray:
        return np.concatenate([flags for *_, flags in self._files]) if self._files else np.zeros(0, bool)

    @property
    def complete(self) -> bool:
        return bool(self.done.all())

    def _pieces(self, start: int, stop: int) -> Iterator[tuple[int, int, np.ndarray]]:
        """(lo, hi, memory map of the file holding rows [lo, hi)) covering [start, stop); raises on a missing row."""
        for first, last, path, flags in self._files:
            lo, hi = max(start, first), min(stop, last)
            if lo >= hi:
                continue
            if path is None or not flags[lo - first : hi - first].all():
                raise InputError(f"feature rows {lo}..{hi} are not extracted yet; rerun extraction", self.root)
            yield lo, hi, np.load(path, mmap_mode="r")[lo - first : hi - first]

    def rows(self, start: int, stop: int) -> np.ndarray:
        """Features of rows [start, stop) as float32; raises if any of them is not computed yet."""
        parts = [np.asarray(block, dtype=np.float32) for _, _, block in self._pieces(start, stop)]
        return np.concatenate(parts) if parts else np.zeros((0, self.dim), np.float32)

    def raw_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) as stored (the store dtype), for byte comparisons."""
        parts = [np.array(block) for _, _, block in self._pieces(start, stop)]
        return np.concatenate(parts) if parts else np.zeros((0, self.dim), self.meta["gradient"]["store_dtype"])

    def take(self, indices: np.ndarray) -> np.ndarray:
        """Features (len(indices), dim) float32 of the given rows, in the given order (a sample, say)."""
        indices = np.asarray(indices, dtype=np.int64)
        out = np.zeros((len(indices), self.dim), np.float32)
        order = np.argsort(indices, kind="stable")
        for first, last, _, _ in self._files:
            lo, hi = np.searchsorted(indices[order], [first, last])
            if lo < hi:
                picked = order[lo:hi]
                block = next(self._pieces(first, last))[2]
                out[picked] = block[indices[picked] - first]
        return out

    def chunks(self, chunk_rows: int = 4096) -> Iterator[tuple[int, np.ndarray]]:
        for start in range(0, self.n_rows, chunk_rows):
            yield start, self.rows(start, min(start + chunk_rows, self.n_rows))

    def __len__(self) -> int:
        return self.n_rows

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        array = self.rows(0, self.n_rows)
        return array if dtype is None else array.astype(dtype)
