"""Rendering: every example tokenized exactly as the trainer saw it.

Mirrors TRL `SFTTrainer._prepare_dataset` (the reference the tests compare against row for row):

1. non-conversational rows get the EOS token appended to `completion` / `text` when missing;
2. prompt and prompt+completion are tokenized (chat template for messages, `add_special_tokens`
   defaults for strings); the completion starts where the two diverge;
3. labels keep the tokens of the loss mode (completion mask, assistant mask, or everything);
4. truncation at `max_length` (`keep_start` / `keep_end`); rows left with no supervised token
   are dropped, as TRL drops them; axolotl's `drop` strategy drops every over-long row;
5. a collator that masks pad ids (transformers' LM collator) hides every label equal to pad.

Under an axolotl config each row is rendered by its `datasets:` entry's type instead (`data/axolotl.py`), and
over-long rows follow `excess_length_strategy`. `Rendered.over_limit` says what became of a row past the limit.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from gradian.data.axolotl import axolotl_answer, axolotl_prompt, entry_for, render_axolotl
from gradian.data.examples import Example
from gradian.data.setup import TrainingSetup
from gradian.errors import InputError, reason

IGNORE = -100
BATCH = 4096
VERIFY_ROWS = 512  # rows on which the fast path is checked against TRL's way before it is trusted


@dataclass
class Rendered:
    """One example as trained: `labels` is `IGNORE` where a token carries no loss."""

    example_id: str
    input_ids: list[int]
    labels: list[int]
    full_length: int
    prompt_length: int
    tail_cut: bool = False
    dropped: bool = False
    over_limit: str = field(default="", metadata={"help": "past max_length: truncated | dropped | refused | split"})

    @property
    def truncated_tokens(self) -> int:
        """Tokens of the rendered row that training never saw."""
        return self.full_length - len(self.input_ids)

    @property
    def supervised(self) -> int:
        return len(self.labels) - self.labels.count(IGNORE)

    @property
    def label_fraction(self) -> float:
        return self.supervised / max(len(self.labels), 1)

    def last_supervised(self) -> int | None:
        for label in reversed(self.labels):
            if label != IGNORE:
                return label
        return None


def eos_token_of(tokenizer: Any, setup: TrainingSetup) -> str:
    return setup.eos_token or tokenizer.eos_token


def pad_token_id_of(tokenizer: Any, setup: TrainingSetup) -> int | None:
    if setup.pad_token is not None:
        return tokenizer.convert_tokens_to_ids(setup.pad_token)
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def completion_only(example: Example, setup: TrainingSetup) -> bool:
    if setup.completion_only_loss is None:
        return example.shape in ("prompt_completion", "conversational_prompt_completion")
    return setup.completion_only_loss and "prompt" in example.fields


def render_example(example: Example, tokenizer: Any, setup: TrainingSetup) -> Rendered:
    return render_dataset([example], tokenizer, setup)[0]


def render_dataset(examples: Sequence[Example], tokenizer: Any, setup: TrainingSetup) -> list[Rendered]:
    """Render many examples; string rows are tokenized in batches (the fast path for big datasets)."""
    return [row for chunk in render_chunks(examples, tokenizer, setup) for row in chunk]


def render_chunks(examples: Iterable[Example], tokenizer: Any, setup: TrainingSetup) -> Iterator[list[Rendered]]:
    """The rendered rows of `examples` in order, BATCH rows at a time (a caller may keep each chunk as columns:
    `data.columns.RenderedColumns.from_chunks`, so no list of every row is ever held)."""
    rows = iter(examples)  # read in order: columns build a batch of rows at once
    offsets = _OffsetsCheck()
    options = axolotl_options(setup) if setup.framework == "axolotl" else {}
    entries: dict[str, dict[str, Any]] = {}  # axolotl: one datasets entry per source file
    while chunk := list(itertools.islice(rows, BATCH)):
        if setup.framework != "axolotl":
            tokenized = _tokenize_chunk(chunk, tokenizer, setup, offsets)
            yield [_finish(example, *row, tokenizer, setup) for example, row in zip(chunk, tokenized, strict=True)]
            continue
        out = []
        for example in chunk:
            if example.source not in entries:
                entries[example.source] = entry_for(example, options)
            entry = entries[example.source]
            out.append(_finish_axolotl(example, *render_axolotl(example, tokenizer, options, entry), entry, setup))
        yield out


class _OffsetsCheck:
    """Whether rows can take the fast path: the Rust tokenizer called directly, and the prompt length read from
    the full row's character offsets instead of tokenizing every prompt a second time. TRL takes the common
    prefix of tokenize(prompt) and tokenize(prompt + completion); the offsets give the same number when the
    tokenizer splits at the prompt's end. Both are checked against TRL's way (ids and
    prompt lengths) on the first VERIFY_ROWS rows; any difference and every row takes TRL's way."""

    def __init__(self) -> None:
        self.trusted: bool | None = None


def _tokenize_chunk(
    examples: list[Example], tokenizer: Any, setup: TrainingSetup, offsets: _OffsetsCheck | None = None
) -> list[tuple[list[int], int, list[int] | None]]:
    """(input_ids, prompt_length, assistant_mask or None) per example, batched where the shape allows."""
    offsets = offsets or _OffsetsCheck()
    eos = eos_token_of(tokenizer, setup)
    results: list[tuple[list[int], int, list[int] | None] | None] = [None] * len(examples)
    plain = [i for i, example in enumerate(examples) if not example.is_conversational]
    if plain:
        prompts, fulls = zip(*(_plain_texts(examples[i], eos, setup) for i in plain), strict=True)
        for i, ids, prompt_len in zip(plain, *_plain_prompt_lengths(list(prompts), list(fulls), tokenizer, offsets),
                                      strict=True):
            results[i] = (ids, prompt_len, None)
    for i, example in enumerate(examples):
        if example.is_conversational:
            results[i] = _conversational_or_error(example, tokenizer, setup)
    return results  # type: ignore[return-value]


def _conversational_or_error(
    example: Example, tokenizer: Any, setup: TrainingSetup
) -> tuple[list[int], int, list[int] | None]:
    """`_conversational`, with a chat template that cannot render this row reported as bad input."""
    try:
        return _conversational(example, tokenizer, setup)
    except Exception as error:  # jinja errors, no template at all, a template that rejects a role
        raise InputError(f"the chat template cannot render this row ({reason(error)}); give the tokenizer a chat "
                         f"template or set chat_template_path in the training config.",
                         example.source or None, example.line) from None


def _plain_prompt_lengths(
    prompts: list[str | None], fulls: list[str], tokenizer: Any, offsets: _OffsetsCheck
) -> tuple[list[list[int]], list[int]]:
    """Token ids of each full row and the length of its prompt part, as TRL computes it."""
    backend = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
    if backend is None or offsets.trusted is False:
        full_ids = [list(ids) for ids in tokenizer(fulls)["input_ids"]]
        return full_ids, _exact_prompt_lengths(prompts, full_ids, tokenizer)
    encodings = backend.encode_batch(fulls)  # the Rust tokenizer itself: no per-row Python dicts
    full_ids = [encoding.ids for encoding in encodings]
    by_offsets = [_prompt_end(e.offsets, len(p)) if p is not None else 0
                  for p, e in zip(prompts, encodings, strict=True)]
    if offsets.trusted is None:  # first rows: check the fast path against TRL's way
        sample = slice(0, VERIFY_ROWS)
        trl_ids = [list(ids) for ids in tokenizer(fulls[sample])["input_ids"]]
        exact = _exact_prompt_lengths(prompts[sample], trl_ids, tokenizer)
        offsets.trusted = trl_ids == full_ids[sample] and by_offsets[sample] == exact
        if not offsets.trusted:
            return _plain_prompt_lengths(prompts, fulls, tokenizer, offsets)
    return full_ids, by_offsets


def _exact_prompt_lengths(prompts: list[str | None], full_ids: list[list[int]], tokenizer: Any) -> list[int]:
    """TRL's way: the common prefix of the tokenized prompt and the tokenized prompt + completion."""
    present = [p for p in prompts if p is not None]
    prompt_iter = iter(tokenizer(present)["input_ids"] if present else [])
    return [_common_prefix(next(prompt_iter), ids) if p is not None else 0
            for p, ids in zip(prompts, full_ids, strict=True)]


def _prompt_end(spans: Sequence[tuple[int, int]], prompt_chars: int) -> int:
    """Tokens before the first one that reaches past the prompt's last character."""
    for index, (_, end) in enumerate(spans):
        if end > prompt_chars:
            return index
    return len(spans)


def _plain_texts(example: Example, eos: str, setup: TrainingSetup) -> tuple[str | None, str]:
    if example.shape == "text":
        text = example.fields["text"]
        return None, text if text.endswith(eos) else text + eos
    completion = example.fields.get("completion", "")
    if not completion.endswith(eos):
        completion += eos
    return example.fields["prompt"], example.fields["prompt"] + completion


def _conversational(example: Example, tokenizer: Any, setup: TrainingSetup) -> tuple[list[int], int, list[int] | None]:
    kwargs: dict[str, Any] = {"tokenize": True, "return_dict": True, "chat_template": setup.chat_template}
    if example.shape == "messages":
        out = tokenizer.apply_chat_template(
            example.fields["messages"], return_assistant_tokens_mask=setup.assistant_only_loss, **kwargs
        )
        return list(out["input_ids"]), 0, _assistant_mask(out, setup)
    prompt_ids = tokenizer.apply_chat_template(example.fields["prompt"], add_generation_prompt=True, **kwargs)
    out = tokenizer.apply_chat_template(
        example.fields["prompt"] + example.fields.get("completion", []),
        return_assistant_tokens_mask=setup.assistant_only_loss,
        **kwargs,
    )
    ids = list(out["input_ids"])
    return ids, _common_prefix(prompt_ids["input_ids"], ids), _assistant_mask(out, setup)


def _assistant_mask(out: Any, setup: TrainingSetup) -> list[int] | None:
    return list(out["assistant_masks"]) if setup.assistant_only_loss and "assistant_masks" in out else None


def _common_prefix(ids: Sequence[int], other: Sequence[int]) -> int:
    length = 0
    for a, b in zip(ids, other, strict=False):
        if a != b:
            break
        length += 1
    return length


def _finish(
    example: Example,
    ids: list[int],
    prompt_len: int,
    assistant_mask: list[int] | None,
    tokenizer: Any,
    setup: TrainingSetup,
) -> Rendered:
    start = prompt_len if completion_only(example, setup) else 0
    labels = [IGNORE] * start + ids[start:]  # the completion mask: loss from where the prompt ends
    if assistant_mask is not None:
        labels = [label if mask else IGNORE for label, mask in zip(labels, assistant_mask, strict=True)]
    if setup.collator_masks_pad:
        pad_id = pad_token_id_of(tokenizer, setup)
        labels = [IGNORE if token == pad_id else label for token, label in zip(ids, labels, strict=True)]
    full_length = len(ids)
    dropped = tail_cut = False
    if setup.max_length is not None and not setup.packing and full_length > setup.max_length:
        cut = slice(None, setup.max_length) if setup.truncation_mode == "keep_start" else slice(-setup.max_length, None)
        ids, labels = ids[cut], labels[cut]
        tail_cut = setup.truncation_mode == "keep_start"  # the completion's end, EOS included, is gone
        if tail_cut and setup.eos_after_truncation:  # add_eos_token after the cut: the row ends mid-answer in EOS
            eos = tokenizer.convert_tokens_to_ids(eos_token_of(tokenizer, setup))
            ids, labels = ids[:-1] + [eos], labels[:-1] + [eos if labels[-1] != IGNORE else IGNORE]
        dropped = setup.drop_overlong
        over = "dropped" if dropped else "truncated"
    else:
        over = ""
    dropped = dropped or labels.count(IGNORE) == len(labels)
    return Rendered(example.id, ids, labels, full_length, prompt_len, tail_cut, dropped, over)


def _finish_axolotl(example: Example, ids: list[int], labels: list[int], prompt_len: int, entry: dict[str, Any],
                    setup: TrainingSetup) -> Rendered:
    """axolotl's `handle_long_seq_in_dataset`, then its drop of rows with no trainable token."""
    limit, full_length = setup.max_length, len(ids)
    strategy = setup.excess_length_strategy or "drop"
    over, tail_cut = "", False
    if limit is not None and full_length > limit:
        if str(entry.get("type", "")).startswith("completion"):
            over = "split"  # axolotl's completion type trains every sequence_len piece of the row
        else:
            over = {"truncate": "truncated", "raise": "refused"}.get(strategy, "dropped")
            ids, labels, tail_cut = ids[:limit], labels[:limit], True
    dropped = over in ("dropped", "refused") or len(ids) < 2 or labels.count(IGNORE) == len(labels)
    return Rendered(example.id, ids, labels, full_length, prompt_len, tail_cut, dropped, over)


def axolotl_options(setup: TrainingSetup) -> dict[str, Any]:
    """What data/axolotl.py reads: the config's datasets and prompt settings, with the run's sequence_len."""
    return {**setup.axolotl, "sequence_len": setup.max_length or 10**9, "config_path": setup.source}


def render_prompt(example: Example, tokenizer: Any, setup: TrainingSetup) -> list[int]:
    """The prompt tokens a model is given at generation time (generation prompt added for chats)."""
    if setup.framework == "axolotl":
        return axolotl_prompt(example, tokenizer, axolotl_options(setup))
    prompt = example.prompt
    if isinstance(prompt, list):
        out = tokenizer.apply_chat_template(
            prompt, add_generation_prompt=True, tokenize=True, return_dict=True, chat_template=setup.chat_template
        )
        return list(out["input_ids"])
    return list(tokenizer(prompt or "")["input_ids"])


def render_with_answer(example: Example, answer: str, tokenizer: Any, setup: TrainingSetup) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids) of `answer` rendered after `example`'s prompt exactly as training renders completions
    (no truncation: the answer is scored whole)."""
    if setup.framework == "axolotl":
        return axolotl_answer(example, answer, tokenizer, axolotl_options(setup))
    prompt = example.prompt
    fields: dict[str, Any] = {"prompt": prompt, "completion": answer}
    if isinstance(prompt, list):
        fields["completion"] = [{"role": "assistant", "content": answer}]
    untruncated = TrainingSetup(**{**setup.to_dict(), "max_length": None, "completion_only_loss": True,
                                   "collator_masks_pad": False})
    rendered = render_example(Example(example.id, example.line, fields), tokenizer, untruncated)
    return rendered.input_ids[: rendered.prompt_length], rendered.input_ids[rendered.prompt_length:]


def render_answer(prompt_ids: list[int], answer_ids: list[int]) -> tuple[list[int], list[int]]:
    """input_ids and labels for a prompt followed by an answer given as tokens (loss on the answer only)."""
    return prompt_ids + answer_ids, [IGNORE] * len(prompt_ids) + list(answer_ids)
