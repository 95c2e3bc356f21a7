"""Every command of the CLI, in the order `gradian --help` lists them."""

from __future__ import annotations

import click

ALL: list[click.Command] = []
