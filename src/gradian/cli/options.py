"""Click options generated from a settings dataclass, so a command's options, helps, defaults and ranges are its
settings' fields (`gradian.settings`, `gradian.verify.settings`) and never drift from what the library accepts."""

from __future__ import annotations

import dataclasses
import typing

import click

from gradian.settings import AttributeSettings, choices


def settings_options(command: typing.Callable, cls: type = AttributeSettings) -> typing.Callable:
    """One click option per field of `cls` (`AttributeSettings`): the same settings object from CLI to artifact;
    a `Literal` field is a choice, a field with a `min` (metadata) a range, one marked `folder` a folder path, its
    help the field's."""
    hints = typing.get_type_hints(cls)
    for spec in reversed(dataclasses.fields(cls)):
        flag = "--" + spec.name.replace("_", "-")
        required = spec.default is dataclasses.MISSING
        helptext = spec.metadata.get("help", "")
        if hints[spec.name] is bool:
            command = click.option(f"{flag}/--no-{flag[2:]}", spec.name, default=spec.default, show_default=True,
                                   help=helptext)(command)
            continue
        default = {} if required else {"default": spec.default}  # click >= 8.3 takes an explicit None as a value
        command = click.option(flag, spec.name, type=option_type(cls, spec, hints[spec.name]), required=required,
                               show_default=not required and spec.default is not None, help=helptext,
                               **default)(command)
    return command


def option_type(cls: type, spec: dataclasses.Field, hint: typing.Any) -> typing.Any:
    """The click type of settings field `spec`: its `Literal` choices, its range from `min` and `max`, a folder, or its
    type."""
    allowed = choices(cls, spec.name)
    if allowed:
        return click.Choice(allowed)
    kind = next(t for t in typing.get_args(hint) or (hint,) if t is not type(None))
    if spec.metadata.get("folder"):
        return click.Path(file_okay=False)
    if "min" in spec.metadata or "max" in spec.metadata:
        return (click.IntRange if kind is int else click.FloatRange)(min=spec.metadata.get("min"),
                                                                        max=spec.metadata.get("max"))
    return kind
