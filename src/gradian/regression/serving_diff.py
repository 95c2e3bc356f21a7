"""Where the served path differs from the training path: each rule returns a `Difference` with its evidence.

The training path is Gradian's own (the adapter on the base, prompts rendered as trained, greedy decoding ending on
the trained EOS); the served path is the exported folder as the server reads it (`--served-model`: its
generation_config.json, tokenizer and chat template) and the answers it returned (`--served-outputs`). The rules:

- `stop_token`: served answers go on past where the fine-tune's own answer ended with EOS (the served text starts with
  it), and the served stop tokens (generation_config.json `eos_token_id`) leave the trained EOS out;
- `chat_template`: the served template renders an eval prompt to other tokens than training did (the first
  differing token is the evidence; both are rendered with transformers' `apply_chat_template`, whose sandboxed jinja2
  is the one servers that read the tokenizer's template run);
- `double_bos`: the served prompt starts with BOS twice (the template writes it and the tokenizer adds it again when
  the rendered text is tokenized with special tokens);
- `system_prompt`: a system prompt the training rendering holds is missing from the served one;
- `max_new_tokens`: generation_config.json's `max_new_tokens` is shorter than the longest reference answer, so
  served answers are cut;
- `merged_weights`: the export holds merged weights (`*.safetensors`; pickled weights are never read): loaded in the
  dtype its config.json names, they answer the eval prompts as training rendered them, with the trained stop token
  and the fine-tune's answer lengths, so only the weights differ from Gradian's path; answers the fine-tune got
  right that now fail (merge precision, a merge into a quantized or another base) are the evidence.

The sentences (and each rule's one-line fix) are in `gradian.verdict.wording`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gradian.capabilities import Capability, passed
from gradian.data.examples import Example
from gradian.data.render import eos_token_of
from gradian.data.setup import TrainingSetup
from gradian.errors import InputError, reason
from gradian.files import read_json_object
from gradian.regression.generation import generate
from gradian.regression.measure import RegressionResult, RegressionRow
from gradian.regression.served import ServedRegression

RULES = ("stop_token", "chat_template", "double_bos", "system_prompt", "max_new_tokens", "merged_weights")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
CONTEXT_TOKENS = 4  # tokens shown before the first differing one


@dataclass
class Difference:
    """One way the served path differs from the training path (`rule`, one of `RULES`), with its numbers."""

    rule: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ValueError(f"rule must be one of {RULES}, not {self.rule!r}")


@dataclass
class ServedExport:
    """What the served folder says about serving: stop tokens, token limit, tokenizer and chat template."""

    folder: str
    eos_token_ids: list[int] | None = None
    max_new_tokens: int | None = None
    tokenizer: Any = None
    chat_template: str | None = None
    weights: bool = False  # the folder holds merged weights in safetensors
    dtype: str | None = None  # config.json's dtype (torch_dtype): what a server loads the weights in


def read_export(folder: str | Path) -> ServedExport:
    """The served folder's generation_config.json (else config.json) stop tokens and token limit, its tokenizer and
    chat template (chat_template.jinja, else tokenizer_config.json's), whether it holds safetensors weights and their
    dtype; the weights themselves are read only by `merged_weights`."""
    path = Path(folder)
    if not path.is_dir():
        raise InputError("no such folder; pass the exported model folder as served (config.json, "
                         "generation_config.json, tokenizer files).", path)
    generation = _json_file(path / "generation_config.json")
    config = _json_file(path / "config.json")
    source = "generation_config.json" if "eos_token_id" in generation else "config.json"
    eos = generation.get("eos_token_id", config.get("eos_token_id"))
    eos_ids = None if eos is None else _token_ids(eos, path / source)
    limit = generation.get("max_new_tokens")
    if limit is not None and not (_whole(limit) and limit > 0):
        raise InputError(f"max_new_tokens is {limit!r}, not a positive whole number; export the served model folder "
                         "again.", path / "generation_config.json")
    tokenizer = _tokenizer(path) if any((path / name).is_file() for name in TOKENIZER_FILES) else None
    dtype = config.get("dtype", config.get("torch_dtype"))
    return ServedExport(str(path), eos_ids, limit, tokenizer, _chat_template(path, tokenizer),
                        any(path.glob("*.safetensors")), dtype if isinstance(dtype, str) else None)


def _token_ids(value: Any, path: Path) -> list[int]:
    """`eos_token_id` as generation_config.json holds it: one token id or a list of them."""
    ids = value if isinstance(value, list) else [value]
    if not all(_whole(i) and i >= 0 for i in ids):
        raise InputError(f"eos_token_id is {value!r}, not a token id or a list of them; export the served model "
                         "folder again.", path)
    return ids


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _json_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    return read_json_object(path, "export the served model folder again")


def _tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as error:  # noqa: BLE001 - any loading failure is the user's folder: one sentence
        raise InputError(f"cannot load the served tokenizer ({reason(error)}).", path) from None


def _chat_template(path: Path, tokenizer: Any) -> str | None:
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        try:
            return jinja.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise InputError("is not UTF-8 text; export the served model folder again.", jinja) from None
    template = _json_file(path / "tokenizer_config.json").get("chat_template")
    if isinstance(template, list):  # named templates: the default one is what a chat endpoint uses
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"),
                        None)
    return template if isinstance(template, str) else getattr(tokenizer, "chat_template", None)


def differences(measured: RegressionResult, served: ServedRegression, export: ServedExport | None,
                examples: Sequence[Example], tokenizer: Any, setup: TrainingSetup,
                capability: Capability | None = None, device: str = "cpu") -> list[Difference]:
    """Every rule that holds, in `RULES` order; the prompt rules and the token limit need the served folder, the
    merged weights its safetensors and the capability that scores their answers."""
    found = [stop_token(measured, served, export, trained_eos_id(tokenizer, setup))]
    if export is not None:
        found += prompt_differences(measured.rows, examples, tokenizer, export)
        found.append(token_limit(measured.rows, export, tokenizer))
        if export.weights and capability is not None:
            found.append(merged_weights(measured.rows, export, tokenizer, setup, capability, device))
    return [d for d in found if d is not None]


def merged_weights(rows: Sequence[RegressionRow], export: ServedExport, tokenizer: Any, setup: TrainingSetup,
                   capability: Capability, device: str = "cpu") -> Difference | None:
    """The export's weights in their served dtype, answering the prompts Gradian's path answered (same prompt ids,
    the trained stop token, room for the fine-tune's longest answer): the rows whose answer changed and now fails
    where the fine-tune's passed."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, export.dtype, None) if export.dtype else None
    try:
        model: Any = AutoModelForCausalLM.from_pretrained(export.folder, use_safetensors=True,
                                                          dtype=dtype if isinstance(dtype, torch.dtype) else "auto")
        model = model.to(device).eval()
    except Exception as error:  # noqa: BLE001 - the user's folder: one sentence
        raise InputError(f"cannot load the served model's weights ({reason(error)}); pass a folder whose "
                         "safetensors load with transformers, or one without weights.", export.folder) from None
    eos = trained_eos_id(tokenizer, setup)
    model.generation_config.eos_token_id = eos  # the fine-tune's own stop: only the weights differ
    longest = max(len(row.finetuned.ids) for row in rows)
    answers = generate(model, tokenizer, [row.prompt_ids for row in rows], max_new_tokens=max(longest, 1))
    changed = [(row, answer) for row, answer in zip(rows, answers, strict=True)  # as far as the fine-tune's went
               if answer.ids[: len(row.finetuned.ids)] != row.finetuned.ids]
    broken = [row.id for row, answer in changed
              if passed(row.finetuned_score) and not passed(capability.score(answer.text, row.reference))]
    if not broken:
        return None
    return Difference("merged_weights", {"n_rows": len(broken), "n_changed": len(changed), "example_id": broken[0],
                                         "dtype": str(next(model.parameters()).dtype).removeprefix("torch.")})


def trained_eos_id(tokenizer: Any, setup: TrainingSetup) -> int | None:
    """The id of the EOS token the run trained answers to end on (the setup's `eos_token`, else the tokenizer's)."""
    token = eos_token_of(tokenizer, setup)
    found = tokenizer.convert_tokens_to_ids(token) if token is not None else None
    return found if isinstance(found, int) and found != tokenizer.unk_token_id else tokenizer.eos_token_id


def stop_token(measured: RegressionResult, served: ServedRegression, export: ServedExport | None,
               eos_id: int | None) -> Difference | None:
    """Failing served answers that run on past the fine-tune's own EOS-ended answer, while the served stop tokens
    leave the trained EOS out (or the served folder is not given, so they are unknown)."""
    answers = {row.id: row for row in served.rows}
    ran_on = [row.id for row in measured.rows if _runs_on(row, answers[row.id].output)]
    failing = [i for i in ran_on if not passed(answers[i].score)]
    served_ids = export.eos_token_ids if export is not None else None
    if not failing or (served_ids is not None and eos_id in served_ids):
        return None
    return Difference("stop_token", {"n_rows": len(failing), "example_id": failing[0], "trained_eos_id": eos_id,
                                     "served_eos_ids": served_ids})


def _runs_on(row: RegressionRow, served_text: str) -> bool:
    """The fine-tune stopped on EOS here, and the served text starts with its answer and goes on."""
    own, text = row.finetuned.text.strip(), served_text.strip()
    return row.finetuned.stopped and bool(own) and text.startswith(own) and len(text) > len(own)


def messages_of(example: Example) -> list[dict[str, Any]]:
    """The eval prompt as a chat endpoint receives it: its messages, or a plain prompt as one user turn."""
    prompt = example.prompt
    return list(prompt) if isinstance(prompt, list) else [{"role": "user", "content": prompt or ""}]


def prompt_differences(rows: Sequence[RegressionRow], examples: Sequence[Example], tokenizer: Any,
                       export: ServedExport) -> list[Difference | None]:
    """`chat_template`, `double_bos` and `system_prompt`: each eval prompt rendered by the served template and
    tokenizer against the tokens training rendered (`RegressionRow.prompt_ids`)."""
    served_tokenizer = export.tokenizer or tokenizer
    if export.chat_template is None:
        return []
    mismatched, doubled, missing = [], [], []
    for row, example in zip(rows, examples, strict=True):
        messages = messages_of(example)
        ids, text = served_prompt(served_tokenizer, messages, export)
        bos = served_tokenizer.bos_token_id
        where = _doubled_bos(served_tokenizer, ids, text, bos, row.prompt_ids)
        if where is not None:
            doubled.append((row.id, where))
            ids = ids[1:] if where == "template" else ids
        if ids != row.prompt_ids:
            mismatched.append((row, ids))
        systems = [m["content"] for m in messages if m.get("role") == "system" and isinstance(m.get("content"), str)]
        trained_text = tokenizer.decode(row.prompt_ids)
        if any(s.strip() and s in trained_text and s not in served_tokenizer.decode(ids) for s in systems):
            missing.append(row.id)
    return [
        _mismatch(mismatched, tokenizer, served_tokenizer) if mismatched else None,
        Difference("double_bos", {"n_rows": len(doubled), "example_id": doubled[0][0], "where": doubled[0][1],
                                  "bos_token": served_tokenizer.bos_token, "bos_token_id": bos}) if doubled else None,
        Difference("system_prompt", {"n_rows": len(missing), "example_id": missing[0]}) if missing else None,
    ]


def served_prompt(tokenizer: Any, messages: list[dict[str, Any]], export: ServedExport) -> tuple[list[int], str]:
    """The served template's tokens (no special tokens added) and its text."""
    try:
        out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True,
                                            chat_template=export.chat_template)
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                             chat_template=export.chat_template)
    except Exception as error:  # noqa: BLE001 - a template that fails is the served folder's: one sentence
        raise InputError(f"the served chat template cannot render the eval prompts ({reason(error)}).",
                         export.folder) from None
    return list(out["input_ids"]), str(text)


