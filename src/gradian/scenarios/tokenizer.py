"""A word-level tokenizer for the scenario world, built with `tokenizers`.

Words, single digits, punctuation and runs of spaces are tokens of their own, and the decoder
joins tokens back without separators, so `decode(encode(text)) == text` for in-vocabulary text:
JSON written by the model parses exactly as the reference does.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

SPECIALS = ["<pad>", "<unk>", "<s>", "</s>"]
PUNCTUATION = list('{}[]:,."\'`-_/?!()#$%&*+;<=>@\\^|~')
DIGITS = list("0123456789")
SPACES = [" ", "  ", "   ", "    ", "\n", "\n\n"]
SPLIT = Regex(r"\d|[A-Za-z]+|\n+| +|[^\sA-Za-z\d]")

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "assistant: {% generation %}{{ message['content'] }}{{ eos_token }}{% endgeneration %}\n"
    "{% else %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def build_tokenizer(words: Iterable[str]) -> PreTrainedTokenizerFast:
    """A fast tokenizer over `words` (plus digits, punctuation, spaces), BOS added, with a chat template."""
    vocab: dict[str, int] = {}
    for token in [*SPECIALS, *SPACES, *PUNCTUATION, *DIGITS, "user", "assistant", "system", *sorted(set(words))]:
        vocab.setdefault(token, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(SPLIT, behavior="isolated")
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", vocab["<s>"])]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        model_max_length=4096,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
