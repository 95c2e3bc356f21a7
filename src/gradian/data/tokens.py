"""The tokens a run's config adds to or sets on the tokenizer, applied as its framework applies them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenizers import AddedToken

from gradian.data.setup import TrainingSetup
from gradian.errors import InputError


def apply_training_tokens(tokenizer: Any, setup: TrainingSetup, where: str) -> list[str]:
    """Change `tokenizer` as training did; returns the tokens that were new to its vocabulary.

    TRL (`SFTTrainer`): `eos_token` replaces the tokenizer's and must exist; a `pad_token` outside the vocabulary
    is refused, as TRL refuses it. axolotl (`loaders/tokenizer.py`): each `special_tokens` entry is added with
    `add_special_tokens` (a new `pad_token` too), `tokens` with `add_tokens`, then `additional_special_tokens`;
    with no pad token left, pad = eos.
    """
    before = set(tokenizer.get_vocab())
    if setup.framework == "axolotl":
        _axolotl_tokens(tokenizer, setup)
    else:
        _trl_tokens(tokenizer, setup, where)
    return [token for token in tokenizer.get_vocab() if token not in before]


def _trl_tokens(tokenizer: Any, setup: TrainingSetup, where: str) -> None:
    if setup.eos_token is not None:
        if setup.eos_token not in tokenizer.get_vocab():
            raise InputError(f"eos_token {setup.eos_token!r} from the training config is not in the tokenizer's "
                             f"vocabulary; fix the config.", where)
        tokenizer.eos_token = setup.eos_token
    if setup.pad_token is not None and setup.pad_token not in tokenizer.get_vocab():
        raise InputError(f"pad_token {setup.pad_token!r} is not in the tokenizer's vocabulary; fix the config.", where)


def _axolotl_tokens(tokenizer: Any, setup: TrainingSetup) -> None:
    special = dict(setup.special_tokens)
    additional = special.pop("additional_special_tokens", None)
    for name, value in special.items():
        if isinstance(value, str):
            tokenizer.add_special_tokens({name: AddedToken(value, rstrip=False, lstrip=False, normalized=False)})
    if setup.new_tokens:
        tokenizer.add_tokens([AddedToken(t, rstrip=False, lstrip=False, normalized=False) for t in setup.new_tokens])
    if isinstance(additional, list):
        tokenizer.add_special_tokens({"additional_special_tokens": additional})
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token


def common_prefix(ids: Sequence[int], other: Sequence[int]) -> int:
    """How many tokens `ids` shares with the start of `other`."""
    length = 0
    for a, b in zip(ids, other, strict=False):
        if a != b:
            break
        length += 1
    return length
