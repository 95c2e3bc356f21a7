"""Rows as axolotl's own code tokenizes them, where axolotl is importable beside Gradian.

axolotl's config loader (`axolotl.cli.config.load_cfg`: validation, defaults, the named chat template) reads the
run's YAML, and the prompt strategy each `datasets:` entry names tokenizes that entry's rows
(`axolotl.utils.data.wrappers.get_dataset_wrapper`, the step `axolotl preprocess` runs per dataset), so the templates,
masks and roles are axolotl's, not a copy. The over-length strategy that follows is Gradian's (`data.render`), as is
everything where axolotl is absent or refuses: the port in `data.axolotl`, pinned against axolotl by
`benchmarks/harness/axolotl_conformance.py`.

Nothing of the user's is run: a config that names plug-ins or a dataset `type` that is a module path (code axolotl
would import) goes to the port, and the report says why.
"""

from __future__ import annotations

import copy
import functools
import importlib.metadata
import importlib.util
import os
import tempfile
from pathlib import Path
from typing import Any

from gradian.data.axolotl import ALPACA_TYPES, DEFAULT_ROLES
from gradian.data.examples import Example
from gradian.data.setup import TrainingSetup
from gradian.data.trainer_code import quiet
from gradian.errors import reason

IGNORE = -100
PLACEHOLDER = "the answer"  # a response to find where the prompt ends (an empty one trains no token to find)
Prepared = tuple[list[int], list[int], int]  # input_ids, labels, prompt length: a row before the length strategy


def installed_version() -> str | None:
    """axolotl's version where it is importable here, else None."""
    if importlib.util.find_spec("axolotl") is None:
        return None
    try:
        return importlib.metadata.version("axolotl")
    except importlib.metadata.PackageNotFoundError:
        return None


class AxolotlCode:
    """axolotl's config and prompt strategies for one run's rows; `refused` says why they cannot be used (then the
    port renders)."""

    def __init__(self, setup: TrainingSetup, tokenizer: Any) -> None:
        self.version = installed_version()
        self.tokenizer = tokenizer
        self.refused: str | None = None
        self._cfg: Any = None
        if self.version is None:
            self.refused = "axolotl is not installed"
        elif not setup.source or not Path(setup.source).is_file():
            self.refused = "no axolotl config file to give its loader"
        elif setup.axolotl.get("plugins") or any(_runs_code(e) for e in setup.axolotl.get("datasets") or []):
            self.refused = "the config names plug-ins or a dataset type that is a module: code Gradian does not run"
        else:
            self._load(setup)

    def _load(self, setup: TrainingSetup) -> None:
        os.environ.setdefault("AXOLOTL_DO_NOT_TRACK", "1")  # its config loader reports usage unless told not to
        os.environ.setdefault("DO_NOT_TRACK", "1")
        self._scratch = tempfile.TemporaryDirectory(prefix="gradian-axolotl-")  # its output folders: never the user's
        try:
            with quiet():
                from axolotl.cli.config import load_cfg
                from axolotl.loaders import load_tokenizer

                self._cfg = load_cfg(str(setup.source), base_model=self.tokenizer.name_or_path,
                                     output_dir=self._scratch.name, dataset_prepared_path=self._scratch.name)
                self.tokenizer = load_tokenizer(self._cfg)  # its special tokens and named chat template set
        except Exception as error:  # noqa: BLE001 - whatever its validation raises is a reason to use the port
            self.refused = f"axolotl {self.version}'s config loader refused the config ({reason(error)})"

    @functools.cached_property
    def _prompt_cfg(self) -> Any:
        """The run's config with train_on_inputs off: the boundary between prompt and answer is where the loss
        starts."""
        cfg = copy.deepcopy(self._cfg)
        cfg.train_on_inputs = False
        return cfg

    def rows(self, examples: list[Example], entry_index: int) -> list[Prepared | None] | None:
        """Each row of one `datasets:` entry as its prompt strategy tokenizes it (None: a row the strategy filters
        out or splits into pieces, which the port then renders); None when axolotl's code refuses the rows."""
        if self._cfg is None:
            return None

        entry = self._cfg.datasets[entry_index]

        def wrap(raws: list[dict[str, Any]]) -> Any:
            return self._wrap(entry, self._cfg, raws)

        raws = [dict(e.raw or {}) for e in examples]
        try:
            whole = wrap(raws)
            if len(whole) == len(raws):  # a strategy maps row to row, in order, unless it filters or splits
                return [_prepared(ids, labels) for ids, labels in zip(whole["input_ids"], whole["labels"], strict=True)]
            alone = [wrap([raw]) for raw in raws]
        except Exception as error:  # noqa: BLE001 - axolotl's refusal becomes the port's rendering, with its reason
            self.refused = f"axolotl {self.version}'s prompt strategy {entry.type!r} refused the rows ({reason(error)})"
            return None
        return [_prepared(one["input_ids"][0], one["labels"][0]) if len(one) == 1 else None for one in alone]


    def answer(self, example: Example, answer: str | None, entry_index: int) -> tuple[list[int], list[int]] | None:
        """(prompt ids, answer ids) of an eval row with `answer` as its response, as the entry's prompt strategy
        tokenizes it with train_on_inputs off: the prompt is every token before the last trained run, the answer
        that run (`answer` None: the prompt alone, the generation prompt). None where the row is not in a shape the
        strategy reads, or the strategy refuses it (the port renders it then)."""
        if self._cfg is None:
            return None
        entry = self._cfg.datasets[entry_index]
        raw = _with_answer(dict(example.raw or {}), entry, answer if answer is not None else PLACEHOLDER)
        if raw is None:
            return None
        try:
            wrapped = self._wrap(entry, self._prompt_cfg, [raw])
        except Exception:  # noqa: BLE001 - a row its strategy refuses: the port's rendering
            return None
        if len(wrapped) != 1:
            return None
        ids, labels = list(map(int, wrapped["input_ids"][0])), list(wrapped["labels"][0])
        trained = [i for i, label in enumerate(labels) if label != IGNORE]
        if not trained:
            return None
        end = trained[-1] + 1
        start = next(i for i in range(end, 0, -1) if labels[i - 1] == IGNORE) if IGNORE in labels[:end] else 0
        return ids[:start], (ids[start:end] if answer is not None else [])

    def _wrap(self, entry: Any, cfg: Any, raws: list[dict[str, Any]]) -> Any:
        import datasets
        from axolotl.utils.data.wrappers import get_dataset_wrapper

        base, _, style = str(entry.type).partition(":")
        with quiet():
            wrapped, _ = get_dataset_wrapper(entry, self.tokenizer, cfg, base, datasets.Dataset.from_list(raws),
                                             style or None)
        return wrapped


