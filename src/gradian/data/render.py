"""Rendering: every example tokenized exactly as the trainer saw it.

Mirrors TRL `SFTTrainer._prepare_dataset` (the reference the tests compare against row for row):

1. non-conversational rows get the EOS token appended to `completion` / `text` when missing;
2. prompt and prompt+completion are tokenized (chat template for messages, `add_special_tokens`
   defaults for strings); the completion starts where the two diverge;
3. labels keep the tokens of the loss mode (completion mask, assistant mask, or everything);
4. truncation at `max_length` (`keep_start` / `keep_end`); rows left with no supervised token
   are dropped, as TRL drops them; axolotl's `drop` strategy drops every over-long row;
5. a collator that masks pad ids (transformers' LM collator) hides every label equal to pad.

Under an axolotl config each row is tokenized by its `datasets:` entry's type instead: by axolotl's own prompt
strategies where axolotl is installed (`data/axolotl_code.py`), else by Gradian's port (`data/axolotl.py`); and
over-long rows follow `excess_length_strategy`. `Rendered.over_limit` says what became of a row past the limit.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from gradian.data import openai_format, trainer_code
from gradian.data.axolotl import axolotl_answer, entry_for, render_axolotl
from gradian.data.axolotl_code import AxolotlCode
from gradian.data.examples import Example
from gradian.data.llamafactory_code import LlamaFactoryCode
from gradian.data.setup import TrainingSetup
from gradian.data.tokens import common_prefix
from gradian.data.trl_prepare import (
    IGNORE,
    Preparation,
    TrlCannotPrepare,
    template_kwargs,
    trl_chat,
    trl_masks_prompt_alone,
    trl_rows,
    trl_version,
)
from gradian.errors import InputError, reason

BATCH = 4096
VERIFY_ROWS = 512  # rows on which the fast path is checked against TRL's way before it is trusted
VERIFY_CHARS = 100_000  # ...of at most this many characters: a huge row would cost the check as much as TRL's way


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
    over_limit: str = field(default="", metadata={
        "help": "past max_length: truncated | dropped | refused | split; held_out: set aside by the trainer unread "
                "(LLaMA-Factory's max_samples and val_size)"})

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


def render_dataset(examples: Sequence[Example], tokenizer: Any, setup: TrainingSetup,
                   tally: Preparation | None = None) -> list[Rendered]:
    """Render many examples; string rows are tokenized in batches (the fast path for big datasets)."""
    return [row for chunk in render_chunks(examples, tokenizer, setup, tally) for row in chunk]


def render_chunks(examples: Iterable[Example], tokenizer: Any, setup: TrainingSetup,
                  tally: Preparation | None = None) -> Iterator[list[Rendered]]:
    """The rendered rows of `examples` in order, BATCH rows at a time (a caller may keep each chunk as columns:
    `data.columns.RenderedColumns.from_chunks`, so no list of every row is ever held). `tally` counts whose code
    prepared them."""
    rows = iter(examples)  # read in order: columns build a batch of rows at once
    tally = tally if tally is not None else Preparation()
    trusted: dict[str, bool] = {}  # shape -> whether the fast path equals TRL's code on its first rows
    position = 0  # wrapped packing: where the next row starts in the rows laid end to end
    options = axolotl_options(setup) if setup.framework == "axolotl" else {}
    entries: dict[str, dict[str, Any]] = {}  # axolotl: one datasets entry per source file
    own: AxolotlCode | None = None  # axolotl's own code, where it is installed
    if setup.framework == "llamafactory":  # whole: val_size splits rows by a permutation of all of them
        yield _llamafactory_rows(list(rows), tokenizer, setup, tally)
        return
    while chunk := list(itertools.islice(rows, BATCH)):
        if setup.framework != "axolotl":
            prepared = _prepare_chunk(chunk, tokenizer, setup, trusted, tally)
            rendered = [_limit(example, *row, tokenizer, setup) for example, row in zip(chunk, prepared, strict=True)]
            if setup.packing and setup.packing_strategy == "wrapped" and setup.max_length:
                position = _wrapped(rendered, setup.max_length, position)
            yield rendered
            continue
        if own is None:
            own = trainer_code.for_run(AxolotlCode, setup, tokenizer)
        yield _axolotl_chunk(chunk, tokenizer, setup, options, entries, own, tally)


Prepared = tuple[list[int], list[int], int]  # input_ids, labels, prompt length: a row before truncation


def _axolotl_chunk(chunk: list[Example], tokenizer: Any, setup: TrainingSetup, options: dict[str, Any],
                   entries: dict[str, dict[str, Any]], own: AxolotlCode, tally: Preparation) -> list[Rendered]:
    """The rows of an axolotl run by its own prompt strategies where axolotl runs here, else by Gradian's port;
    then axolotl's length strategy."""
    listed = options.get("datasets") or []
    prepared: dict[int, Prepared | None] = {}
    for source in dict.fromkeys(e.source for e in chunk):
        if source not in entries:
            entries[source] = entry_for(next(e for e in chunk if e.source == source), options)
        group = [i for i, e in enumerate(chunk) if e.source == source]
        index = next((k for k, e in enumerate(listed) if e is entries[source]), None)
        rows = own.rows([chunk[i] for i in group], index) if index is not None else None
        prepared.update(zip(group, rows or [None] * len(group), strict=True))
    out = []
    for i, example in enumerate(chunk):
        entry, row = entries[example.source], prepared[i]
        if row is None:
            row = render_axolotl(example, tokenizer, options, entry)
            tally.port_rows += 1
            tally.note(own.refused or ("the config lists no dataset entry" if not listed else
                                       "axolotl's strategy filtered the row out or split it: Gradian's port read it"))
        else:
            tally.trainer_rows += 1
            tally.axolotl_version = own.version
        out.append(_finish_axolotl(example, *row, entry, setup))
    return out


