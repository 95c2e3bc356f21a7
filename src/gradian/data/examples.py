"""Examples as the trainer sees them: TRL dataset shapes, read from JSONL or a JSON array (either gzip-compressed
too), a Parquet file (datasets' `to_parquet`) or a dataset folder (`save_to_disk`): each columnar row as the JSON
object it would be in JSONL, numbered as lines are.

Supported rows (the shapes TRL's SFTTrainer accepts, plus Alpaca and ShareGPT):

- `{"prompt": str, "completion": str}`: standard prompt-completion (loss on the completion by default)
- `{"prompt": [msgs], "completion": [msgs]}`: conversational prompt-completion
- `{"messages": [msgs]}` (or ShareGPT `{"conversations": [{"from", "value"}]}`): conversational language modeling
- `{"text": str}`: language modeling (loss on everything)
- `{"instruction", "input"?, "output"}`: Alpaca, read as prompt-completion (as messages where a `history` list
  of [instruction, answer] pairs precedes it)
- `{"segments": [{"label", "text"}]}`: axolotl's input_output, read as prompt-completion
- a list of `{"role", "content"}` (or `{"from", "value"}`) turns under any other key: read as messages

Preference rows (`chosen`/`rejected` pairs, KTO's `completion` with a boolean `label`) are refused as training rows:
Gradian attributes SFT runs.

How training rendered a row is the framework's business (`data/render.py`, `data/axolotl.py`, from `raw`);
these shapes are what reports, duplicates and clusters read.

Every example gets a stable id: its `id` field, else its 1-based line number as a string, unless another row of
the file has that id: then `line-<n>` (`line-<n>-2`, ... while that is taken too). So a row without an id never makes
a valid file a duplicate-id error; two rows with the same explicit id still are. The rule needs every explicit id
before naming a row without one; a file is read once, and a second time only when a later row's explicit id turns
out to be a name already given (`collect_dataset`).
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from gradian.data.llamafactory import refuse_registry, registry_files
from gradian.errors import InputError, reason

Messages = list[dict[str, Any]]
T = TypeVar("T")

SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
GZIP, PARQUET = b"\x1f\x8b", b"PAR1"  # the first bytes of the two binary formats read
OTHER_FORMATS = {b"PK\x03\x04": "a ZIP archive", b"ARROW1": "an Arrow file", b"BZh": "a bzip2-compressed file",
                 b"\x28\xb5\x2f\xfd": "a zstd-compressed file", b"\xfd7zXZ": "an xz-compressed file"}  # refused, by name
REGISTRY_BYTES = 16 * 1024 * 1024  # a dataset registry is small; a file past this is never read whole to find one
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


@dataclass(frozen=True)
class Example:
    """One training or eval row, normalised to a TRL shape.

    `fields` holds exactly the keys TRL would read: `prompt`+`completion`, `messages` or `text`.
    For eval rows `completion` is the reference answer and may be absent.
    """

    id: str
    line: int
    fields: dict[str, Any]
    source: str = ""
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def shape(self) -> str:
        """`prompt_completion`, `conversational_prompt_completion`, `messages` or `text`."""
        if "messages" in self.fields:
            return "messages"
        if "text" in self.fields:
            return "text"
        if isinstance(self.fields.get("prompt"), list):
            return "conversational_prompt_completion"
        return "prompt_completion"

    @property
    def is_conversational(self) -> bool:
        return self.shape in ("messages", "conversational_prompt_completion")

    @property
    def prompt(self) -> str | Messages | None:
        """What the model is given: the prompt, or every message before the last assistant turn."""
        if self.shape == "messages":
            messages = self.fields["messages"]
            last = _last_assistant_index(messages)
            return messages[:last] if last is not None else messages
        if self.shape == "text":
            return None
        return self.fields["prompt"]

    @property
    def completion(self) -> str | Messages | None:
        """What the model should answer: the completion, or the last assistant turn."""
        if self.shape == "messages":
            messages = self.fields["messages"]
            last = _last_assistant_index(messages)
            return messages[last:] if last is not None else None
        if self.shape == "text":
            return self.fields["text"]
        return self.fields.get("completion")

    @property
    def prompt_text(self) -> str:
        return _as_text(self.prompt)

    @property
    def completion_text(self) -> str:
        return _as_text(self.completion)

    @property
    def text(self) -> str:
        """Prompt and completion as plain text, for duplicates, clustering and display."""
        return (self.prompt_text + "\n" + self.completion_text).strip()


def _last_assistant_index(messages: Messages) -> int | None:
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "assistant":
            return index
    return None


def _as_text(value: str | Messages | None) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return "\n".join(str(message.get("content") or "") for message in value)


def read_dataset(path: str | Path, *, eval_set: bool = False, text_field: str = "text") -> list[Example]:
    """Read every row of a JSONL file (or a JSON array) as `Example`s.

    Raises `InputError` naming the file and line for anything Gradian cannot read: bad JSON,
    non-UTF-8 bytes, a row of no known shape, a duplicate id, an empty file.
    With `eval_set=True` the reference answer is optional. `text_field` is TRL's `dataset_text_field`: the
    column that holds a language-modelling row's text.
    """
    return collect_dataset(path, list, eval_set=eval_set, text_field=text_field)


class IdsSettleLate(InputError):
    """A row without an id was named after its line, and a later row's explicit id is that name: the file must be
    read again knowing every explicit id (`collect_dataset` does)."""


def collect_dataset(path: str | Path, collect: Callable[[Iterator[Example]], T], *, eval_set: bool = False,
                    text_field: str = "text") -> T:
    """`collect(iter_dataset(path))` (a list, `ExampleColumns.from_examples`), collected a second time with every
    explicit id known when a row without an id was given a name a later row's explicit id claims."""
    try:
        return collect(iter_dataset(path, eval_set=eval_set, text_field=text_field))
    except IdsSettleLate:
        taken = frozenset(str(row["id"]) for _, row in _rows(Path(path))
                          if isinstance(row, dict) and row.get("id") is not None)
        return collect(iter_dataset(path, eval_set=eval_set, text_field=text_field, explicit=taken))