def _with_answer(raw: dict[str, Any], entry: Any, answer: str) -> dict[str, Any] | None:
    """The eval row in the entry's own format with `answer` as its response (its reference replaced), or None where
    the row is not in that format."""
    base = str(entry.type).partition(":")[0]
    if base in ALPACA_TYPES:
        return {**raw, "output": answer} if isinstance(raw.get("instruction"), str) else None
    if base != "chat_template":
        return None
    field = entry.get("field_messages") or "messages"
    mapping = entry.get("message_property_mappings") or {}
    role, content = mapping.get("role", "role"), mapping.get("content", "content")
    turns = raw.get(field)
    if not isinstance(turns, list) or not turns or not all(isinstance(t, dict) for t in turns):
        return None
    last = turns[-1]
    answered = DEFAULT_ROLES.get(str(last.get(role))) == "assistant"
    reply = {role: last.get(role) if answered else "assistant", content: answer}
    return {**raw, field: [*(turns[:-1] if answered else turns), reply]}


def _prepared(ids: list[int], labels: list[int]) -> Prepared:
    trained = next((i for i, label in enumerate(labels) if label != IGNORE), len(labels))
    return list(map(int, ids)), list(map(int, labels)), trained


def _runs_code(entry: Any) -> bool:
    """Whether axolotl would import a module the type names from outside its own strategies. Its loader
    (`axolotl.prompt_strategies.load`) imports a dotted type ending in `load` or `load_<style>` inside its own
    package, and any other dotted type's prefix as a package of its own (user code). A mapping of format strings
    runs none."""
    kind = entry.get("type") if isinstance(entry, dict) else None
    if not isinstance(kind, str):
        return False
    name = kind.partition(":")[0]
    last = name.rpartition(".")[2]
    return "." in name and not (last == "load" or last.startswith("load_"))