def _prepare_chunk(examples: list[Example], tokenizer: Any, setup: TrainingSetup, trusted: dict[str, bool],
                   tally: Preparation) -> list[Prepared]:
    """Each example as TRL prepares it, untruncated; shape by shape, since TRL reads a dataset's kind from its
    first row. String rows take the batched fast path once it has equalled TRL's code on their shape's first
    VERIFY_ROWS rows; chat rows always go through TRL's code (tools, templates, roles are its business)."""
    results: list[Prepared | None] = [None] * len(examples)
    for shape in dict.fromkeys(example.shape for example in examples):
        group = [i for i, example in enumerate(examples) if example.shape == shape]
        part = [examples[i] for i in group]
        prepared: list[Prepared] | None
        if setup.framework == openai_format.FRAMEWORK and shape == "messages":
            prepared = _by_openai(part, tokenizer, setup, tally)
        else:
            prepared = None if examples[group[0]].is_conversational else _fast(part, tokenizer, setup, trusted, tally)
        if prepared is None:
            prepared = _by_trl(part, tokenizer, setup, tally)
        for i, row in zip(group, prepared, strict=True):
            results[i] = row
    return results  # type: ignore[return-value]


def _by_trl(examples: list[Example], tokenizer: Any, setup: TrainingSetup, tally: Preparation) -> list[Prepared]:
    """TRL's own preparation, else, where TRL refuses the rows, Gradian's port (its findings then say what TRL would
    have refused, and the report says why the port ran)."""
    try:
        return trl_rows(examples, tokenizer, setup, tally)
    except TrlCannotPrepare as error:
        tally.note(f"TRL {trl_version()}'s preparation refused them: {error}")
        tally.port_rows += len(examples)
        return [_port(example, tokenizer, setup) for example in examples]


def _by_openai(examples: list[Example], tokenizer: Any, setup: TrainingSetup, tally: Preparation) -> list[Prepared]:
    """Messages rows as OpenAI's fine-tuning trains them (`data.openai_format`): Gradian's reading, stated."""
    try:
        prepared, unstable = openai_format.openai_rows(examples, tokenizer, setup)
    except Exception as error:  # jinja errors, no template at all, a template that rejects a role
        raise InputError(f"the chat template cannot render these rows ({reason(error)}); give the tokenizer a chat "
                         "template.", examples[0].source or None, examples[0].line) from None
    tally.port_rows += len(examples)
    tally.note(openai_format.WHY)
    if unstable:
        tally.note(f"{unstable} rows render differently once later turns follow: their turns are bounded where the "
                   "renderings agree")
    return prepared


