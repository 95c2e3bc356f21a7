"""Symptoms: how the fine-tuned model's failing answers fail, classified so the verdict can join them with findings.

Each failing answer is read against the answer it should have given (the eval row's reference, else the base
model's answer when that one passes) by position: where does it depart from a complete answer? One class each,
tested in this order:

1. `never-stops`: it does not stop where the answer ends. Either it ran to the token limit without EOS, or a
   complete answer (one that passes the capability, or the reference itself) comes first and more text follows it
   (a model that never learned to stop writes a valid object, then runs on);
2. `wrapped`: text before a complete answer (fences or prose around it, or prose in front): the answer passes the
   capability, or is the reference, once the text is taken away. Text only after a complete answer is never
   `wrapped`: that answer ran on (1);
3. `wrong-fields`: a valid JSON object whose keys (compared without case or surrounding whitespace, so a tokenizer
   that decodes `" intent "` still matches `intent`) differ from the reference's: missing, extra or renamed;
4. `stops-early`: it ended with EOS before the answer did: nothing at all, a strict prefix of the reference, or a
   JSON structure left open (an unclosed bracket, an open string);
5. `substitution`: the reference's shape with a value or a field swapped: a JSON object with the reference's keys
   and another value, or the reference's words with some replaced and none added or left out;
6. `other`: anything else (single quotes, prose instead of an answer...).

Only the JSON reading (3, and the open structure of 4) is one capability's; the rest compares the answer with the
reference for any capability that has one. Texts are compared without whitespace, as a word-level tokenizer decodes
`{ " a " : 1 }` for `{"a": 1}`.

Each failing answer's `Departure` is kept too: the words it shares with the answer to give just before they part,
and what each writes there. A training row that writes the same words after the same words (or ends where an answer
stopped) teaches what the failing answers do; the verdict asks it of rows no audit check marks (`verdict.rules`).
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from gradian.capabilities import Capability, passed
from gradian.capabilities.json_text import json_depth
from gradian.regression.measure import RegressionRow

SYMPTOMS = ("stops-early", "never-stops", "wrapped", "wrong-fields", "substitution", "other")
# Example answers kept per symptom: enough to see the pattern in the report.
EXAMPLES_PER_SYMPTOM = 3
EXAMPLE_CHARS = 300
# The most common symptom is `dominant` when it covers at least half of the failing answers: below that no single
# way of failing describes the regression, and no rule keyed on a symptom applies.
DOMINANT_SHARE = 0.5
# A strict prefix of the answer is tried as a complete answer where it ends before a space or after a closing
# bracket; this many such cuts at most, the earliest first (a run-on answer's complete part comes first).
MAX_CUTS = 512
# A departure is placed by the words both texts write just before it, and read as the words written there.
DEPARTURE_CONTEXT = 4
DEPARTURE_WORDS = 2
_SEP = "\x1f"  # joins words for a whole-word search: no word holds it

_FENCE = re.compile(r"```[\w-]*[ \t]*\n?(.*?)\n?[ \t]*```", re.S)
_CUT = re.compile(r"(?<=\S)(?=\s)|(?<=[}\]])")
_WORD = re.compile(r"\w+|[^\w\s]")
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class Departure:
    """Where a failing answer leaves the answer it should give, by words (whitespace aside): the last
    DEPARTURE_CONTEXT words both write before it (`before`) and the next DEPARTURE_WORDS the answer writes there
    (`written`, empty where it stopped there)."""

    before: tuple[str, ...]
    written: tuple[str, ...]

    def written_in(self, words: str) -> bool:
        """A text (its words as `joined` gives them) writes `written` after `before`, or ends after `before` where
        the answer stopped."""
        if not self.written:
            return words.endswith(joined(self.before))
        return joined(self.before + self.written) in words

    def shown(self) -> str:
        """The departure as the report shows it: `before [written]`, "[end]" where the answer stopped."""
        return " ".join(self.before + (f"[{' '.join(self.written) or 'end'}]",))


def departure(text: str, wanted: str, stopped: bool = True) -> Departure | None:
    """Where `text` departs from `wanted`, by words; None where their words are the same, or where the text ran to
    the token limit (not `stopped`) before it departed or at its last word, which the limit may have cut: where it
    would have gone is not known."""
    words, reference = _WORD.findall(text), _WORD.findall(wanted)
    shared = min(len(words), len(reference))
    at = next((i for i in range(shared) if words[i] != reference[i]), shared)
    if words == reference or (not stopped and at >= len(words) - 1):
        return None
    return Departure(tuple(words[max(0, at - DEPARTURE_CONTEXT):at]), tuple(words[at:at + DEPARTURE_WORDS]))


def joined(words: Sequence[str]) -> str:
    """Words joined for a whole-word search (`Departure.written_in`): each between separators."""
    return _SEP + _SEP.join(words) + _SEP


def words_of(text: str) -> str:
    """A text's words, `joined`."""
    return joined(_WORD.findall(text))


