"""The scenario tokenizers, built with `tokenizers`: three kinds a real run can bring.

- `fused` (the world's default): words, single digits, punctuation and runs of spaces are tokens of their own, and
  the decoder joins tokens back without separators, so `decode(encode(text)) == text` for in-vocabulary text.
- `spaced`: the same words without spaces and without a decoder, as a word-level tokenizer often ships: decoding
  puts one space between tokens, so the model's JSON reads `{ " intent " : " refund " }`, keys with spaces.
- `bpe`: byte-level BPE trained on the domain's text, ChatML turns (`<|im_start|>user ... <|im_end|>`) and a
  distinct pad token, as instruct models ship; the suite's rows for it are `messages`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

SPECIALS = ["<pad>", "<unk>", "<s>", "</s>"]
PUNCTUATION = list('{}[]:,."\'`-_/?!()#$%&*+;<=>@\\^|~')
DIGITS = list("0123456789")
SPACES = [" ", "  ", "   ", "    ", "\n", "\n\n"]
SPLIT = Regex(r"\d|[A-Za-z]+|\n+| +|[^\sA-Za-z\d]")
# spaced: numbers up to 100 are one token each, so a JSON number still parses once decode() spaces the tokens
SPACED_SPLIT = Regex(r"100|[1-9]\d|\d|[A-Za-z]+|[^\sA-Za-z\d]")
NUMBERS = [str(n) for n in range(10, 101)]

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


CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] }}<|im_end|>{% endgeneration %}\n"
    "{% else %}"
    "{{ message['content'] }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHATML_SPECIALS = ["<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BPE_VOCAB = 600
KINDS = ("fused", "spaced", "bpe")


def build_tokenizer(words: Iterable[str], kind: str = "fused", corpus: Sequence[str] = ()) -> PreTrainedTokenizerFast:
    """A fast tokenizer of `kind` (see the module docstring) over `words`, or trained on `corpus` for `bpe`."""
    if kind == "bpe":
        return _bpe(corpus)
    vocab: dict[str, int] = {}
    spaces = SPACES if kind == "fused" else NUMBERS
    for token in [*SPECIALS, *spaces, *PUNCTUATION, *DIGITS, "user", "assistant", "system", *sorted(set(words))]:
        vocab.setdefault(token, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    if kind == "fused":
        core.pre_tokenizer = pre_tokenizers.Split(SPLIT, behavior="isolated")
        core.decoder = decoders.Fuse()
    else:  # spaced: no decoder, so decode() joins tokens with one space
        core.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(SPACED_SPLIT, behavior="isolated")])
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


def _bpe(corpus: Sequence[str]) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on `corpus` (deterministic for the same texts), ChatML template, no BOS."""
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, special_tokens=CHATML_SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(list(corpus), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|pad|>",
                                        bos_token="<|endoftext|>", model_max_length=4096)
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer
