"""`gradian verify`: retrain without the culprits (or with the fix) and show whether the capability comes back."""

from __future__ import annotations

import functools
import json
import typing

import click

from gradian.cli.exit_codes import EPILOG
from gradian.cli.options import settings_options
from gradian.cli.progress import bar, console, say
from gradian.verify.settings import VerifySettings


@click.command("verify", epilog=EPILOG)
@functools.partial(settings_options, cls=VerifySettings)
@click.option("--json", "as_json", is_flag=True, help="Print verification.json on stdout instead of the summary.")
def verify_command(as_json: bool, **options: typing.Any) -> None:
    """Retrain the run with its own recipe without the named rows (or with the named fix) and measure again.

    Removed rows keep their place in every batch at zero loss weight (the run's seed, order and step count), beside
    random removals of the same size; the retrain on the file without them is shown as what you will see. Writes
    DIR/verify/ (one folder per retrain, resumable), DIR/verification.json, .html and .md, and adds a verification
    section to the report. Exit code 0 when verification.json is written, 2 on bad input, a run Gradian cannot
    retrain faithfully, or a `serving` verdict (no retrain can move a drop the serving path causes).
    """
    from gradian.verify import verify

    try:
        settings = VerifySettings(**options)
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    verification = verify(settings, say=say, bar=bar)
    if as_json:
        click.echo(json.dumps(verification, indent=2))
        return
    print_summary(verification)


def print_summary(verification: dict[str, typing.Any]) -> None:
    """The status and the numbers behind it, one line each."""
    from gradian.report.wording import pct

    console.print()
    console.print(f"[bold]Verification: {verification['status']}[/bold]")
    click.echo(verification["status_reason"] + ".")
    for row in verification["retrains"]:
        recovered = "" if row["recovery"] is None else \
            f", recovery {pct(row['recovery'])} (CI {pct(row['recovery_ci'][0])} to {pct(row['recovery_ci'][1])})"
        click.echo(f"  {row['name']}: {pct(row['rate'])} {verification['capability']}{recovered}")
    for point in (verification.get("curve") or {}).get("points", []):
        click.echo(f"  curve {point['name']} ({point['size']} rows): recovery {pct(point['recovery'])}, "
                   f"random {pct(point['random_recovery'])}")
    if verification["capped"]:
        click.echo(f"  (each retrain capped at {verification['max_steps']} steps)")