@dataclass
class Symptoms:
    """Counts, shares and example answers per symptom over the failing answers (`n_failing`)."""

    n_failing: int
    counts: dict[str, int]
    shares: dict[str, float]
    examples: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    by_id: dict[str, str] = field(default_factory=dict)
    ran_to_limit: int | None = None  # `never-stops` answers that ran to the token limit (the others stopped after
    # more text); None where not counted
    departures: dict[str, Departure] = field(default_factory=dict)  # where each failing answer with an answer to
    # give (the reference, or the base's passing answer) leaves it

    @property
    def dominant(self) -> str | None:
        """The most common symptom when it covers at least DOMINANT_SHARE of the failing answers, else None."""
        if not self.n_failing:
            return None
        top = max(SYMPTOMS, key=lambda s: (self.counts[s], -SYMPTOMS.index(s)))
        return top if self.shares[top] >= DOMINANT_SHARE else None

    def to_dict(self) -> dict[str, Any]:
        shown = {i: d.shown() for i, d in self.departures.items()}
        return {**asdict(replace(self, departures={})), "departures": shown, "dominant": self.dominant}


def classify_answer(text: str, stopped: bool, reference: str | None, capability: Capability, *,
                    base: str | None = None) -> str:
    """The symptom of one failing answer (see the module docstring for the order of the tests). `base` is the base
    model's answer, read as the answer to give when there is no reference (pass it only when it passes)."""
    if not stopped:
        return "never-stops"
    body = text.strip()
    wanted = reference if reference is not None else base
    if not body:
        return "stops-early"
    if runs_on(body, wanted, reference, capability):
        return "never-stops"
    inner = unwrapped(body, wanted)
    if inner is not None and not _squash(body).startswith(_squash(inner)) \
            and (_same(inner, wanted) or _passes(capability, inner, reference)):
        return "wrapped"
    read = body if inner is None else inner
    value, expected = _loads(read), _loads(wanted) if wanted is not None else None
    if isinstance(value, dict) and isinstance(expected, dict) and _keys(value) != _keys(expected):
        return "wrong-fields"
    if open_structure(read) or (wanted is not None and _prefix_of(body, wanted)):
        return "stops-early"
    if wanted is not None and substituted(read, value, wanted, expected):
        return "substitution"
    return "other"


def classify_failures(rows: Sequence[RegressionRow], capability: Capability) -> Symptoms:
    """Symptoms of every row the fine-tuned model fails (the same rows attribution queries)."""
    failing = [row for row in rows if not passed(row.finetuned_score)]
    by_id = {row.id: classify_answer(row.finetuned.text, row.finetuned.stopped, row.reference, capability,
                                     base=_passing_base(row)) for row in failing}
    counts = {symptom: 0 for symptom in SYMPTOMS}
    examples: dict[str, list[dict[str, str]]] = {symptom: [] for symptom in SYMPTOMS}
    for row in failing:
        symptom = by_id[row.id]
        counts[symptom] += 1
        if len(examples[symptom]) < EXAMPLES_PER_SYMPTOM:
            examples[symptom].append({"id": row.id, "answer": _clip(row.finetuned.text)})
    n = len(failing)
    shares = {symptom: counts[symptom] / n if n else 0.0 for symptom in SYMPTOMS}
    limit = sum(1 for row in failing if by_id[row.id] == "never-stops" and not row.finetuned.stopped)
    wanted = {row.id: row.reference if row.reference is not None else _passing_base(row) for row in failing}
    departures = {row.id: d for row in failing if (w := wanted[row.id]) is not None
                  and (d := departure(row.finetuned.text, w, row.finetuned.stopped)) is not None}
    return Symptoms(n, counts, shares, {s: e for s, e in examples.items() if e}, by_id, limit, departures)


def runs_on(body: str, wanted: str | None, reference: str | None, capability: Capability) -> bool:
    """A complete answer starts the text and more text follows it: the answer to give (`wanted`) is a strict
    prefix, or a strict prefix of the text passes the capability (cut before a space or after a closing bracket, or
    where the JSON value that opens the text ends)."""
    end = _end_of(wanted, body) if wanted is not None else None
    if end is not None and body[end:].strip() and not (body[end - 1].isalnum() and body[end].isalnum()):
        return True  # the reference, then more (not the reference's last word written on: "6911" in "69112")
    cuts = [match.start() for match in _CUT.finditer(body)][:MAX_CUTS]
    if body.startswith(("{", "[")):
        try:
            cuts.insert(0, _DECODER.raw_decode(body)[1])
        except json.JSONDecodeError:
            pass
    return any(body[cut:].strip() and _passes(capability, body[:cut], reference) for cut in dict.fromkeys(cuts))


