"""`gradian attribute`: which training rows, or which setting, caused the regression."""

from __future__ import annotations

import dataclasses
import json
import typing

import click

from gradian.cli.progress import bar, console, say
from gradian.settings import AttributeSettings, choices


def settings_options(command: typing.Callable, cls: type = AttributeSettings) -> typing.Callable:
    """One click option per field of `cls` (`AttributeSettings`): the same settings object from CLI to artifact;
    a `Literal` field is a choice, its help the field's."""
    hints = typing.get_type_hints(cls)
    for spec in reversed(dataclasses.fields(cls)):
        flag = "--" + spec.name.replace("_", "-")
        required = spec.default is dataclasses.MISSING
        helptext = spec.metadata.get("help", "")
        if hints[spec.name] is bool:
            command = click.option(f"{flag}/--no-{flag[2:]}", spec.name, default=spec.default, show_default=True,
                                   help=helptext)(command)
            continue
        allowed = choices(cls, spec.name)
        kind = typing.get_args(hints[spec.name]) or (hints[spec.name],)
        ctype = click.Choice(allowed) if allowed else next(t for t in kind if t is not type(None))
        default = None if required else spec.default
        command = click.option(flag, spec.name, type=ctype, required=required, default=default,
                               show_default=not required and default is not None, help=helptext)(command)
    return command


@click.command("attribute")
@settings_options
@click.option("--json", "as_json", is_flag=True, help="Print report.json on stdout instead of the answer.")
@click.option("--verify", "then_verify", is_flag=True,
              help="Then run `gradian verify` on the report: retrain without the culprits (or with the fix).")
def attribute_command(as_json: bool, then_verify: bool, **options: typing.Any) -> None:
    """Measure the regression, trace it to training rows through LoRA gradients, and write a report.

    Exit code 0 when the report is written (a refusal inside the noise band included), 2 on bad input.
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
    if then_verify:
        print_summary(result.report["verification"])
