"""Everything a check may look at, read once: the rows, their rendering, the tokenizer, the run."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from gradian.data.base_model import BaseModelRef
from gradian.data.examples import Example
from gradian.data.render import Rendered, eos_token_of, pad_token_id_of
from gradian.data.run_folder import RunInfo
from gradian.data.setup import TrainingSetup

if TYPE_CHECKING:
    from gradian.capabilities import Capability


@dataclass
class AuditContext:
    """The input of every check. `rendered[i]` is `examples[i]` as the trainer tokenized it."""

    examples: Sequence[Example]  # `data.columns.ExampleColumns` in `diagnose`: a row is built when read
    rendered: Sequence[Rendered]
    tokenizer: Any
    setup: TrainingSetup
    run: RunInfo | None = None
    eval_examples: list[Example] | None = None
    base_ref: BaseModelRef | None = None
    base_config: Any = None
    options: dict[str, Any] = field(default_factory=dict)
    capability: Capability | None = None  # what the fine-tune should be able to do, applied to the training targets

    @cached_property
    def eos_id(self) -> int | None:
        token = eos_token_of(self.tokenizer, self.setup)
        return self.tokenizer.convert_tokens_to_ids(token) if token is not None else None

    @cached_property
    def pad_id(self) -> int | None:
        return pad_token_id_of(self.tokenizer, self.setup)

    @cached_property
    def bos_id(self) -> int | None:
        return self.tokenizer.bos_token_id

    @cached_property
    def end_ids(self) -> set[int]:
        """Tokens the model stops on: the base config's EOS id(s); the tokenizer's EOS only when the run did not
        replace it (an `eos_token` in the config that the model never stops on is what `missing_eos` reports)."""
        ids: set[int] = set()
        generation_eos = getattr(self.base_config, "eos_token_id", None)
        if isinstance(generation_eos, int):
            ids.add(generation_eos)
        elif isinstance(generation_eos, list):
            ids.update(i for i in generation_eos if isinstance(i, int))
        if (self.setup.eos_token is None or not ids) and self.eos_id is not None:
            ids.add(self.eos_id)
        return ids

    @cached_property
    def untrained_ids(self) -> frozenset[str]:
        """Rows the trainer dropped (over the length limit, or no token with loss): they taught nothing, so a check
        of what rows teach skips them."""
        return frozenset(r.example_id for r in self.rendered if r.dropped)

    def trained(self) -> Iterator[Example]:
        """The examples the run trained on, in dataset order."""
        return (e for e in self.examples if e.id not in self.untrained_ids)

    @property
    def rows(self) -> Iterator[tuple[Example, Rendered]]:
        """(example, rendered) pairs one at a time."""
        return zip(self.examples, self.rendered, strict=True)

    @property
    def log_history(self) -> list[dict[str, Any]]:
        return self.run.log_history if self.run is not None else []

    @property
    def adapter_config(self) -> dict[str, Any]:
        return self.run.adapter_config if self.run is not None else {}

    def in_order(self, ids: set[str]) -> list[str]:
        """`ids` in dataset order."""
        return [e.id for e in self.examples if e.id in ids]
