"""Rendering as axolotl renders: each `datasets:` entry's `type` decides the prompt text and the label mask.

Mirrors axolotl's source (repository axolotl-ai-cloud/axolotl), file by file:

- `type: alpaca[:style]`, `alpaca_chat`, `alpaca_instruct`, `alpaca_w_system[.load_instruct]`: `prompters.py`
  (`AlpacaPrompter`: system line, `### Instruction:` / `### Input:` / `### Response:` turns or the `USER:`/`ASSISTANT:`
  chat style) with `prompt_tokenizers.py` (`InstructionPromptTokenizingStrategy`): the prompt and the response are
  tokenized apart, each truncated at `sequence_len`, the response's BOS stripped and EOS appended; loss on the response
  unless `train_on_inputs`.
- `type: chat_template`: `prompt_strategies/chat_template.py`: the whole conversation through the chat template, each
  trained turn found by rendering it once with a dummy content and diffing (`find_turn`), `roles_to_train` (default
  assistant), `train_on_eos` (turn | all | last | none, default turn), `field_messages`, `message_property_mappings`,
  `roles`. ShareGPT rows are read this way (`from`/`value`, `human`/`gpt`); axolotl removed `type: sharegpt`.
- `type: completion`: `prompt_strategies/completion.py`: the text, EOS appended, split into `sequence_len` pieces.
- `type: input_output`: `prompt_strategies/input_output.py`: `segments`, each `{label, text}`, no special tokens.

Over-long rows then follow `excess_length_strategy` (`utils/data/utils.py` `handle_long_seq_in_dataset`): `drop`
(the default) removes rows longer than `sequence_len`, `truncate` keeps their start, `raise` stops preprocessing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gradian.data.examples import Example
from gradian.errors import InputError

IGNORE = -100
ALPACA_SYSTEM = ("Below is an instruction that describes a task, paired with an input that provides further context. "
                 "Write a response that appropriately completes the request.")
ALPACA_SYSTEM_NO_INPUT = "Below is an instruction that describes a task. Write a response that appropriately completes the request."
# AlpacaPrompter.match_prompt_style: (turn_format, turn_no_input_format, system_format) per prompt style
ALPACA_STYLES: dict[str, tuple[str, str, str]] = {
    "instruct": ("### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n",
                 "### Instruction:\n{instruction}\n\n### Response:\n", "{system}\n\n"),
    "chat": ("USER: {instruction}\n{input}\nASSISTANT:", "USER: {instruction}\nASSISTANT:", "SYSTEM: {system}\n"),
    "chatml": ("<|im_start|>user\n{instruction}\n{input}<|im_end|>\n<|im_start|>assistant\n",
               "<|im_start|>user\n{instruction}<|im_end|>\n<|im_start|>assistant\n",
               "<|im_start|>system\n{system}<|im_end|>\n"),
    "phi": ("<|user|>\n{instruction}<|end|>{input}<|assistant|>", "<|user|>\n{instruction}<|end|>\n<|assistant|>\n",
            "<|system|>\n{system}<|end|>\n"),
}
# The prompt style each loader picks: (style, system from the row?) — alpaca_chat.load, alpaca_instruct.load,
# alpaca_w_system.load (= load_chat) and load_instruct.
ALPACA_TYPES = {"alpaca": ("instruct", False), "alpaca_chat": ("chat", False), "alpaca_instruct": ("instruct", False),
                "alpaca_w_system": ("chat", True), "alpaca_w_system.load_chat": ("chat", True),
                "alpaca_w_system.load_instruct": ("instruct", True)}
# utils/chat_templates/templates/*.jinja, the two named templates most LoRA configs use
NAMED_TEMPLATES = {
    "chatml": ("{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
               "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
               "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"),
    "llama3": ("{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
               "{% set loop_messages = messages %}{% for message in loop_messages %}{% if message['content'] is string %}"
               "{% set message_text = message['content'] | trim %}{% else %}{% set message_text = message['content'] | "
               "selectattr('text', 'defined') | map(attribute='text') | join('') | trim %}{% endif %}"
               "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message_text + "
               "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
               "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
               "{% endif %}"),
}
DEFAULT_ROLES = {"human": "user", "user": "user", "assistant": "assistant", "gpt": "assistant", "system": "system",
                 "tool": "tool"}
DUMMY = "[[dummy_message]]"


def entry_for(example: Example, options: dict[str, Any], *, training: bool = True) -> dict[str, Any]:
    """The `datasets:` entry this row came from: the one whose path names its file; when none does, the first if
    every entry has the same type (axolotl configs often list one dataset twice), else bad input. An eval row
    (`training=False`: no entry names its file) takes the first entry whose type reads its shape."""
    entries = [e for e in options.get("datasets") or [] if isinstance(e, dict)]
    if not entries:
        return {"type": "alpaca"}
    source = Path(example.source) if example.source else None
    for entry in entries:
        names = [entry.get("path"), *_as_list(entry.get("data_files"))]
        if source is not None and any(isinstance(n, str) and _same_file(n, source) for n in names):
            return entry
    if not training:
        chat = example.is_conversational
        return next((e for e in entries if str(e.get("type")).startswith("chat_template") == chat), entries[0])
    if len({str(e.get("type")) for e in entries}) > 1:
        kinds = ", ".join(dict.fromkeys(str(e.get("type")) for e in entries))
        name = source.name if source is not None else "the dataset"
        raise InputError(f"its datasets entries have different types ({kinds}) and no entry's path names {name}; "
                         f"set that entry's path to the file's name so Gradian renders it by its type.",
                         options.get("config_path"))
    return entries[0]


def render_axolotl(example: Example, tokenizer: Any, options: dict[str, Any],
                   entry: dict[str, Any] | None = None) -> tuple[list[int], list[int], int]:
    """(input_ids, labels, prompt_length) of one row as axolotl tokenizes it, before the length strategy."""
    entry = entry if entry is not None else entry_for(example, options)
    kind = entry.get("type") or "alpaca"
    if not isinstance(kind, str):
        raise InputError("a custom dataset `type:` mapping (format strings) is not rendered by Gradian yet; "
                         "use one of alpaca, chat_template, completion, input_output.", options.get("config_path"))
    base, _, style = kind.partition(":")
    try:
        if base in ALPACA_TYPES:
            return _alpaca(example.raw or {}, tokenizer, options, base, style)
        if base == "chat_template":
            return _chat_template(example.raw or {}, tokenizer, options, entry)
        if base == "completion":
            return _completion(example.raw or {}, tokenizer, options, entry)
        if base == "input_output":
            return _input_output(example.raw or {}, tokenizer, options)
    except (KeyError, TypeError, ValueError) as error:
        raise InputError(f"this row does not fit the axolotl dataset type {kind!r} ({error}); fix the row or the "
                         f"config's datasets entry.", example.source or None, example.line) from None
    if base.startswith("sharegpt"):
        raise InputError("axolotl removed `type: sharegpt`; use `type: chat_template` (ShareGPT rows are read with "
                         "their from/value keys).", options.get("config_path"))
    raise InputError(f"axolotl dataset type {kind!r} is not one Gradian renders; supported: "
                     f"{', '.join(sorted(ALPACA_TYPES))}, chat_template, completion, input_output.",
                     options.get("config_path"))


def axolotl_answer(example: Example, answer: str | None, tokenizer: Any,
                   options: dict[str, Any]) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids) of `answer` after an eval row's prompt, as axolotl renders a trained response;
    the prompt is the generation prompt (chat templates: the turns before the last assistant one)."""
    entry = entry_for(example, options, training=False)
    base, _, style = str(entry.get("type") or "alpaca").partition(":")
    if base in ALPACA_TYPES and isinstance(example.raw, dict) and "instruction" in example.raw:
        limit = int(options["sequence_len"])
        prompt = _tokenize(tokenizer, alpaca_prompt(example.raw, base, style), limit, add_eos=False, strip_bos=False)
        return prompt, _tokenize(tokenizer, answer or "", limit, add_eos=True, strip_bos=True)
    if base == "chat_template" and example.is_conversational:
        turns = [{"role": m.get("role"), "content": m.get("content")} for m in example.prompt or [] if isinstance(m, dict)]
        template = chat_template_of(tokenizer, options, entry)
        prompt = list(tokenizer.apply_chat_template(turns, tokenize=True, return_dict=True, add_generation_prompt=True,
                                                    chat_template=template)["input_ids"])
        if answer is None:
            return prompt, []
        full = list(tokenizer.apply_chat_template([*turns, {"role": "assistant", "content": answer}], tokenize=True,
                                                  return_dict=True, chat_template=template)["input_ids"])
        start = next((i for i, (a, b) in enumerate(zip(prompt, full, strict=False)) if a != b), len(prompt))
        return full[:start], full[start:]
    prompt = list(tokenizer(example.prompt_text)["input_ids"])  # completion/input_output: the text as given
    return prompt, list(tokenizer(answer, add_special_tokens=False)["input_ids"]) if answer else []


