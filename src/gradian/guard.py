"""Nothing Gradian writes is something it reads: the one check every command makes before any work.

A command names what it reads (`Read`: the dataset, eval set, config, plug-in file, and the folders it reads as a
whole: the run folder, the adapter, the base model) and what it writes into its output folder (names relative to
it; a name ending in `/` is a folder Gradian writes as a whole, such as `gradients/`). `refuse_overwrite` raises
`InputError` (exit code 2) when a path it would write

- is an input: the same path once symlinks are resolved (`os.path.realpath`), or the same file by hard link
  (equal `(st_dev, st_ino)`);
- lies inside a folder Gradian reads as a whole (an `--out` inside the run folder, the adapter or the base model
  is refused: the run folder's reader would find Gradian's files among the run's);
- is a folder Gradian writes as a whole that holds an input (by path or by hard link).

An input file merely inside the output folder is fine when Gradian writes no file of that name: `--dataset
data/train.jsonl --out data` is accepted, `--dataset data/examples.jsonl --out data` is refused, since
examples.jsonl is a file `attribute` writes. Inputs that do not exist (a hub id for the base model) are skipped.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gradian.capabilities.registry import capability_file
from gradian.errors import InputError

FOLDER = "/"  # a written name ending in it is a folder Gradian writes as a whole


@dataclass(frozen=True)
class Read:
    """One input of a command: its option (`--dataset`), its path, and whether Gradian reads the folder as a whole."""

    option: str
    path: str | Path
    whole: bool = False


def inputs(*, dataset: str | Path | None, base_model: str | Path | None, adapter: str | Path | None = None,
           run: str | Path | None = None, config: str | Path | None = None, eval_dataset: str | Path | None = None,
           capability: str | None = None) -> list[Read]:
    """What a command reads, as its options name it: the files, and the folders read as a whole (a dataset saved by
    `save_to_disk` among them)."""
    files = (("--dataset", dataset), ("--eval-dataset", eval_dataset), ("--config", config),
             ("--capability", capability_file(capability)))
    folders = (("--run", run), ("--adapter", adapter), ("--base-model", base_model))
    return ([Read(option, path, whole=os.path.isdir(path)) for option, path in files if path] +
            [Read(option, path, whole=True) for option, path in folders if path])


def refuse_overwrite(out: str | Path, writes: Iterable[str], reads: Iterable[Read | None], *,
                     remedy: str = "choose another --out folder") -> None:
    """`InputError` naming the input and the output path when a path Gradian writes into `out` is, or lies inside,
    an input, or a folder Gradian writes holds one; `remedy` ends the sentence. Reads nothing else, writes nothing."""
    present = [read for read in reads if read is not None and _exists(read.path)]
    for name in writes:
        target = Path(out) / name.rstrip(FOLDER)
        for read in present:
            clash = _clash(target, name.endswith(FOLDER), read)
            if clash:
                raise InputError(f"Gradian would write {clash}; {remedy}, so that your input stays as it is.")


def _clash(target: Path, folder: bool, read: Read) -> str | None:
    """How writing `target` would touch input `read`, as the middle of the refusal's sentence; None if it would not."""
    written, source = os.path.realpath(target), os.path.realpath(read.path)
    what = f"{read.option} {read.path}"
    if written == source or _same_file(target, Path(read.path)):
        return f"{target}, which is {what}"
    if read.whole and os.path.isdir(source) and (_inside(written, source) or _linked_into(target, source)):
        return f"{target} inside {what}, a folder it reads as a whole"
    if folder and (_inside(source, written) or _linked_into(Path(read.path), written)):
        return f"the folder {target}, which holds {what}"
    return None


def _exists(path: str | Path) -> bool:
    try:
        return os.path.exists(path)
    except (OSError, ValueError):  # a name too long or with a NUL byte is no file Gradian could touch
        return False


def _inside(path: str, folder: str) -> bool:
    return path.startswith(folder.rstrip(os.sep) + os.sep)


def _identity(path: Path) -> tuple[int, int, int] | None:
    """(st_dev, st_ino, st_nlink) of an existing file (symlinks followed), else None."""
    try:
        stat = path.stat()
    except (OSError, ValueError):
        return None
    return stat.st_dev, stat.st_ino, stat.st_nlink


def _same_file(a: Path, b: Path) -> bool:
    first, second = _identity(a), _identity(b)
    return first is not None and second is not None and first[:2] == second[:2]


def _linked_into(path: Path, folder: str) -> bool:
    """`path` is a file with more than one hard link, and another of its names lies inside `folder`."""
    identity = _identity(path)
    if identity is None or identity[2] < 2 or not path.is_file():
        return False
    return any((found := _identity(Path(file))) is not None and found[:2] == identity[:2] for file in _files(folder))


def _files(folder: str) -> Iterator[str]:
    for root, _, names in os.walk(folder):
        for name in names:
            yield os.path.join(root, name)
