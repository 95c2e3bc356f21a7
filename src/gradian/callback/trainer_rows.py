"""The trainer's own rows as the audit reads them: its tokenized dataset put through its own collator.

Each row's `input_ids` are the dataset's; its `labels` are what the collator returned for it inside a real batch
(so a collator that hides pad ids hides them here too). Where the trainer kept the rows' text (TRL keeps `prompt`,
`completion` and `text` beside the tokens), Gradian's renderer reads it untruncated: that gives the prompt's end and
the row's length before the max length cut it. Without text, rows are rebuilt from their tokens: the prompt is
everything before the first supervised token.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gradian.data.examples import Example
from gradian.data.render import IGNORE, Rendered, render_dataset
from gradian.data.setup import TrainingSetup

MASK_COLUMNS = ("completion_mask", "assistant_masks")  # older TRL: the collator folds these into the labels


@dataclass
class TrainerRows:
    """`examples[i]` and `rendered[i]` are dataset row i; `masks_pad` is what the batches showed of pad masking."""

    examples: list[Example]
    rendered: list[Rendered]
    masks_pad: bool | None  # the collator set the label of an in-row pad id to -100; None: no pad id inside a row
    text_rows: int  # rows whose prompt end and untruncated length came from the trainer's own text
    untruncated: list[int | None]  # each row's length rendered from its own text without a cut; None: no text


def token_columns(dataset: Any) -> list[dict[str, Any]]:
    """Every row as the dataloader hands it to the collator (HF `Dataset` read by column, else row by row)."""
    names = getattr(dataset, "column_names", None)
    if names is not None and hasattr(dataset, "to_dict"):
        columns = {name: dataset[name] for name in names}
        return [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]
    return [dict(dataset[i]) for i in range(len(dataset))]


def collated_labels(collator: Any, features: list[dict[str, Any]], batch_rows: int) -> list[list[int]]:
    """The labels the collator gives each row inside real batches of `batch_rows`, aligned with its input_ids."""
    out: list[list[int]] = []
    for start in range(0, len(features), batch_rows):
        chunk = features[start : start + batch_rows]
        batch = collator([dict(feature) for feature in chunk])  # a collator may pop keys from what it is given
        out.extend(_per_row(batch, [list(_ids(f)) for f in chunk]))
    return out


def _ids(feature: dict[str, Any]) -> list[int]:
    ids = feature["input_ids"]
    return ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)


def _per_row(batch: Any, rows: list[list[int]]) -> Iterator[list[int]]:
    """Cut a collated batch back into rows: right or left padded, or flattened into one padding-free sequence."""
    ids, labels = batch["input_ids"], batch.get("labels")
    if labels is None:  # a collator that builds no labels: the model computes none, so nothing is supervised
        labels = torch.full_like(ids, IGNORE)
    if ids.shape[0] == 1 and len(rows) > 1:  # padding-free: rows one after another
        start = 0
        for row in rows:
            yield labels[0, start : start + len(row)].tolist()
            start += len(row)
        return
    for index, row in enumerate(rows):
        width = len(row)
        left = ids[index, -width:].tolist() == row and ids[index, :width].tolist() != row
        yield labels[index, -width:].tolist() if left else labels[index, :width].tolist()


def trainer_rows(features: list[dict[str, Any]], collated: list[list[int]], tokenizer: Any, setup: TrainingSetup,
                 *, texts: Sequence[dict[str, Any]] | None = None, ids: Sequence[str] | None = None,
                 pad_id: int | None = None) -> TrainerRows:
    """Examples and rendered rows of the trainer's dataset; `texts[i]` holds row i's text columns when kept."""
    names = list(ids) if ids is not None and len(set(map(str, ids))) == len(features) else None
    examples, rendered, text_rows = [], [], 0
    from_text = _render_texts(texts, tokenizer, setup) if texts is not None else [None] * len(features)
    for index, (feature, labels, text) in enumerate(zip(features, collated, from_text, strict=True)):
        name = str(names[index]) if names else str(index)
        tokens = _ids(feature)
        example, row = _from_text(name, index, tokens, labels, text, setup)
        if example is None:
            example, row = _from_tokens(name, index, tokens, labels, tokenizer, setup)
        else:
            text_rows += 1
        examples.append(example)
        rendered.append(row)
    untruncated = [text[1].full_length if text is not None else None for text in from_text]
    return TrainerRows(examples, rendered, _masks_pad(features, collated, pad_id), text_rows, untruncated)


def _render_texts(texts: Sequence[dict[str, Any]], tokenizer: Any, setup: TrainingSetup
                  ) -> list[tuple[Example, Rendered] | None]:
    """Each row's own text rendered untruncated by Gradian's renderer (string rows only; chats come from tokens)."""
    whole = TrainingSetup(**{**setup.to_dict(), "max_length": None, "collator_masks_pad": False})
    fields = [_text_fields(row, setup.dataset_text_field) for row in texts]
    examples = [Example(str(i), i + 1, f) for i, f in enumerate(fields) if f is not None]
    rendered = iter(render_dataset(examples, tokenizer, whole))  # one batched call: the fast path of big datasets
    out: list[tuple[Example, Rendered] | None] = [None] * len(texts)
    for example in examples:
        out[example.line - 1] = (example, next(rendered))
    return out


def _text_fields(row: dict[str, Any], text_field: str) -> dict[str, Any] | None:
    if isinstance(row.get("prompt"), str) and isinstance(row.get("completion"), str):
        return {"prompt": row["prompt"], "completion": row["completion"]}
    if isinstance(row.get(text_field), str):
        return {"text": row[text_field]}
    return None


def _from_text(name: str, index: int, tokens: list[int], labels: list[int],
               text: tuple[Example, Rendered] | None, setup: TrainingSetup) -> tuple[Example | None, Rendered]:
    """The row from its text, when the text renders to the tokens the trainer holds (cut at max_length)."""
    if text is None:
        return None, Rendered(name, tokens, labels, len(tokens), 0)
    example, whole = text
    kept = whole.input_ids[: len(tokens)] if setup.truncation_mode != "keep_end" else whole.input_ids[-len(tokens):]
    if kept != tokens:
        return None, Rendered(name, tokens, labels, len(tokens), 0)
    over = whole.full_length > len(tokens)
    row = Rendered(name, tokens, labels, whole.full_length, whole.prompt_length, over and setup.truncation_mode !=
                   "keep_end", labels.count(IGNORE) == len(labels), "truncated" if over else "")
    return Example(name, index + 1, example.fields), row


def _from_tokens(name: str, index: int, tokens: list[int], labels: list[int], tokenizer: Any,
                 setup: TrainingSetup) -> tuple[Example, Rendered]:
    """The row rebuilt from its tokens: the prompt is what comes before the first supervised token.

    A row exactly `max_length` long that does not end in the EOS TRL appends was cut by the trainer; how long it
    was before is not in the tokens (`full_length` then says one more than kept, a lower bound).
    """
    first = next((i for i, label in enumerate(labels) if label != IGNORE), len(labels))
    decode = tokenizer.decode
    if first:
        fields = {"prompt": decode(tokens[:first]), "completion": decode(tokens[first:])}
    else:
        fields = {"text": decode(tokens)}
    cut = setup.max_length is not None and not setup.packing and len(tokens) == setup.max_length \
        and tokens[-1] != tokenizer.eos_token_id
    row = Rendered(name, tokens, labels, len(tokens) + int(cut), first, cut and setup.truncation_mode != "keep_end",
                   labels.count(IGNORE) == len(labels), "truncated" if cut else "")
    return Example(name, index + 1, fields), row


def _masks_pad(features: list[dict[str, Any]], collated: list[list[int]], pad_id: int | None) -> bool | None:
    """Whether the collator hid the label of every pad id inside a row that the dataset itself supervised."""
    if pad_id is None:
        return None
    seen = hidden = 0
    for feature, labels in zip(features, collated, strict=True):
        tokens = _ids(feature)
        wanted = feature.get("labels")
        wanted = list(wanted) if wanted is not None else tokens
        for token, before, after in zip(tokens, wanted, labels, strict=False):
            if token == pad_id and before != IGNORE:
                seen += 1
                hidden += after == IGNORE
    return None if not seen else hidden == seen