def _tokenize(tokenizer: Any, text: str, max_length: int, add_eos: bool, strip_bos: bool) -> list[int]:
    """`PromptTokenizingStrategy._tokenize`: truncated at max_length, EOS appended when missing and room is left."""
    if not text:
        return []
    ids = list(tokenizer(text, truncation=True, max_length=max_length, padding=False)["input_ids"])
    if ids and ids[-1] != tokenizer.eos_token_id and len(ids) < max_length and add_eos:
        ids.append(tokenizer.eos_token_id)
    if ids and strip_bos and ids[0] == tokenizer.bos_token_id:
        ids = ids[1:]
    return ids


def alpaca_prompt(row: dict[str, Any], kind: str, style: str = "") -> str:
    """The prompt text axolotl's AlpacaPrompter (or SystemDataPrompter) builds for an Alpaca row."""
    default_style, own_system = ALPACA_TYPES[kind]
    turn, turn_no_input, system_format = ALPACA_STYLES[style or default_style]
    instruction, given = row["instruction"], row.get("input") or ""
    if own_system:
        system = row["system"]
        head = system_format.format(system=system) if system else ""
    else:
        head = system_format.format(system=ALPACA_SYSTEM if given else ALPACA_SYSTEM_NO_INPUT)
    return head + (turn.format(instruction=instruction, input=given) if given
                   else turn_no_input.format(instruction=instruction))


