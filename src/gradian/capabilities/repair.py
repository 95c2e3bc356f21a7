"""Minimal-edit repair of a JSON object answer (DESIGN.md, "minimal-edit y⁺").

The repaired answer keeps the model's own text (whitespace included) for every complete field it
wrote, then continues with the reference's remaining fields and closes the object. It therefore
shares the longest possible prefix with the failing output, and the first token where the two part
ways is the decision that failed (stopping mid-object, a stray fence, a wrong key), not an earlier
difference in content.

Keys are compared as `normal_key` spells them (whitespace dropped): a tokenizer whose decode puts a space between
tokens writes `" intent "` for the reference's `"intent"`, and the repair must still see the same field.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

_WS = re.compile(r"[ \t\n\r]*")
_ITEM_SEP = re.compile(r"[ \t\n\r]*,[ \t\n\r]*")
_KEY_SEP = re.compile(r"[ \t\n\r]*:[ \t\n\r]*")
_CLOSE = re.compile(r"[ \t\n\r]*\}")
_DECODER = json.JSONDecoder()


def normal_key(key: str) -> str:
    """A key as compared with another answer's keys: without whitespace (`" book _ id "` is `book_id`)."""
    return "".join(key.split())


@dataclass(frozen=True)
class Field:
    """One complete `"key": value` pair (`key` as `normal_key` spells it); `start` is the key's opening quote, `end`
    is just past the value."""

    key: str
    start: int
    value_start: int
    end: int


@dataclass
class ObjectScan:
    """How far `text` reads as a JSON object: its complete, distinct-key fields, in order.

    `open_end` is just past `{` and the whitespace after it (-1: the text does not open an object);
    `closed_at` is the index of the closing `}` when the object was closed right after its last field.
    """

    text: str
    open_end: int
    fields: list[Field] = field(default_factory=list)
    closed_at: int | None = None

    def keys(self) -> list[str]:
        return [f.key for f in self.fields]


def parse_object(text: str) -> ObjectScan:
    """Scan `text` as a JSON object for as long as it stays valid, keeping every complete field."""
    position = _WS.match(text, 0).end()
    if not text.startswith("{", position):
        return ObjectScan(text, -1)
    position = _WS.match(text, position + 1).end()
    scan = ObjectScan(text, position)
    if text.startswith("}", position):
        scan.closed_at = position
        return scan
    while (pair := _field_at(text, position)) is not None and pair.key not in scan.keys():
        scan.fields.append(pair)
        separator = _ITEM_SEP.match(text, pair.end)
        if separator is None:
            close = _CLOSE.match(text, pair.end)
            scan.closed_at = close.end() - 1 if close else None
            break
        position = separator.end()
    return scan


def _field_at(text: str, position: int) -> Field | None:
    key_end = _string_end(text, position)
    colon = _KEY_SEP.match(text, key_end) if key_end is not None else None
    if colon is None:
        return None
    try:
        _, value_end = _DECODER.raw_decode(text, colon.end())
    except json.JSONDecodeError:
        return None
    return Field(normal_key(json.loads(text[position:key_end])), position, colon.end(), value_end)


def _string_end(text: str, position: int) -> int | None:
    if not text.startswith('"', position):
        return None
    try:
        _, end = _DECODER.raw_decode(text, position)
    except json.JSONDecodeError:
        return None
    return end


def repair_json_object(output: str, reference: str, *, allowed_keys: set[str] | None = None) -> str | None:
    """The failing `output` kept up to where it failed, continued with `reference`'s remaining fields.

    `allowed_keys` (for `json_formatting:keys`) stops keeping the model's fields at the first key the
    reference does not have. Returns None when the reference is not a JSON object.
    """
    ref = parse_object(reference)
    if ref.open_end < 0 or ref.closed_at is None:
        return None
    out = parse_object(output)
    if out.open_end < 0:
        return reference  # the answer never opened an object: the first token already failed
    kept = _kept_fields(out.fields, allowed_keys)
    kept_end = kept[-1].end if kept else out.open_end
    remaining = [f for f in ref.fields if f.key not in {k.key for k in kept}]
    item_sep = _item_separator(output, kept, ref)
    first_sep, partial_at = "", kept_end
    if kept:
        written = _ITEM_SEP.match(output, kept_end)
        first_sep = written.group() if written else item_sep
        partial_at = written.end() if written else -1
    texts = _field_texts(output, partial_at, reference, remaining)
    continuation = first_sep + item_sep.join(texts) if texts else ""
    repaired = output[:kept_end] + continuation + _closing(output, kept_end, texts, ref)
    return repaired if isinstance(_loads(repaired), dict) else reference


def _kept_fields(fields: list[Field], allowed_keys: set[str] | None) -> list[Field]:
    kept = []
    for pair in fields:
        if allowed_keys is not None and pair.key not in allowed_keys:
            break
        kept.append(pair)
    return kept


def _item_separator(output: str, kept: list[Field], ref: ObjectScan) -> str:
    """The separator the model used between fields, else the reference's, else `, `."""
    if len(kept) >= 2:
        return output[kept[0].end : kept[1].start]
    if len(ref.fields) >= 2:
        return ref.text[ref.fields[0].end : ref.fields[1].start]
    return ", "


def _field_texts(output: str, partial_at: int, reference: str, remaining: list[Field]) -> list[str]:
    """Reference fields still missing, as the reference wrote them; a field the model had started goes first,
    with the model's own key text, so the shared prefix runs into its value."""
    texts = [reference[f.start : f.end] for f in remaining]
    key_end = _string_end(output, partial_at) if partial_at >= 0 else None
    if key_end is None:
        return texts
    started = normal_key(json.loads(output[partial_at:key_end]))
    colon = _KEY_SEP.match(output, key_end)
    for index, pair in enumerate(remaining):
        if pair.key == started:
            key_sep = colon.group() if colon else reference[_string_end(reference, pair.start) : pair.value_start]
            texts.pop(index)
            texts.insert(0, output[partial_at:key_end] + key_sep + reference[pair.value_start : pair.end])
            break
    return texts


def _closing(output: str, kept_end: int, texts: list[str], ref: ObjectScan) -> str:
    """The model's own `}` when it closed right after its last kept field and nothing is missing."""
    if not texts and (written := _CLOSE.match(output, kept_end)):
        return written.group()
    start = ref.fields[-1].end if ref.fields else ref.open_end
    return ref.text[start : ref.closed_at + 1]


def _loads(text: str) -> object:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None