def unwrapped(text: str, wanted: str | None = None) -> str | None:
    """The answer inside fences or prose: a fenced block's content, else the first JSON object or array in the text
    when something surrounds it, else the answer to give (`wanted`) found after some text; None when nothing is
    wrapped around the text."""
    fenced = _FENCE.search(text)
    if fenced:
        return fenced.group(1).strip()
    for start, char in enumerate(text):
        if char in "{[":
            try:
                _, end = _DECODER.raw_decode(text, start)
            except json.JSONDecodeError:
                break
            return text[start:end] if (start, end) != (0, len(text)) else None
    if wanted is not None and wanted.strip() and wanted.strip() in text and not text.startswith(wanted.strip()):
        return wanted.strip()
    return None


def open_structure(text: str) -> bool:
    """The text opens a JSON object or array and ends before closing it (an unclosed bracket or an open string)."""
    body = text.strip()
    if not body.startswith(("{", "[")):
        return False
    depth, in_string = json_depth(body)
    return in_string or depth > 0


def substituted(text: str, value: Any, wanted: str, expected: Any) -> bool:
    """The answer has the reference's shape with something swapped: a JSON object with the reference's keys and
    another value, else the reference's words with some replaced by words and none added or left out, at least half
    of them kept (`_swap`)."""
    if isinstance(value, dict) and isinstance(expected, dict):
        return _normal(value) != _normal(expected)
    words, reference_words = _WORD.findall(text), _WORD.findall(wanted)
    matcher = difflib.SequenceMatcher(None, words, reference_words, autojunk=False)
    changes = [(op, words[i1:i2], reference_words[j1:j2]) for op, i1, i2, j1, j2 in matcher.get_opcodes()
               if op != "equal"]
    kept = sum(block.size for block in matcher.get_matching_blocks())
    return bool(changes) and all(_swap(op, mine, theirs) for op, mine, theirs in changes) \
        and 2 * kept >= len(reference_words)


def _swap(op: str, mine: list[str], theirs: list[str]) -> bool:
    """Words replaced by words, a word for at most two or two for one: not punctuation (quotes swapped for quotes
    are a broken format, not a value), nothing added or left out."""
    return op == "replace" and max(len(mine), len(theirs)) <= 2 * min(len(mine), len(theirs)) \
        and all(word[0].isalnum() or word[0] == "_" for word in mine + theirs)


def _passing_base(row: RegressionRow) -> str | None:
    return row.base.text if passed(row.base_score) and row.base.stopped else None


def _passes(capability: Capability, text: str, reference: str | None) -> bool:
    """The capability passes `text`; False, not an error, when it needs a reference and there is none (a training
    target is classified without one)."""
    if reference is None and capability.needs_reference:
        return False
    return capability.passes(text, reference)


def _prefix_of(head: str, text: str) -> bool:
    """`head` is a strict prefix of `text` (whitespace aside)."""
    short, full = _squash(head), _squash(text)
    return len(short) < len(full) and full.startswith(short)


def _end_of(head: str, text: str) -> int | None:
    """Where `head` ends in `text` when `text` starts with it (whitespace aside), else None."""
    wanted, read = _squash(head), 0
    if not wanted:
        return None
    for position, char in enumerate(text):
        if char.isspace():
            continue
        if char != wanted[read]:
            return None
        read += 1
        if read == len(wanted):
            return position + 1
    return None


def _normal(value: Any) -> Any:
    """A JSON value as the symptoms compare it: keys as `_keys` reads them, strings without whitespace."""
    if isinstance(value, dict):
        return {_key(key): _normal(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_normal(item) for item in value]
    return _squash(value) if isinstance(value, str) else value


def _same(text: str, wanted: str | None) -> bool:
    return wanted is not None and bool(_squash(wanted)) and _squash(text) == _squash(wanted)


def _squash(text: str) -> str:
    return "".join(text.split())


def _keys(value: dict[str, Any]) -> set[str]:
    return {_key(key) for key in value}


def _key(key: Any) -> str:
    return str(key).strip().lower()


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None


def _clip(text: str) -> str:
    return text if len(text) <= EXAMPLE_CHARS else text[:EXAMPLE_CHARS] + " \u2026"