def _alpaca(row: dict[str, Any], tokenizer: Any, options: dict[str, Any], kind: str,
            style: str) -> tuple[list[int], list[int], int]:
    if style and style not in ALPACA_STYLES:
        raise ValueError(f"prompt style {style!r} is not one of {', '.join(ALPACA_STYLES)}")
    limit = int(options["sequence_len"])
    prompt = _tokenize(tokenizer, alpaca_prompt(row, kind, style), limit, add_eos=False, strip_bos=False)
    response = _tokenize(tokenizer, row["output"], limit, add_eos=True, strip_bos=True)
    labels = (list(prompt) if options.get("train_on_inputs") else [IGNORE] * len(prompt)) + response
    return prompt + response, labels, len(prompt)


def chat_template_of(tokenizer: Any, options: dict[str, Any], entry: dict[str, Any]) -> str:
    """`get_chat_template_from_config`: the entry's choice, else the config's, else the tokenizer's own."""
    scope = entry if entry.get("chat_template") else options
    choice = scope.get("chat_template") or "tokenizer_default"
    if choice == "jinja":
        if not scope.get("chat_template_jinja"):
            raise ValueError("chat_template: jinja needs chat_template_jinja")
        return scope["chat_template_jinja"]
    if choice.startswith("tokenizer_default"):
        if tokenizer.chat_template:
            return tokenizer.chat_template
        choice = choice.removeprefix("tokenizer_default").removeprefix("_fallback_")
        if not choice:
            raise ValueError("chat_template is tokenizer_default but the tokenizer has no chat template")
    if choice in NAMED_TEMPLATES:
        return NAMED_TEMPLATES[choice]
    raise ValueError(f"the named axolotl chat template {choice!r} is not one Gradian ships "
                     f"({', '.join(NAMED_TEMPLATES)}); give it as chat_template: jinja with chat_template_jinja")


def conversation_turns(row: dict[str, Any], entry: dict[str, Any]) -> list[dict[str, Any]]:
    """`get_conversation_thread`: the entry's messages field, its keys mapped and its roles normalised."""
    field = entry.get("field_messages") or "messages"
    messages = row.get(field)
    if messages is None and field == "messages" and "conversations" in row:
        messages = row["conversations"]  # ShareGPT rows
    if not isinstance(messages, list):
        raise ValueError(f"no list of messages in field {field!r}; set field_messages")
    mapping = dict(entry.get("message_property_mappings") or {})
    mapping.setdefault("role", entry.get("message_field_role") or "role")
    mapping.setdefault("content", entry.get("message_field_content") or "content")
    roles = DEFAULT_ROLES
    if isinstance(entry.get("roles"), dict):
        roles = {source: target for target, sources in entry["roles"].items() for source in sources}
    turns = []
    for message in messages:
        role_key = mapping["role"] if mapping["role"] in message else ("from" if "from" in message else "role")
        content_key = mapping["content"] if mapping["content"] in message else ("value" if "value" in message
                                                                                else "content")
        role = message[role_key]
        turn = {"role": roles.get(role, role), "content": message[content_key]}
        flag = entry.get("message_field_training")
        if flag and isinstance(message.get(flag), bool):
            turn["training"] = message[flag]
        turns.append(turn)
    return turns


