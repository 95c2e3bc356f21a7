"""Rows as LLaMA-Factory's own code prepares them, where LLaMA-Factory is importable beside Gradian.

The run's YAML is read by LLaMA-Factory's own `DataArguments` (template, cutoff_len, train_on_prompt,
mask_history...); its template is set up by `get_template_and_fix_tokenizer`; each row is converted by the dataset
converter its `dataset_info.json` entry names (alpaca, sharegpt or openai, with the entry's columns and tags) and
tokenized by `SupervisedDatasetProcessor`, the steps `llamafactory-cli train` runs for `stage: sft`. Rows
`max_samples` leaves out or `val_size` splits off are not trained, as there. Generation prompts and scored answers
go through the same template (`encode_oneturn`).

Gradian has no port of this: where LLaMA-Factory is not installed, `data.llamafactory` refuses the run.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
from pathlib import Path
from typing import Any

from gradian.data import rows_cache
from gradian.data.examples import Example
from gradian.data.llamafactory import installed_version
from gradian.data.setup import TrainingSetup
from gradian.data.trainer_code import quiet
from gradian.errors import InputError, reason

IGNORE = -100
INFO_FILE = "dataset_info.json"
Encoded = tuple[list[int], list[int], int]  # input_ids, labels, full length (cutoff_len not applied)


class LlamaFactoryCode:
    """LLaMA-Factory's data arguments, template and supervised processor for one run's rows."""

    def __init__(self, setup: TrainingSetup, tokenizer: Any) -> None:
        self.version = installed_version()
        self.config = dict(setup.llamafactory)
        self.where = setup.source or "the LLaMA-Factory config"
        self.notes: list[str] = []
        self.cached_rows = 0  # rows read back from `data.rows_cache`, over every pass
        os.environ.setdefault("DISABLE_VERSION_CHECK", "1")  # its import-time check of the packages around it
        import jinja2
        from transformers import HfArgumentParser

        with quiet():  # its import prints and warns
            from llamafactory.data.processor import SupervisedDatasetProcessor
            from llamafactory.data.template import get_template_and_fix_tokenizer
            from llamafactory.hparams import DataArguments

        try:
            with quiet():
                (self.args,) = HfArgumentParser(DataArguments).parse_dict(self.config, allow_extra_keys=True)
                self.tokenizer = copy.deepcopy(tokenizer)  # LLaMA-Factory adds its template's tokens to it
                self.template = get_template_and_fix_tokenizer(self.tokenizer, self.args)
                whole = copy.copy(self.args)
                whole.cutoff_len = 10**9
                self._cut = SupervisedDatasetProcessor(template=self.template, tokenizer=self.tokenizer,
                                                       processor=None, data_args=self.args)
                self._whole = SupervisedDatasetProcessor(template=self.template, tokenizer=self.tokenizer,
                                                         processor=None, data_args=whole)
        except (ValueError, TypeError, NotImplementedError, jinja2.TemplateError) as error:  # its refusals of a config
            raise InputError(f"LLaMA-Factory {self.version} refused the config ({reason(error)}); fix it as "
                             "llamafactory-cli train would ask.", self.where) from None
        self._converters: dict[str, Any] = {}

    def rows(self, examples: list[Example]) -> list[Encoded | None]:
        """Each row of one file as the supervised processor tokenizes it (None: a row it drops as invalid: an even
        number of prompt turns, or not one response); kept by content in `data.rows_cache`."""
        if not examples:
            return []
        raws = [e.raw or e.fields for e in examples]
        entry = self._converter(examples[0].source)[1]
        name = rows_cache.key(raws, self.tokenizer, {"config": self.config, "entry": vars(entry)},
                              f"LLaMA-Factory {self.version}") if rows_cache.enabled(len(raws)) else None
        kept = rows_cache.read(name, len(raws)) if name is not None else None
        if kept is not None:
            self.cached_rows += len(kept)
            return [(ids, labels, whole) if whole >= 0 else None for ids, labels, whole in kept]
        out = self._rows(examples)
        if name is not None:
            rows_cache.save(name, [row or ([], [], -1) for row in out])
        return out

    def _rows(self, examples: list[Example]) -> list[Encoded | None]:
        columns = list(dict.fromkeys(key for e in examples for key in e.raw or {}))  # the file's, as datasets reads it
        out: list[Encoded | None] = []
        for example in examples:
            aligned = self.aligned(example, columns)
            if len(aligned["_prompt"]) % 2 != 1 or len(aligned["_response"]) != 1:
                out.append(None)
                continue
            ids, labels = self._encode(self._cut, aligned)
            near = len(ids) + 2 >= self.args.cutoff_len  # a row well short of cutoff_len was not cut: no second pass
            out.append((ids, labels, len(self._encode(self._whole, aligned)[0]) if near else len(ids)))
        return out

    def untrained(self, total: int, whole_run: bool = True) -> set[int]:
        """Row indices of one file that `max_samples` leaves out (per dataset) or `val_size` splits off into the eval
        set (the same permutation: datasets' `train_test_split` with the run's seed, as LLaMA-Factory's
        `split_dataset`; only where the file is the run's whole data: the split is of the datasets merged)."""
        gone = set(range(self.args.max_samples, total)) if self.args.max_samples is not None else set()
        kept = total - len(gone)
        size = self.args.val_size
        if size > 1e-6 and not whole_run:
            note = "val_size splits the run's datasets merged: Gradian counts every row of these files as trained"
            if note not in self.notes:
                self.notes.append(note)
        elif size > 1e-6 and kept > 1 and not self.args.streaming:
            import datasets

            size = int(size) if size > 1 else size
            split = datasets.Dataset.from_dict({"i": list(range(kept))}).train_test_split(
                test_size=size, seed=int(self.config.get("seed", 42)))
            gone.update(split["test"]["i"])
        return gone

    def prompt(self, example: Example) -> list[int]:
        """The prompt tokens the template gives a model at generation time."""
        aligned = self.aligned(example)
        with quiet():
            ids, _ = self.template.encode_oneturn(self.tokenizer, aligned["_prompt"] + [_assistant("")],
                                                  aligned["_system"], aligned["_tools"])
        return list(ids)

    def with_answer(self, example: Example, answer: str) -> tuple[list[int], list[int]]:
        """(prompt ids, answer ids) of `answer` after `example`'s prompt, as the template encodes a response."""
        aligned = self.aligned(example)
        with quiet():
            ids, answer_ids = self.template.encode_oneturn(self.tokenizer, aligned["_prompt"] + [_assistant(answer)],
                                                           aligned["_system"], aligned["_tools"])
        return list(ids), list(answer_ids)

    def aligned(self, example: Example, columns: list[str] | None = None) -> dict[str, Any]:
        """The row in LLaMA-Factory's aligned form (`_prompt`, `_response`, `_system`, `_tools`), by the converter
        its dataset entry names where the row is in that entry's format, else from Gradian's reading of it.
        `columns`: the file's columns (datasets gives a row None for a column other rows have)."""
        converter, attr = self._converter(example.source)
        raw = example.raw or {}
        keys = (attr.messages,) if attr.formatting != "alpaca" else (attr.prompt, attr.response)
        if not all(key in raw for key in keys):
            return _from_fields(example)
        row = {key: raw.get(key) for key in columns or raw}
        try:
            with quiet():
                return dict(converter(row))
        except KeyError as error:  # a column the entry names that no row of the file has
            raise InputError(f"LLaMA-Factory's {attr.formatting} converter reads the column {error}, which no row "
                             f"has, so llamafactory-cli train fails on this file too; name the file's columns in its "
                             f"{INFO_FILE} entry.", example.source or self.where) from None

    def _encode(self, processor: Any, aligned: dict[str, Any]) -> tuple[list[int], list[int]]:
        with quiet():
            ids, labels = processor._encode_data_example(prompt=aligned["_prompt"], response=aligned["_response"],
                                                         system=aligned["_system"], tools=aligned["_tools"],
                                                         images=[], videos=[], audios=[])
        return list(map(int, ids)), list(map(int, labels))

    def _converter(self, source: str) -> tuple[Any, Any]:
        if source not in self._converters:
            from llamafactory.data.converter import get_dataset_converter
            from llamafactory.data.parser import DatasetAttr

            entry, note = self._entry(source)
            attr = DatasetAttr("file", dataset_name=str(entry.get("file_name", source)))
            attr.join(entry)
            self._converters[source] = (get_dataset_converter(attr.formatting, attr, self.args), attr)
            if note:
                self.notes.append(note)
        return self._converters[source]

    def _entry(self, source: str) -> tuple[dict[str, Any], str]:
        """The `dataset_info.json` entry that lists `source` (its formatting, columns and tags), and a note where
        Gradian had to guess it."""
        names = self.config.get("dataset") or []
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else [str(n) for n in names]
        info, folder = self._info()
        listed = {name: entry for name, entry in info.items() if name in names and isinstance(entry, dict)}
        for entry in listed.values():
            if isinstance(entry.get("file_name"), str) and _same(folder / entry["file_name"], source):
                return entry, ""
        if len(listed) == 1:
            name, entry = next(iter(listed.items()))
            return entry, f"{Path(source).name} read as the config's one dataset, {name}"
        guess = {"formatting": "sharegpt"} if _rows_are_conversations(source) else {}
        return guess, (f"{Path(source).name} is not listed in {INFO_FILE} under the config's dataset names: read "
                       f"in LLaMA-Factory's {guess.get('formatting', 'alpaca')} format with its default columns")

    def _info(self) -> tuple[dict[str, Any], Path]:
        """The run's dataset registry: `dataset_dir`/dataset_info.json, beside the config or in the working folder."""
        folder = str(self.config.get("dataset_dir") or "data")
        bases = [Path(self.where).parent, Path.cwd()] if self.where else [Path.cwd()]
        for base in bases:
            path = base / folder / INFO_FILE
            if path.is_file():
                try:
                    value = json.loads(path.read_text(encoding="utf-8"))
                except (OSError, UnicodeDecodeError, ValueError, RecursionError):
                    raise InputError(f"is not a readable {INFO_FILE} (LLaMA-Factory's dataset registry); fix it.",
                                     path) from None
                return (value if isinstance(value, dict) else {}), path.parent
        return {}, bases[0] / folder


def _same(a: Path, b: str) -> bool:
    try:
        return a.resolve() == Path(b).resolve()
    except OSError:
        return False


def _rows_are_conversations(source: str) -> bool:
    with contextlib.suppress(OSError, UnicodeDecodeError):
        with open(source, encoding="utf-8") as handle:
            head = handle.read(4096)
        return '"conversations"' in head or '"messages"' in head
    return False


def _assistant(content: str) -> dict[str, str]:
    return {"role": "assistant", "content": content}


def _from_fields(example: Example) -> dict[str, Any]:
    """An eval row in another shape, in LLaMA-Factory's aligned form: its system turn apart, the last assistant
    turn as the response."""
    prompt = example.prompt
    turns = prompt if isinstance(prompt, list) else [{"role": "user", "content": str(prompt or "")}]
    system = "".join(str(t.get("content") or "") for t in turns if t.get("role") == "system")
    rest = [{"role": "assistant" if t.get("role") == "assistant" else "user", "content": str(t.get("content") or "")}
            for t in turns if t.get("role") != "system"]
    return {"_prompt": rest, "_response": [_assistant(example.completion_text)], "_system": system, "_tools": ""}
