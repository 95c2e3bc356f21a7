"""The base model's own greedy answers to the training prompts, generated once and kept in the output folder.

`--rank activation` compares each training row's completion with what the base model would have said to the same
prompt. Generating an answer to every training prompt is the costliest part of that ranking, so the answers are
kept in `base_answers/<key>.jsonl`, the key a sha256 of everything they depend on (the base model's identity, its
files' sizes and times included (`loaded_identity`), its dtype and stop tokens, the prompts' token ids, the token
limit, greedy decoding): a rerun into the same folder reuses them, and any change, a base replaced in place
included, regenerates them under another key. The adapter is not in the key: it is switched off while generating.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gradian.data.base_model import loaded_identity
from gradian.files import atomic_write
from gradian.regression.generation import GENERATION_BATCH, GeneratedAnswer, generate, stop_token_ids

FOLDER = "base_answers"


def answers_key(model: Any, tokenizer: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> str:
    """sha256 of what the base model's greedy answers to `prompts` depend on."""
    config = getattr(model, "config", None)
    identity = {
        "base_model": loaded_identity(model),
        "config_sha256": _sha256(config.to_json_string(use_diff=False).encode()) if config is not None else "",
        "dtype": str(next(model.parameters()).dtype),
        "stop_token_ids": stop_token_ids(model, tokenizer),
        "prompts_sha256": _sha256(json.dumps([list(p) for p in prompts]).encode()),
        "max_new_tokens": max_new_tokens,
        "decoding": "greedy",
    }
    return _sha256(json.dumps(identity, sort_keys=True).encode())


def base_answers(model: Any, tokenizer: Any, prompts: Sequence[Sequence[int]], out_dir: str | Path, *,
                 max_new_tokens: int, batch_size: int = GENERATION_BATCH,
                 progress: Callable[[], Callable[[int], Any]] | None = None) -> tuple[list[GeneratedAnswer], bool]:
    """(the base model's greedy answer to each prompt, whether they came from the cache); `model` a PeftModel, its
    adapter switched off while generating; `progress()`, called once when generation starts (never on a hit),
    gives the callable that gets the count each batch finished."""
    path = Path(out_dir) / FOLDER / f"{answers_key(model, tokenizer, prompts, max_new_tokens)}.jsonl"
    cached = _read(path, len(prompts))
    if cached is not None:
        return cached, True
    if prompts:
        with model.disable_adapter():
            answers = generate(model, tokenizer, [list(p) for p in prompts], max_new_tokens=max_new_tokens,
                               batch_size=batch_size, progress=progress() if progress is not None else None)
    else:
        answers = []
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, "".join(json.dumps(a.to_dict(), ensure_ascii=False) + "\n" for a in answers))
    return answers, False


def _read(path: Path, n: int) -> list[GeneratedAnswer] | None:
    """The answers kept at `path`, or None when absent or damaged (a damaged file is regenerated, never trusted)."""
    if not path.is_file():
        return None
    try:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        answers = [GeneratedAnswer(list(r["ids"]), str(r["text"]), bool(r["stopped"])) for r in rows]
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError):
        return None
    return answers if len(answers) == n else None


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
