"""Every command of the CLI, in the order `gradian --help` lists them."""

from __future__ import annotations

import click

ALL: list[click.Command] = []
from gradian.cli.diagnose import diagnose_command  # noqa: E402

ALL.append(diagnose_command)
from gradian.cli.attribute import attribute_command  # noqa: E402

ALL.append(attribute_command)
from gradian.cli.verify import verify_command  # noqa: E402

ALL.append(verify_command)
from gradian.cli.extract import extract_command  # noqa: E402

ALL.append(extract_command)
from gradian.cli.demo import demo_command  # noqa: E402

ALL.append(demo_command)
from gradian.cli.scenario import scenario_command  # noqa: E402

ALL.append(scenario_command)