def _fast(examples: list[Example], tokenizer: Any, setup: TrainingSetup, trusted: dict[str, bool],
          tally: Preparation) -> list[Prepared] | None:
    """String rows by the Rust tokenizer in one batch, the prompt length read from the full row's character offsets
    (TRL tokenizes every row and prompt alone, in Python: ~6x slower at 10^5 rows). The first VERIFY_ROWS rows of each
    shape (of at most VERIFY_CHARS characters) are compared with TRL's own code, ids and labels; where they differ,
    TRL's code prepares the rows (its rows for the sample are kept). None where the fast path cannot run or is not
    trusted."""
    backend = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
    shape = examples[0].shape
    if backend is None or trusted.get(shape) is False:
        return None
    if setup.eos_token is not None and setup.eos_token != tokenizer.eos_token:
        return None  # TRL sets the run's EOS on its tokenizer: its code, not the fast path
    eos = eos_token_of(tokenizer, setup)
    prompts, fulls = zip(*(_plain_texts(example, eos) for example in examples), strict=True)
    encodings = backend.encode_batch(list(fulls))  # the Rust tokenizer itself: no per-row Python dicts
    if trl_masks_prompt_alone():  # TRL before 1.0: the prompt's tokens counted alone, a token spanning the join too
        alone = [len(e.ids) for e in backend.encode_batch([p or "" for p in prompts])]
        ends = [n if prompt is not None else 0 for n, prompt in zip(alone, prompts, strict=True)]
    else:  # TRL 1: the tokens before the first one reaching past the prompt's last character
        ends = [_prompt_end(e.offsets, len(prompt)) if prompt is not None else 0
                for e, prompt in zip(encodings, prompts, strict=True)]
    rows = []
    for example, prompt_len, encoding in zip(examples, ends, encodings, strict=True):
        rows.append((encoding.ids, _labels(example, encoding.ids, prompt_len, None, setup), prompt_len))
    if shape not in trusted:
        picked = [i for i, full in enumerate(fulls) if len(full) <= VERIFY_CHARS][:VERIFY_ROWS]
        try:
            reference = trl_rows([examples[i] for i in picked], tokenizer, setup) if picked else None
        except TrlCannotPrepare:
            reference = None
        trusted[shape] = reference == [(list(rows[i][0]), *rows[i][1:]) for i in picked]
        if not trusted[shape]:
            if reference is None:
                return None
            tally.trainer_rows += len(picked)  # TRL's own rows for the sample are kept, not prepared again
            kept = dict(zip(picked, reference, strict=True))
            rest = iter(_by_trl([e for i, e in enumerate(examples) if i not in kept], tokenizer, setup, tally)
                        if len(kept) < len(examples) else [])
            return [kept[i] if i in kept else next(rest) for i in range(len(examples))]
    tally.checked_rows += len(rows)
    return [(list(ids), labels, n) for ids, labels, n in rows]


def _prompt_end(spans: Sequence[tuple[int, int]], prompt_chars: int) -> int:
    """Tokens before the first one that reaches past the prompt's last character."""
    for index, (_, end) in enumerate(spans):
        if end > prompt_chars:
            return index
    return len(spans)


def _plain_texts(example: Example, eos: str) -> tuple[str | None, str]:
    if example.shape == "text":
        text = example.fields["text"]
        return None, text if text.endswith(eos) else text + eos
    completion = example.fields.get("completion", "")
    if not completion.endswith(eos):
        completion += eos
    return example.fields["prompt"], example.fields["prompt"] + completion


