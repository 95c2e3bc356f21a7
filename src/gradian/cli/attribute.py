"""`gradian attribute`: which training rows, or which setting, caused the regression."""

from __future__ import annotations

import json
import typing

import click

from gradian.cli.exit_codes import EPILOG
from gradian.cli.options import settings_options
from gradian.cli.progress import bar, console, say
from gradian.settings import AttributeSettings


@click.command("attribute", epilog=EPILOG)
@settings_options
@click.option("--json", "as_json", is_flag=True, help="Print report.json on stdout instead of the answer.")
@click.option("--verify", "then_verify", is_flag=True,
              help="Then run `gradian verify` on the report: retrain without the culprits (or with the fix).")
def attribute_command(as_json: bool, then_verify: bool, **options: typing.Any) -> None:
    """Measure the regression, trace it to training rows through LoRA gradients, and write a report.

    Exit code 0 when the report is written, whatever the verdict (a refusal inside the noise band and `serving`, a
    drop only the served answers show, included), 2 on bad input. With --served-outputs the answers as the user
    serves them are measured beside Gradian's own (docs/serving.md).
    Over N processes: `torchrun --nproc-per-node N --no-python -- gradian attribute ...` (extraction is
    sharded over them; rank 0 scores and reports).
    """
    from gradian import attribute
    from gradian.gradients.distributed import join, leave

    try:
        settings = AttributeSettings(**options)
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    ranks = join()  # under torchrun / accelerate launch: this process's rank; rank 0 alone speaks and reports
    result = attribute(settings, say=say if ranks.is_main else None, bar=bar if ranks.is_main else None, ranks=ranks)
    leave(ranks)
    if result is None:
        return
    if then_verify:
        from gradian.cli.verify import print_summary
        from gradian.verify import VerifySettings, verify
        from gradian.verify.run import serving_refusal

        refusal = serving_refusal(result.report)  # the report is the answer: --verify is skipped, not an error
        if refusal:
            say(f"verify: not run: the report {refusal}")
            then_verify = False
        else:
            verification = verify(VerifySettings(report=settings.out, device=settings.device), say=say, bar=bar)
            result.report["verification"] = verification
    if as_json:
        click.echo(json.dumps(result.report, indent=2, default=str))
        return
    console.print()
    console.print(f"[bold]Verdict: {result.verdict.kind}[/bold]")
    click.echo(result.verdict.summary)
    click.echo(f"Next: {result.verdict.next_action}")
    click.echo(f"Report: {result.paths.get('report.html', settings.out_dir)}")
    record = ((result.report.get("run") or {}).get("setup") or {}).get("record")
    if record:
        click.echo(f"Run record: read {record} (recorded by GradianCallback) before the config and training_args.bin")
        rows = (result.report.get("run") or {}).get("rows_source") or {}
        if rows.get("summary"):
            click.echo(f"Rows: {rows['summary']}")
    if then_verify:
        print_summary(result.report["verification"])
