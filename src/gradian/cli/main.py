"""`gradian`: one command per user task. Errors become one sentence and exit code 2."""

from __future__ import annotations

import os
import sys
import warnings

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


def quiet_libraries() -> None:
    """Library deprecation warnings and weight-loading bars stay off the user's terminal (set before the libraries
    load): Gradian's own progress bars are the ones a user sees."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' loading bars follow the hub's switch
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    for category in (FutureWarning, DeprecationWarning):
        warnings.filterwarnings("ignore", category=category)


def main() -> None:
    quiet_libraries()
    register_commands()
    sys.exit(cli.main(standalone_mode=True))
