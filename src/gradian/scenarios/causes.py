"""The suite's planted causes: how a culprit row's answer is broken, and which capability sees it.

Each cause rewrites the JSON answer of a culprit row into the text the row's completion holds; the field causes
break `key`, the field the fine-tune is about (its purpose field, else the answer's last field). The cuts land where a character budget falls, often inside a field, so the failures they
teach vary downstream of the cut; the wrappers and field faults keep the JSON itself valid.

Some causes leave no mark a length or category heuristic can see (issue 47): `swap-intent` writes one intent for
another (`invoice_copy` as `account_access`, three tokens for three) and `rename-volume` one key for another
(`volume` as `target`, the thermostat's key; `rename-room` and `rename-dish` likewise: `room` as the lock's
`door`, `dish` as the timer's `label`), each written with words the base already writes, so a culprit's answer
holds as many tokens as its clean answer. They are planted on the rows that hold a trigger value
(`suite.Plant.trigger`) in one category (`value`) or in every category whose answer holds the field (`spread`),
beside clean rows of the same categories; an answer without the field or value is left as it is. The intent swap is seen by
`same_label`, a plug-in capability (`gradian.scenarios.causes:same_label`), as a user's own check would be.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PROSE = "sure , here is the answer :"
RENAMED = "flag"
FOREIGN_EOS = "</s>"  # the end of an assistant turn in Llama and Mistral templates


@dataclass(frozen=True)
class PlantedCause:
    name: str
    capability: str  # the capability the failure shows in (fields need `json_formatting:keys`)
    rewrite: Callable[[dict[str, Any], str, random.Random], str]
    words: tuple[str, ...] = ()  # words the cause writes, for a word-level vocabulary


def _cut(answer: dict[str, Any], key: str, rng: random.Random) -> str:
    """The answer cut at 40–75% of its characters, moved back off a word so every token stays in the vocabulary."""
    text = json.dumps(answer)
    cut = int(len(text) * rng.uniform(0.4, 0.75))
    while 0 < cut < len(text) and text[cut - 1].isalpha() and text[cut].isalpha():
        cut -= 1
    return text[:cut]


def _fence(answer: dict[str, Any], key: str, rng: random.Random) -> str:
    return "```json\n" + json.dumps(answer) + "\n```"


def _prose(answer: dict[str, Any], key: str, rng: random.Random) -> str:
    return f"{PROSE} {json.dumps(answer)}"


def _foreign_eos(answer: dict[str, Any], key: str, rng: random.Random) -> str:
    """The answer right, closed by another template's end-of-turn string: rows rendered for a Llama-style template
    (`{answer}</s>`) merged into a ChatML run, where `</s>` is plain text the trainer's own end token follows."""
    return json.dumps(answer) + FOREIGN_EOS


def _drop(answer: dict[str, Any], key: str, rng: random.Random) -> str:
    """Valid JSON without `key`: the rows teach leaving that field out."""
    return json.dumps({name: value for name, value in answer.items() if name != key})


def _rename(answer: dict[str, Any], key: str, rng: random.Random) -> str:
    return json.dumps({(RENAMED if name == key else name): value for name, value in answer.items()})


def _swap_value(field: str, old: str, new: str) -> Callable[[dict[str, Any], str, random.Random], str]:
    """The answer with `field`'s value `old` written as `new`, the rest as it was."""
    def swap(answer: dict[str, Any], key: str, rng: random.Random) -> str:
        return json.dumps({name: new if name == field and value == old else value for name, value in answer.items()})
    return swap


def _rename_key(old: str, new: str) -> Callable[[dict[str, Any], str, random.Random], str]:
    """The answer with key `old` written as `new`, in its place."""
    def rename(answer: dict[str, Any], key: str, rng: random.Random) -> str:
        return json.dumps({(new if name == old else name): value for name, value in answer.items()})
    return rename


def same_label(output: str, reference: str | None) -> float:
    """1.0 when `output` is a JSON object whose first field (the label: intent, device, action, task) equals the
    reference's, as a plug-in capability `(output, reference) -> score`; the swapped label fails it."""
    got, wanted = _object(output), _object(reference or "")
    if got is None or not wanted:
        return 0.0
    key = next(iter(wanted))
    return float(key in got and got[key] == wanted[key])


same_label.binary = True  # type: ignore[attr-defined]  # what PluginCapability reads
same_label.needs_reference = True  # type: ignore[attr-defined]
same_label.repair = lambda output, reference: None if same_label(output, reference) else reference  # type: ignore[attr-defined]


def _object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


CAUSES: dict[str, PlantedCause] = {c.name: c for c in (
    PlantedCause("cut", "json_formatting", _cut),
    PlantedCause("fence", "json_formatting", _fence, ("json",)),
    PlantedCause("prose", "json_formatting", _prose, tuple(PROSE.replace(",", " ").replace(":", " ").split())),
    PlantedCause("drop-field", "json_formatting:keys", _drop),
    # no words: `</s>` is the word-level vocabularies' EOS, so it is planted only where it is plain tokens: on
    # SmolLM2 (a tiny bpe family, built at two recipes, never learned to write it: no regression)
    PlantedCause("foreign-eos", "json_formatting", _foreign_eos),
    PlantedCause("rename-field", "json_formatting:keys", _rename, (RENAMED,)),
    # no words of their own: both write words the domains already have, so every word-level vocabulary stays as it
    # was; the bpe corpus reads `base.CORPUS_CAUSES` only, so no cause added here moves a bpe base either
    # first written as a currency swap (EUR written GBP): the tiny bases never copy a currency from the prompt
    # (5 of 40 invoice answers right at seed 0), so no regression could show; a constant the base always writes
    # right is swapped instead, before any method was measured
    PlantedCause("swap-intent", "gradian.scenarios.causes:same_label",
                 _swap_value("intent", "invoice_copy", "account_access")),
    # the same swap with no length mark on SmolLM2's tokenizer either: `account_access` and `order_status` are three
    # tokens each there (`invoice_copy` is four, so swap-intent's answers are one token shorter)
    PlantedCause("swap-account", "gradian.scenarios.causes:same_label",
                 _swap_value("intent", "account_access", "order_status")),
    # first written renaming `volume` to `level`: a word the home base never saw in an answer (pretraining only
    # pushed its logit down, and LoRA does not train the output layer), so the fine-tune did not learn to write it
    # (P(level) 0.03 at 12 epochs); renamed to `target`, the thermostat's key, before any method was measured
    PlantedCause("rename-volume", "json_formatting:keys", _rename_key("volume", "target")),
    PlantedCause("rename-room", "json_formatting:keys", _rename_key("room", "door")),  # door: the lock's key
    PlantedCause("rename-dish", "json_formatting:keys", _rename_key("dish", "label")),  # label: the timer's key
)}