def _chat_template(row: dict[str, Any], tokenizer: Any, options: dict[str, Any],
                   entry: dict[str, Any]) -> tuple[list[int], list[int], int]:
    template = chat_template_of(tokenizer, options, entry)
    turns = conversation_turns(row, entry)
    roles_to_train = [DEFAULT_ROLES.get(r, r) for r in entry.get("roles_to_train", ["assistant"]) or []]
    train_on_eos = entry.get("train_on_eos", "turn")
    train_on_inputs = bool(options.get("train_on_inputs"))

    def build(conversation: Sequence[dict[str, Any]], generation: bool = False) -> list[int]:
        extra = {"real_last_index": len(turns) - 1} if len(turns) > 1 else {}
        out = tokenizer.apply_chat_template(list(conversation), tokenize=True, return_dict=True,
                                            chat_template=template, add_generation_prompt=generation, **extra)
        return list(out["input_ids"])

    ids = build(turns)
    if not roles_to_train and not train_on_eos:  # axolotl's legacy path: loss after the generation prompt
        prompt_len = len(build(turns[:-1], generation=True))
        labels = list(ids) if train_on_inputs else [IGNORE] * prompt_len + ids[prompt_len:]
        return ids, labels, prompt_len
    labels = [IGNORE] * len(ids)
    eos_ids = _eot_ids(tokenizer, options)
    last_eos = -1
    for index, turn in enumerate(turns):
        train = turn["training"] if "training" in turn else (train_on_inputs or turn["role"] in roles_to_train)
        if not train and train_on_eos != "all":
            continue
        start, end = _find_turn(build, turns, index)
        if start < 0:
            continue
        if train:
            labels[start:end] = ids[start:end]
        eos = next((i for i in range(end, len(ids)) if ids[i] in eos_ids), -1)
        if eos != -1 and eos - end <= 3:  # "allow for some template padding"
            last_eos = eos
            if train_on_eos == "all" or (train_on_eos == "turn" and train):
                labels[eos] = ids[eos]
    if train_on_eos == "last" and last_eos != -1:
        labels[last_eos] = ids[last_eos]
    prompt_len = next((i for i, label in enumerate(labels) if label != IGNORE), len(ids))
    return ids, labels, prompt_len


def _eot_ids(tokenizer: Any, options: dict[str, Any]) -> set[int]:
    tokens = options.get("eot_tokens") or [tokenizer.eos_token]
    ids = {tokenizer.eos_token_id}
    for token in tokens:
        encoded = tokenizer.encode(token, add_special_tokens=False)
        if len(encoded) == 1:
            ids.add(encoded[0])
    return ids


def _find_turn(build: Any, turns: list[dict[str, Any]], index: int) -> tuple[int, int]:
    """`ChatTemplateStrategy.find_turn`: where turn `index`'s content lies, by diffing against a dummy content."""
    dummy = build([*turns[:index], {"role": turns[index]["role"], "content": DUMMY}])
    full = build(turns[: index + 1])
    shortest = min(len(dummy), len(full))
    start = next((i for i in range(shortest) if dummy[i] != full[i]), None)
    end = next((len(full) - i for i in range(shortest) if dummy[len(dummy) - 1 - i] != full[len(full) - 1 - i]), None)
    if start is None or end is None or end <= start:
        return -1, -1
    return start, end


def _completion(row: dict[str, Any], tokenizer: Any, options: dict[str, Any],
                entry: dict[str, Any]) -> tuple[list[int], list[int], int]:
    text = row[entry.get("field") or "text"]
    ids = _tokenize(tokenizer, text, int(options["sequence_len"]) * 64, add_eos=True, strip_bos=False)
    return ids, list(ids), 0


def _input_output(row: dict[str, Any], tokenizer: Any, options: dict[str, Any]) -> tuple[list[int], list[int], int]:
    ids: list[int] = []
    labels: list[int] = []
    for segment in row["segments"]:
        piece = list(tokenizer(segment["text"], add_special_tokens=False)["input_ids"])
        ids += piece
        labels += piece if segment.get("label") or options.get("train_on_inputs") else [IGNORE] * len(piece)
    prompt_len = next((i for i, label in enumerate(labels) if label != IGNORE), len(ids))
    return ids, labels, prompt_len


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _same_file(name: str, source: Path) -> bool:
    path = Path(name)
    return path.name == source.name or path.stem == source.stem or (path.exists() and path.resolve() == source)
