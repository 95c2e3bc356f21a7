"""Which version of TRL a run trained with: recorded where the run says so, else inferred from its config's fields.

Settings that changed meaning between versions follow it, above all the collator: before TRL 0.17 `SFTTrainer`
used transformers' `DataCollatorForLanguageModeling`, which sets the label of every pad id to -100 (with
pad == eos that hides every EOS); from 0.17 TRL's own collator pads labels with -100 by position, so EOS stays.

`SFTConfig` fields by version (read from TRL's git history, `trl/trainer/sft_config.py` at each tag):

| field | first version | last version |
|---|---|---|
| `max_seq_length` | (always) | 0.19 (deprecated from 0.16, removed in 0.20) |
| `max_length`, `padding_free` | 0.16 | |
| `completion_only_loss` | 0.17 | |
| `assistant_only_loss` | 0.19 | |

A YAML/JSON config names only the fields the user set, so a field there bounds the version from one side only.
`training_args.bin` holds every field of the `SFTConfig` it pickled, so a field missing there bounds it too.

`package_version` is the version installed here, of a framework or of Gradian (what the run record and
report.json state).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

# field -> (first version that has it, first version without it)
TRL_FIELDS: dict[str, tuple[str | None, str | None]] = {
    "max_seq_length": (None, "0.20"),
    "max_length": ("0.16", None),
    "padding_free": ("0.16", None),
    "completion_only_loss": ("0.17", None),
    "assistant_only_loss": ("0.19", None),
}
SFT_ONLY = ("max_seq_length", "max_length", "padding_free", "completion_only_loss", "assistant_only_loss",
            "dataset_text_field", "packing")
POSITION_PADDING = Version("0.17")  # TRL's own collator: labels padded with -100 by position
FLATTENING = Version("0.16")  # padding_free: DataCollatorWithFlattening, no pad tokens at all
MODEL_CARD = re.compile(r"^\s*-\s*TRL:\s*([0-9][0-9A-Za-z.+-]*)\s*$", re.M)
AXOLOTL_CARD = re.compile(r"axolotl version: `([0-9][0-9A-Za-z.+-]*)`")  # axolotl train.py, in the model card


@dataclass(frozen=True)
class VersionRange:
    """`low <= version < high`; both None when nothing is known. `how` says where it came from."""

    low: Version | None = None
    high: Version | None = None
    how: str | None = None

    @property
    def text(self) -> str | None:
        if self.low is not None and self.high is not None and self.high == _next_release(self.low):
            return str(self.low)
        parts = [f">={self.low}" if self.low else "", f"<{self.high}" if self.high else ""]
        return ",".join(p for p in parts if p) or None

    def at_least(self, version: Version) -> bool:
        return self.low is not None and self.low >= version

    def below(self, version: Version) -> bool:
        return self.high is not None and self.high <= version


def package_version(package: str) -> str | None:
    """The installed version of `package` (this Python's, as `importlib.metadata` reads it); None when absent."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _next_release(version: Version) -> Version:
    return Version(f"{version.major}.{version.minor}.{version.micro + 1}")


def recorded_version(run_dir: Path | None, config: dict[str, Any], framework: str = "trl") -> VersionRange | None:
    """A version the run recorded: `trl_version` / `axolotl_version` in the config, or the model card the framework
    writes into the run folder (README.md: TRL's "- TRL: x.y.z", axolotl's "axolotl version: `x.y.z`")."""
    value = config.get(f"{framework}_version")
    if isinstance(value, (str, int, float)) and (version := _parse(str(value))):
        return VersionRange(version, _next_release(version), f"recorded in the config ({framework}_version)")
    pattern, card_of = (AXOLOTL_CARD, "axolotl's") if framework == "axolotl" else (MODEL_CARD, "TRL's")
    for folder in [run_dir] if run_dir is not None else []:
        card = folder / "README.md"
        if card.is_file() and card.stat().st_size < 1_000_000:
            match = pattern.search(card.read_text(encoding="utf-8", errors="replace"))
            if match and (version := _parse(match.group(1))):
                return VersionRange(version, _next_release(version), f"recorded in {card.name} ({card_of} model card)")
    return None


def inferred_trl_version(config: dict[str, Any], *, every_field: bool, where: str) -> VersionRange | None:
    """Bounds from the fields present (and, when `every_field`, absent) in an SFTConfig; None if it is not one."""
    present = [name for name in SFT_ONLY if name in config]
    if not present and not (every_field and str(config.get("__class__", "")).endswith("SFTConfig")):
        return None
    low: Version | None = None
    high: Version | None = None
    used: list[str] = []
    for name, (first, gone) in TRL_FIELDS.items():
        if name in config:
            if first and (low is None or Version(first) > low):
                low, used = Version(first), [*used, name]
            if gone and (high is None or Version(gone) < high):
                high, used = Version(gone), [*used, name]
        elif every_field:
            if first and (high is None or Version(first) < high):
                high, used = Version(first), [*used, f"no {name}"]
            if gone and (low is None or Version(gone) > low):
                low, used = Version(gone), [*used, f"no {name}"]
    if low is None and high is None:
        return None
    return VersionRange(low, high, f"inferred from {where}: {', '.join(dict.fromkeys(used))}")


def trl_collator_masks_pad(version: VersionRange, padding_free: bool) -> bool | None:
    """Whether TRL's default collator (no `data_collator` given) masks pad ids, or None when the version leaves it open."""
    if version.at_least(POSITION_PADDING) or (padding_free and version.at_least(FLATTENING)):
        return False
    if version.below(POSITION_PADDING) and not padding_free:
        return True
    return None


def _parse(text: str) -> Version | None:
    try:
        return Version(text.strip())
    except InvalidVersion:
        return None