def _doubled_bos(tokenizer: Any, ids: list[int], text: str, bos: int | None, trained: list[int]) -> str | None:
    """`template` when the served template itself writes BOS twice, `tokenizer` when it writes one and tokenizing the
    rendered text with special tokens adds another; None when training started the same way or BOS is single."""
    if bos is None or trained[:2] == [bos, bos]:
        return None
    if ids[:2] == [bos, bos]:
        return "template"
    if ids[:1] == [bos] and list(tokenizer(text, add_special_tokens=True)["input_ids"][:2]) == [bos, bos]:
        return "tokenizer"
    return None


def _mismatch(mismatched: list[tuple[RegressionRow, list[int]]], tokenizer: Any, served_tokenizer: Any) -> Difference:
    """The first eval row whose served prompt differs, at its first differing token."""
    row, served = mismatched[0]
    trained = row.prompt_ids
    at = next((i for i, (a, b) in enumerate(zip(trained, served, strict=False)) if a != b), min(len(trained),
                                                                                                 len(served)))
    return Difference("chat_template", {
        "n_rows": len(mismatched), "example_id": row.id, "position": at,
        "trained_token": _token(tokenizer, trained, at), "served_token": _token(served_tokenizer, served, at),
        "before": tokenizer.decode(trained[max(0, at - CONTEXT_TOKENS):at]),
    })


def _token(tokenizer: Any, ids: list[int], at: int) -> str | None:
    """The token at `at` as its vocabulary writes it; None past the end of the prompt."""
    return tokenizer.convert_ids_to_tokens(ids[at]) if at < len(ids) else None


def token_limit(rows: Sequence[RegressionRow], export: ServedExport, tokenizer: Any) -> Difference | None:
    """The served `max_new_tokens` below the longest reference answer's length in tokens (EOS not counted)."""
    references = [(row.id, row.reference) for row in rows if row.reference]
    if export.max_new_tokens is None or not references:
        return None
    served_tokenizer = export.tokenizer or tokenizer
    lengths = [len(served_tokenizer(text, add_special_tokens=False)["input_ids"]) for _, text in references]
    longest = max(range(len(lengths)), key=lengths.__getitem__)
    if export.max_new_tokens >= lengths[longest]:
        return None
    return Difference("max_new_tokens", {
        "max_new_tokens": export.max_new_tokens, "longest_reference": lengths[longest],
        "example_id": references[longest][0], "n_rows": sum(n > export.max_new_tokens for n in lengths)})