def missing(path: Path) -> str:
    """What to do about a dataset path that does not exist: check it, or, where it reads as a Hub dataset's name
    (owner/name as the Hub validates one, no file suffix), save that dataset to a file first (Gradian reads files and
    never downloads)."""
    if "/" in str(path) and not path.suffix and _hub_name(str(path)):
        return (f"no such file; Gradian reads the rows from a file and never downloads, so a Hub dataset is read once "
                f"saved: datasets.load_dataset(\"{path}\", split=\"train\").to_json(\"train.jsonl\"), then pass "
                f"--dataset train.jsonl.")
    return "no such file; check the path."


def _hub_name(name: str) -> bool:
    """Whether `name` is a repo id the Hub accepts (huggingface_hub's own check)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def iter_dataset(path: str | Path, *, eval_set: bool = False, text_field: str = "text",
                 explicit: frozenset[str] = frozenset()) -> Iterator[Example]:
    """`read_dataset` one row at a time (for `data.columns.ExampleColumns.from_examples`: no list of every row).

    The errors are `read_dataset`'s; an empty file raises once the end is reached. `explicit`: ids rows hold, which
    a row without one is never named; without them, `IdsSettleLate` when a row's explicit id is a name already given
    (read through `collect_dataset`, which handles it).
    """
    path = Path(path)
    try:
        path.stat()
    except (FileNotFoundError, NotADirectoryError):
        raise InputError(missing(path), path) from None
    except (OSError, ValueError) as error:  # a name too long, a symlink loop, a NUL byte
        raise InputError(f"cannot be opened ({getattr(error, 'strerror', None) or reason(error)}); check the path.",
                         path) from None
    if path.is_dir() and (path / "dataset_dict.json").is_file():
        splits = ", ".join(sorted(p.name for p in path.iterdir() if (p / "state.json").is_file())) or "none found"
        raise InputError(f"is a saved DatasetDict (splits: {splits}); pass the folder of the split the run trained "
                         "on.", path)
    if path.is_dir() and not (path / "state.json").is_file():
        raise InputError("is a folder, expected a JSONL file (one JSON object per line) or a dataset saved by "
                         "datasets' `save_to_disk`.", path)
    if not (path.is_file() or path.is_dir()):  # a pipe would block, a device would never end
        raise InputError("is not a regular file (a pipe or a device); pass the JSONL file itself.", path)
    first_line_of: dict[str, int] = {}
    named: set[str] = set()  # ids given to rows without one
    for line, row in _rows(path):
        unnamed = not _has_id(row)
        example = _example(row, line, path, eval_set, text_field,
                           _line_id(line, first_line_of, explicit) if unnamed else "")
        if unnamed:
            named.add(example.id)
        elif example.id in named:
            raise IdsSettleLate(f"the id {example.id!r} is also the name of the row without an id at line "
                                f"{first_line_of[example.id]}; read the file with read_dataset.", path, line)
        if example.id in first_line_of:
            raise InputError(
                f"duplicate id {example.id!r} (first seen at line {first_line_of[example.id]}); ids must be unique.",
                path,
                line,
            )
        first_line_of[example.id] = line
        yield example
    if not first_line_of:
        raise InputError("the dataset is empty; expected one JSON object per line.", path)


def _has_id(row: Any) -> bool:
    return isinstance(row, dict) and row.get("id") is not None


def _line_id(line: int, taken: dict[str, int], explicit: frozenset[str]) -> str:
    """The id of a row without one: its line number, else `line-<n>` (then `line-<n>-2`, ...) when that is taken."""
    name, suffix = str(line), 1
    while name in taken or name in explicit:
        suffix += 1
        name = f"line-{line}" if suffix == 2 else f"line-{line}-{suffix - 1}"
    return name


def _rows(path: Path) -> Iterator[tuple[int, Any]]:
    """(line, row) of a JSONL file or a JSON array, gzip-compressed or not; (row number, row) of a Parquet file or
    a dataset folder `save_to_disk` wrote."""
    if path.is_dir():
        yield from _saved_rows(path)
        return
    with open(path, "rb") as handle:
        magic = handle.read(8)
    if magic.startswith(PARQUET):
        yield from _parquet_rows(path)
        return
    other = next((kind for start, kind in OTHER_FORMATS.items() if magic.startswith(start)), None)
    if other is None and path.suffix.lower() in (".csv", ".tsv"):
        other = "a CSV file"
    if other is not None:
        raise InputError(f"is {other}; Gradian reads JSONL or a JSON array (either gzip-compressed), Parquet, or a "
                         "folder `save_to_disk` wrote: write the rows as JSONL (datasets' `Dataset.to_json`) and pass "
                         "that file.", path)
    if not magic.startswith(GZIP):
        yield from _json_rows(path, open)
        return
    try:
        yield from _json_rows(path, gzip.open)
    except (OSError, EOFError, zlib.error) as error:  # a truncated or damaged stream
        raise InputError(f"is not a readable gzip file ({reason(error)}); compress the JSONL again.", path) from None


def _json_rows(path: Path, opener: Callable[..., Any]) -> Iterator[tuple[int, Any]]:
    with opener(path, "rb") as handle:
        head = handle.read(4096).lstrip()
    if head.startswith(b"["):
        yield from enumerate(_json_array(path, opener), start=1)
        return
    first = True
    with opener(path, "rb") as handle:
        for line, data in enumerate(handle, start=1):
            text = _decode(data, path, line).strip()
            if not text:
                continue
            try:
                row = json.loads(text)
                if SURROGATE_ESCAPE.search(text):
                    _check_encodable(row, path, line)
                if first and (sources := registry_files(row)):
                    raise refuse_registry(path, sources)
                first = False
                yield line, row
            except json.JSONDecodeError as error:
                if first and head.startswith(b"{") and opener is open and (sources := _registry(path)):
                    raise refuse_registry(path, sources) from None
                raise InputError(f"not valid JSON ({error.msg} at column {error.colno}); fix or remove this line.",
                                 path, line) from None
            except (RecursionError, ValueError) as error:  # nesting too deep, an integer past Python's digit limit
                raise InputError(f"JSON Gradian cannot read ({_reason(error)}); simplify or remove this line.",
                                 path, line) from None


def _parquet_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """Each row of a Parquet file as the JSON object it would be in JSONL (a columnar file pads every row with every
    column: `_numbered`), numbered from 1 as lines are."""
    import pyarrow
    import pyarrow.parquet as pq

    try:
        yield from _numbered(batch.to_pylist() for batch in pq.ParquetFile(path).iter_batches(batch_size=1024))
    except (pyarrow.ArrowException, OSError) as error:
        raise InputError(f"is not a readable Parquet file ({reason(error)}); write it again, or pass the rows as "
                         "JSONL.", path) from None


def _saved_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """Each row of a dataset `save_to_disk` wrote (its Arrow files), as `_parquet_rows` reads a Parquet row."""
    import datasets
    import pyarrow

    try:
        saved = datasets.load_from_disk(str(path)).with_format("arrow")  # its Arrow tables, as a Parquet file's
        yield from _numbered(table.to_pylist() for table in saved.iter(batch_size=1024))
    except (pyarrow.ArrowException, OSError, ValueError, KeyError) as error:
        raise InputError(f"is not a readable saved dataset ({reason(error)}); save it again, or pass the rows as "
                         "JSONL.", path) from None


def _numbered(batches: Iterator[list[dict[str, Any]]]) -> Iterator[tuple[int, Any]]:
    """(1-based number, row) of columnar rows: a column the row leaves null is left out, and a value JSON has no
    type for (a timestamp, bytes) is its text."""
    number = 0
    for batch in batches:
        for row in batch:
            number += 1
            yield number, json.loads(json.dumps({k: v for k, v in row.items() if v is not None}, default=str))


def _registry(path: Path) -> list[str] | None:
    """The sources a pretty-printed LLaMA-Factory dataset_info.json lists (`data.llamafactory.registry_files`)."""
    if path.stat().st_size > REGISTRY_BYTES:
        return None
    try:
        return registry_files(json.loads(path.read_bytes().decode("utf-8-sig")))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, ValueError):
        return None


def _check_encodable(row: Any, path: Path, line: int) -> None:
    """A `\\ud800` escape without its pair decodes to text no tokenizer can encode."""
    try:
        json.dumps(row, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise InputError("holds a lone surrogate escape (\\ud800-\\udfff) that is no character; fix the text.",
                         path, line) from None


def _json_array(path: Path, opener: Callable[..., Any] = open) -> list[Any]:
    with opener(path, "rb") as handle:
        text = _decode(handle.read(), path, None)
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as error:
        raise InputError(f"not valid JSON ({error.msg}); expected a JSON array of objects or JSONL.",
                         path, error.lineno) from None
    except (RecursionError, ValueError) as error:
        raise InputError(f"JSON Gradian cannot read ({_reason(error)}).", path) from None
    if not isinstance(rows, list):
        raise InputError("expected a JSON array of objects or one JSON object per line.", path)
    return rows


def _reason(error: Exception) -> str:
    if isinstance(error, RecursionError):
        return "nested too deeply"
    return reason(error, 120)


def _decode(data: bytes, path: Path, line: int | None) -> str:
    try:
        return data.decode("utf-8-sig" if line in (1, None) else "utf-8")
    except UnicodeDecodeError as error:
        raise InputError(f"not UTF-8 (byte {error.start}); re-encode the file as UTF-8.", path, line) from None


def _example(row: Any, line: int, path: Path, eval_set: bool, text_field: str = "text", unnamed_id: str = "") -> Example:
    """The row as an `Example`; its id is its `id` field, else `unnamed_id` (else its line number)."""
    if not isinstance(row, dict):
        raise InputError(f"expected a JSON object, found {type(row).__name__}.", path, line)
    example_id = str(row["id"]) if row.get("id") is not None else (unnamed_id or str(line))
    fields = _fields(row, line, path, eval_set, text_field)
    return Example(id=example_id, line=line, fields=fields, source=str(path), raw=row)


def example_fields(row: dict[str, Any], text_field: str = "text") -> dict[str, Any] | None:
    """The `Example.fields` a training row of any supported shape reads as (a trainer's dataset row, say), or None
    when it has no known shape."""
    try:
        return _fields(row, 0, Path("row"), False, text_field)
    except InputError:
        return None


def _fields(row: dict[str, Any], line: int, path: Path, eval_set: bool, text_field: str = "text") -> dict[str, Any]:
    preference = None if eval_set or text_field in row else _preference_shape(row)
    if preference is not None:
        kind, columns = preference
        sft = ' (if these rows are SFT data, drop the "label" column)' if kind == "KTO" else ""
        raise InputError(f"rows look like {kind} preference data ({columns}); Gradian attributes SFT runs, not "
                         f"preference tuning, so pass the SFT dataset the adapter was trained on{sft}.", path, line)
    if "messages" in row or "conversations" in row:
        messages = row["messages"] if "messages" in row else _from_sharegpt(row["conversations"], line, path)
        _check_messages(messages, "messages", line, path)
        return {"messages": messages}
    if "prompt" in row:
        prompt = row["prompt"]
        completion = row.get("completion", row.get("reference"))
        if isinstance(prompt, list):
            _check_messages(prompt, "prompt", line, path)
            if completion is not None:
                if isinstance(completion, str):
                    completion = [{"role": "assistant", "content": completion}]
                _check_messages(completion, "completion", line, path)
        elif not isinstance(prompt, str):
            raise InputError('"prompt" must be a string or a list of messages.', path, line)
        elif completion is not None and not isinstance(completion, str):
            raise InputError('"completion" must be a string when "prompt" is a string.', path, line)
        if completion is None and not eval_set:
            raise InputError('has "prompt" but no "completion"; training rows need both.', path, line)
        return {"prompt": prompt} if completion is None else {"prompt": prompt, "completion": completion}
    if "instruction" in row:
        return _from_alpaca(row, line, path, eval_set)
    for name in dict.fromkeys((text_field, "text")):
        if name in row:
            if not isinstance(row[name], str):
                raise InputError(f'"{name}" must be a string.', path, line)
            return {"text": row[name]}
    if "segments" in row:
        return _from_segments(row["segments"], line, path)
    chats = [key for key, value in row.items() if _looks_like_chat(value)]
    if len(chats) == 1:  # messages under another name (axolotl's field_messages)
        messages = _from_sharegpt(row[chats[0]], line, path) if "from" in row[chats[0]][0] else row[chats[0]]
        _check_messages(messages, chats[0], line, path)
        return {"messages": messages}
    keys = ", ".join(json.dumps(key) for key in sorted(row)) or "none"  # quoted: a key may hold a newline
    raise InputError(
        f"no known fields (found: {keys}); expected prompt/completion, messages, text or instruction/output.",
        path,
        line,
    )


def _preference_shape(row: dict[str, Any]) -> tuple[str, str] | None:
    """What preference rows (TRL's DPO/ORPO/CPO pairs, KTO's labelled completions) look like, else None: as SFT rows
    they would be misread (a rejected answer trained on, or a pair seen as unknown fields). A pair beside `messages`
    (UltraFeedback's columns) is left to be read as the messages SFT trains on."""
    if "chosen" in row and "rejected" in row and not {"messages", "conversations", "completion"} & set(row):
        return "DPO", "prompt/chosen/rejected" if "prompt" in row else "chosen/rejected"
    if "completion" in row and isinstance(row.get("label"), bool):
        return "KTO", 'prompt/completion with a true/false "label"'
    return None


def _from_alpaca(row: dict[str, Any], line: int, path: Path, eval_set: bool) -> dict[str, Any]:
    parts = [row.get("instruction"), row.get("input")]
    if not all(isinstance(part, str) for part in parts if part is not None):
        raise InputError('"instruction" and "input" must be strings.', path, line)
    prompt = "\n\n".join(part for part in parts if part)
    output = row.get("output")
    if output is None:
        if not eval_set:
            raise InputError('has "instruction" but no "output"; training rows need both.', path, line)
        return {"prompt": prompt}
    if not isinstance(output, str):
        raise InputError('"output" must be a string.', path, line)
    history = row.get("history")
    if isinstance(history, list) and history:  # earlier [instruction, answer] turns (LLaMA-Factory's Alpaca)
        if not all(isinstance(p, list) and len(p) == 2 and all(isinstance(t, str) for t in p) for p in history):
            raise InputError('"history" must be a list of [instruction, answer] pairs of strings.', path, line)
        turns = [{"role": role, "content": text} for pair in history
                 for role, text in zip(("user", "assistant"), pair, strict=True)]
        return {"messages": [*turns, {"role": "user", "content": prompt}, {"role": "assistant", "content": output}]}
    return {"prompt": prompt, "completion": output}


def _looks_like_chat(value: Any) -> bool:
    return (isinstance(value, list) and bool(value) and isinstance(value[0], dict)
            and ("role" in value[0] or "from" in value[0]) and ("content" in value[0] or "value" in value[0]))


def _from_segments(segments: Any, line: int, path: Path) -> dict[str, Any]:
    """axolotl's input_output rows: the text before the first trained segment is the prompt, the rest the answer."""
    if not isinstance(segments, list) or not all(isinstance(s, dict) and isinstance(s.get("text"), str)
                                                 for s in segments):
        raise InputError('"segments" must be a list of {"label": true/false, "text": "..."}.', path, line)
    first = next((i for i, s in enumerate(segments) if s.get("label")), len(segments))
    return {"prompt": "".join(s["text"] for s in segments[:first]),
            "completion": "".join(s["text"] for s in segments[first:])}


def _from_sharegpt(conversations: Any, line: int, path: Path) -> Messages:
    if not isinstance(conversations, list):
        raise InputError('"conversations" must be a list of {"from", "value"} turns.', path, line)
    messages = []
    for turn in conversations:
        if not isinstance(turn, dict) or turn.get("from") not in SHAREGPT_ROLES:
            raise InputError('every "conversations" turn needs "from" (human/gpt/system) and "value".', path, line)
        messages.append({"role": SHAREGPT_ROLES[turn["from"]], "content": turn.get("value", "")})
    return messages


def _check_messages(messages: Any, name: str, line: int, path: Path) -> None:
    if not isinstance(messages, list) or not messages:
        raise InputError(f'"{name}" must be a non-empty list of {{"role", "content"}} messages.', path, line)
    for message in messages:
        if not isinstance(message, dict) or "role" not in message or not {"content", "tool_calls"} & set(message):
            raise InputError(f'every message in "{name}" needs "role" and "content" (or "tool_calls").', path, line)
