"""docs/cli.md, generated from `--help` so it never drifts: `python -m gradian.cli.reference > docs/cli.md`."""

from __future__ import annotations

import click

from gradian.cli.main import cli, register_commands


def _help(command: click.Command, name: str, parent: click.Context | None = None) -> str:
    with click.Context(command, info_name=name, parent=parent, terminal_width=100, max_content_width=100) as ctx:
        return command.get_help(ctx)


def cli_reference() -> str:
    """The help text of `gradian` and of every command (and subcommand), as one Markdown page."""
    register_commands()
    root = click.Context(cli, info_name="gradian", terminal_width=100, max_content_width=100)
    parts = ["# gradian command reference", "", "Generated from `--help` by `python -m gradian.cli.reference`; "
             "a test keeps it current.", "", "```", _help(cli, "gradian"), "```"]
    for name, command in sorted(cli.commands.items()):
        parts += ["", f"## gradian {name}", "", "```", _help(command, name, root), "```"]
        for sub_name, sub in sorted(getattr(command, "commands", {}).items()):
            sub_parent = click.Context(command, info_name=name, parent=root)
            parts += ["", f"### gradian {name} {sub_name}", "", "```", _help(sub, sub_name, sub_parent), "```"]
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    click.echo(cli_reference(), nl=False)
