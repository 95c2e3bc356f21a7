"""`gradian`: one command per user task. Errors become one sentence and exit code 2."""

from __future__ import annotations

import sys

import click

from gradian import __version__
from gradian.errors import InputError


class GradianGroup(click.Group):
    """Turns `InputError` anywhere below into one sentence on stderr and exit code 2."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except InputError as error:
            click.echo(f"Error: {error}", err=True)
            ctx.exit(2)


@click.group(cls=GradianGroup)
@click.version_option(__version__, prog_name="gradian")
def cli() -> None:
    """Find which training examples, or which setting, made a LoRA fine-tune worse at one thing."""


def register_commands() -> None:
    """Add every command to `cli` (kept out of import time, so `import gradian.cli.main` stays cheap); tests and
    tools that drive `cli` with click's `CliRunner` call it first. Calling it again changes nothing."""
    from gradian.cli import commands

    for command in commands.ALL:
        cli.add_command(command)


def main() -> None:
    register_commands()
    sys.exit(cli.main(standalone_mode=True))