def _port(example: Example, tokenizer: Any, setup: TrainingSetup) -> Prepared:
    """Gradian's port of TRL's tokenization, for rows TRL's own code refused."""
    if example.is_conversational:
        ids, prompt_len, mask = _conversational_or_error(example, tokenizer, setup)
    else:
        prompt, full = _plain_texts(example, eos_token_of(tokenizer, setup))
        ids, mask = list(tokenizer(full)["input_ids"]), None
        prompt_len = common_prefix(tokenizer(prompt)["input_ids"], ids) if prompt is not None else 0
    return ids, _labels(example, ids, prompt_len, mask, setup), prompt_len


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
    return ids, common_prefix(prompt_ids["input_ids"], ids), _assistant_mask(out, setup)


def _assistant_mask(out: Any, setup: TrainingSetup) -> list[int] | None:
    return list(out["assistant_masks"]) if setup.assistant_only_loss and "assistant_masks" in out else None


def _labels(example: Example, ids: list[int], prompt_len: int, assistant_mask: list[int] | None,
            setup: TrainingSetup) -> list[int]:
    """TRL's labels: the completion mask (loss from where the prompt ends), then the assistant mask."""
    start = prompt_len if completion_only(example, setup) else 0
    labels = [IGNORE] * start + ids[start:]
    if assistant_mask is not None:
        labels = [label if mask else IGNORE for label, mask in zip(labels, assistant_mask, strict=True)]
    return labels


def _llamafactory_rows(examples: list[Example], tokenizer: Any, setup: TrainingSetup,
                       tally: Preparation) -> list[Rendered]:
    """The rows of a LLaMA-Factory run by its own converter, template and supervised processor (cutoff_len cuts
    prompt and answer in proportion, as its `infer_seqlen` does)."""
    own = trainer_code.for_run(LlamaFactoryCode, setup, tokenizer)
    cached = own.cached_rows
    out: list[Rendered | None] = [None] * len(examples)
    sources = list(dict.fromkeys(e.source for e in examples))
    for source in sources:
        group = [i for i, e in enumerate(examples) if e.source == source]
        gone = own.untrained(len(group), whole_run=len(sources) == 1)
        for position, (i, row) in enumerate(zip(group, own.rows([examples[i] for i in group]), strict=True)):
            if row is None:  # its processor drops the row: an even number of prompt turns, or not one response
                out[i] = Rendered(examples[i].id, [], [], 0, 0, dropped=True)
                continue
            ids, labels, full_length = row
            trained = next((k for k, label in enumerate(labels) if label != IGNORE), len(labels))
            over = "held_out" if position in gone else "truncated" if full_length > len(ids) else ""
            dropped = bool(position in gone or labels.count(IGNORE) == len(labels))
            out[i] = Rendered(examples[i].id, ids, labels, full_length, trained, over == "truncated", dropped, over)
    tally.trainer_rows += len(examples)
    tally.cached_rows += own.cached_rows - cached
    tally.llamafactory_version = own.version
    for note in own.notes:
        tally.note(note)
    return [row for row in out if row is not None]


def _limit(example: Example, ids: list[int], labels: list[int], prompt_len: int, tokenizer: Any,
           setup: TrainingSetup) -> Rendered:
    """A prepared row as the run's collator and max_length leave it."""
    if setup.collator_masks_pad:
        pad_id = pad_token_id_of(tokenizer, setup)
        labels = [IGNORE if token == pad_id else label for token, label in zip(ids, labels, strict=True)]
    full_length = len(ids)
    dropped = tail_cut = False
    over_long = setup.max_length is not None and full_length > setup.max_length
    if over_long and setup.packing and setup.packing_strategy != "bfd":
        over = "split"  # bfd_split trains the overflow as a row of its own; wrapped cuts blocks across rows
    elif over_long:  # TRL's truncation, or bfd packing's: it keeps the first max_length tokens
        assert setup.max_length is not None
        keep_start = setup.packing or setup.truncation_mode == "keep_start"
        cut = slice(None, setup.max_length) if keep_start else slice(-setup.max_length, None)
        ids, labels = ids[cut], labels[cut]
        tail_cut = keep_start  # the completion's end, EOS included, is gone
        if tail_cut and setup.eos_after_truncation:  # add_eos_token after the cut: the row ends mid-answer in EOS
            eos = tokenizer.convert_tokens_to_ids(eos_token_of(tokenizer, setup))
            ids, labels = ids[:-1] + [eos], labels[:-1] + [eos if labels[-1] != IGNORE else IGNORE]
        dropped = setup.drop_overlong
        over = "dropped" if dropped else "truncated"
    else:
        over = ""
    dropped = dropped or labels.count(IGNORE) == len(labels)
    return Rendered(example.id, ids, labels, full_length, prompt_len, tail_cut, dropped, over)


