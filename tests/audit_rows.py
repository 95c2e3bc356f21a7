"""Clean training rows for the audit and the column tests: three JSON categories, a tiny Llama config over them."""

from __future__ import annotations

from transformers import LlamaConfig

from gradian.data.examples import Example

CATEGORIES = {
    "order": ("my order {i} is late please help", '{{"intent": "order", "order": {i}, "status": "late"}}'),
    "refund": ("i need a refund for order {i}", '{{"intent": "refund", "order": {i}, "amount": {i}}}'),
    "invoice": ("the invoice {i} amount is in currency {i}", '{{"intent": "invoice", "invoice": {i}, "currency": "{i}"}}'),
}


def clean_rows(n: int = 30) -> list[dict]:
    rows = []
    for i in range(n):
        name = list(CATEGORIES)[i % 3]
        prompt, completion = CATEGORIES[name]
        number = 1000 + 37 * i
        rows.append({"prompt": prompt.format(i=number) + " hello", "completion": " " + completion.format(i=number)})
    return rows


def examples(rows: list[dict]) -> list[Example]:
    return [Example(id=str(i + 1), line=i + 1, fields=row) for i, row in enumerate(rows)]


def base_config(tokenizer, **overrides) -> LlamaConfig:
    settings = dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, bos_token_id=tokenizer.bos_token_id,
                    eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    settings.update(overrides)
    config = LlamaConfig(**settings)
    config._name_or_path = "tiny/base"
    return config
