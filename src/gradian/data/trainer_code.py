"""One wrapper of a trainer's own preparation code per run (`AxolotlCode`, `LlamaFactoryCode`): built once, since
its config loader, tokenizer set-up and template cost seconds, then shared by every pass over the run's rows and
every prompt rendered for it."""

from __future__ import annotations

import contextlib
import io
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from gradian.data.setup import TrainingSetup

T = TypeVar("T")
_BUILT: dict[tuple[Any, ...], tuple[Any, Any]] = {}  # key -> (the tokenizer, held so its id stays its own; the code)


def for_run(kind: Callable[[TrainingSetup, Any], T], setup: TrainingSetup, tokenizer: Any) -> T:
    """`kind(setup, tokenizer)`, built once per run settings and tokenizer."""
    settings = {key: value for key, value in setup.to_dict().items() if key != "prepared_by"}
    key = (kind, id(tokenizer), json.dumps(settings, sort_keys=True, default=str))
    if key not in _BUILT:
        if len(_BUILT) >= 4:
            _BUILT.clear()
        _BUILT[key] = (tokenizer, kind(setup, tokenizer))
    return _BUILT[key][1]


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """A trainer's code logs and prints as it loads and prepares: none of it reaches the user's terminal."""
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logging.disable(logging.NOTSET)