def _wrapped(rows: list[Rendered], block: int, position: int) -> int:
    """TRL's wrapped packing lays the rows end to end (dataset order: SFTConfig does not shuffle by default; rows with
    no trained token stay, TRL filters them only when not packing) and cuts every `block` tokens: a row a cut falls
    inside is `split`. Returns where the next chunk's rows start."""
    for row in rows:
        end = position + len(row.input_ids)
        if position // block != (end - 1) // block:
            row.over_limit = "split"
        position = end
    return position


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
        return _axolotl_answer(example, None, tokenizer, setup)[0]
    if setup.framework == "llamafactory":
        return trainer_code.for_run(LlamaFactoryCode, setup, tokenizer).prompt(example)
    prompt = example.prompt
    if isinstance(prompt, list):  # the turns as TRL trained them: the file's roles, its tools
        turns, _, extras = trl_chat(example, setup.dataset_text_field)
        out = tokenizer.apply_chat_template(turns, **{**template_kwargs(extras), "add_generation_prompt": True,
                                                      "tokenize": True, "return_dict": True,
                                                      "chat_template": setup.chat_template})
        return list(out["input_ids"])
    return list(tokenizer(prompt or "")["input_ids"])


def render_with_answer(example: Example, answer: str, tokenizer: Any, setup: TrainingSetup) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids) of `answer` rendered after `example`'s prompt exactly as training renders completions
    (no truncation: the answer is scored whole)."""
    if setup.framework == "axolotl":
        return _axolotl_answer(example, answer, tokenizer, setup)
    if setup.framework == "llamafactory":
        return trainer_code.for_run(LlamaFactoryCode, setup, tokenizer).with_answer(example, answer)
    prompt = example.prompt
    fields: dict[str, Any] = {"prompt": prompt, "completion": answer}
    raw = fields
    if isinstance(prompt, list):  # the turns as TRL trained them: the file's roles, its tools
        turns, role, extras = trl_chat(example, setup.dataset_text_field)
        fields = {"prompt": prompt, "completion": [{"role": "assistant", "content": answer}]}
        raw = {"prompt": turns, "completion": [{"role": role, "content": answer}], **extras}
    untruncated = TrainingSetup(**{**setup.to_dict(), "max_length": None, "completion_only_loss": True,
                                   "collator_masks_pad": False})
    rendered = render_example(Example(example.id, example.line, fields, raw=raw), tokenizer, untruncated)
    return rendered.input_ids[: rendered.prompt_length], rendered.input_ids[rendered.prompt_length:]


def _axolotl_answer(example: Example, answer: str | None, tokenizer: Any,
                    setup: TrainingSetup) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids) of an eval row of an axolotl run: by its entry's own prompt strategy where axolotl
    runs here and the row is in the entry's format, else by Gradian's port."""
    options = axolotl_options(setup)
    entry = entry_for(example, options, training=False)
    index = next((k for k, e in enumerate(options.get("datasets") or []) if e is entry), None)
    own = trainer_code.for_run(AxolotlCode, setup, tokenizer) if index is not None else None
    pair = own.answer(example, answer, index) if own is not None and index is not None else None
    return pair if pair is not None else axolotl_answer(example, answer, tokenizer, options)


def render_answer(prompt_ids: list[int], answer_ids: list[int]) -> tuple[list[int], list[int]]:
    """input_ids and labels for a prompt followed by an answer given as tokens (loss on the answer only)."""
    return prompt_ids + answer_ids, [IGNORE] * len(prompt_ids) + list(answer_ids)
