"""`VerifySettings`: what `gradian verify` retrains and how, one object from the CLI to verification.json.

Light to import (the CLI builds its options from these fields before any heavy library loads): each field's help is
the option's help and says why its default is what it is; a field's `min` is the least value the library accepts and
the CLI's range; `folder` marks a path that must be a folder.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gradian.settings import GENERATION_BATCH, check_fields


@dataclass
class VerifySettings:
    """`gradian verify`: the report to check, the controls and extra retrains beside it, where and how long to train."""

    report: str = field(metadata={"help": "the report folder `gradian attribute` wrote (its --out)", "folder": True})
    controls: int = field(default=5, metadata={"min": 0, "help": (
        "random-removal controls of the same size as the culprits (and per point of --curve): the culprits' retrain "
        "must beat each one, so `confirmed` means naming these rows beats removing as many rows at random; each "
        "costs a retrain")})
    dropped_controls: int = field(default=0, metadata={"min": 0, "help": (
        "random drops from the file of as many rows as the named rows, beside the named rows dropped from the file "
        "(train.cleaned.jsonl, what the next action says to do): that retrain is tested against each one, and the "
        "status reason says whether acting on the report beats dropping as many rows at random (reported, not "
        "gated on); none by default, as each costs a retrain")})
    groups: int = field(default=0, metadata={"min": 0, "help": (
        "also retrain without each of the G most harmful candidate groups, to check the ranking itself; none by "
        "default, as each costs a retrain")})
    curve: bool = field(default=False, metadata={"help": (
        "also remove the top 1, 2, 5, 10 and 20% of the ranking and draw recovery against k; off by default, as each "
        "point costs one retrain plus one per control")})
    device: str | None = field(default=None, metadata={"help": "cpu, cuda or cuda:N; default: cuda when present, else cpu"})
    max_steps: int | None = field(default=None, metadata={"min": 1, "help": (
        "cap each retrain at N optimizer steps (the verification then says it was capped); default: the run's own "
        "step count, which a faithful retrain needs")})
    batch_size: int = field(default=GENERATION_BATCH, metadata={"min": 1, "help": (
        "generation batch size when each retrain is measured on the report's eval prompts (halved while a batch "
        "runs out of memory)")})

    def __post_init__(self) -> None:
        check_fields(self)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
