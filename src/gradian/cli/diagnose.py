"""`gradian diagnose`: the mechanical faults of a fine-tune, most severe first. Exit 0 clean, 1 findings, 2 bad input."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from gradian.audit.diagnosis import DiagnoseResult, TokenizerSource, diagnose
from gradian.audit.finding import SEVERITIES, Finding
from gradian.cli.exit_codes import EPILOG
from gradian.data.setup import preparation
from gradian.errors import InputError
from gradian.guard import inputs, refuse_overwrite

STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
WRITES = ("findings.json", "findings.md")  # into --out


@click.command("diagnose", epilog=EPILOG)
@click.option("--dataset", required=True,
              help="Training rows (JSONL, a JSON array, either gzip-compressed, Parquet, or a save_to_disk folder).")
@click.option("--eval-dataset", default=None, help="Eval rows, to find train/eval overlap.")
@click.option("--run", "run_dir", default=None, help="The trainer's output_dir (adapter, trainer_state, checkpoints).")
@click.option("--config", default=None, help="TRL SFTConfig or axolotl YAML/JSON (default: found in --run).")
@click.option("--base-model", required=True, help="Model folder, .gguf file or hub id in the local cache.")
@click.option("--max-length", type=click.IntRange(min=1), default=None, help="Override the run's max_length.")
@click.option("--capability", default=None,
              help="Score every training completion with this capability too (the names `attribute` takes: "
                   "json_formatting, regex:P, module:function …; capabilities that need a reference are skipped).")
@click.option("--out", default=None, type=click.Path(file_okay=False), help="Also write findings.json and findings.md.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@click.option("--fail-on", type=click.Choice(["critical", "warning"]), default="warning", show_default=True,
              help="Exit 1 when a finding at or above this severity is present.")
def diagnose_command(dataset: str, eval_dataset: str | None, run_dir: str | None, config: str | None,
                     base_model: str, max_length: int | None, capability: str | None, out: str | None, as_json: bool,
                     fail_on: str) -> None:
    """Audit a LoRA fine-tune for mechanical faults: truncation, EOS, loss mask, duplicates, schedule, template."""
    if out:  # before any work: findings.json and findings.md must not land on an input
        refuse_overwrite(out, WRITES, inputs(dataset=dataset, base_model=base_model, run=run_dir, config=config,
                                             eval_dataset=eval_dataset, capability=capability))
    overrides = {"max_length": max_length} if max_length is not None else None
    progress = _progress if not as_json and sys.stderr.isatty() else None  # keep pipes and logs clean
    result = diagnose(dataset, base_model=base_model, eval_dataset=eval_dataset, run=run_dir, config=config,
                      overrides=overrides, progress=progress, capability=capability)
    payload = result.to_dict()
    if out:
        _write(Path(out), payload, result)
    if as_json:
        click.echo(json.dumps(payload, indent=2, default=str))
    else:
        _print_table(result)
        if out:
            click.echo(f"Wrote {Path(out) / 'findings.json'} and findings.md beside it.")
    limit = SEVERITIES.index(fail_on)
    if any(SEVERITIES.index(f.severity) <= limit for f in result.findings):
        click.get_current_context().exit(1)


def _progress(message: str) -> None:
    click.echo(f"· {message}", err=True)


def _print_table(result: DiagnoseResult) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not result.findings:
        console.print(f"[green]No mechanical faults found in {len(result.examples)} rows.[/green]")
    else:
        table = Table(title=f"gradian diagnose: {len(result.findings)} finding(s) over {len(result.examples)} rows")
        for column in ("severity", "check", "finding", "rows", "fix"):
            table.add_column(column, overflow="fold")
        for finding in result.findings:
            style = STYLE[finding.severity]
            table.add_row(f"[{style}]{finding.severity}[/{style}]", finding.check, finding.title,
                          str(len(finding.example_ids) or "—"), finding.fix)
        console.print(table)
    if result.run is not None and result.run.record is not None:
        console.print(f"[dim]Run record: {result.run.record.describe()}[/dim]", highlight=False)
    if result.rows_source is not None and result.setup.record:  # without a record every row is rendered, as always
        console.print(f"[dim]Rows: {result.rows_source.describe()}[/dim]", highlight=False)
    if result.tokenizer_source is not None:
        console.print(f"[dim]Tokenizer: {result.tokenizer_source.describe()}[/dim]", highlight=False)
    if result.setup.framework_version:
        console.print(f"[dim]{result.setup.framework} {result.setup.framework_version}: "
                      f"{result.setup.version_source}[/dim]")
    console.print(f"[dim]Training rows: {preparation(result.setup)['text']}[/dim]", highlight=False)
    if result.setup.assumed:
        console.print(f"[dim]Assumed framework defaults for: {', '.join(result.setup.assumed)}[/dim]")
    for line in result.run.unreadable if result.run else []:
        console.print(f"[dim]Could not read {line}[/dim]")


def _write(out: Path, payload: dict, result: DiagnoseResult) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / WRITES[0]).write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
        (out / WRITES[1]).write_text(findings_markdown(result.findings, len(result.examples),
                                                           result.tokenizer_source), encoding="utf-8")
    except OSError as error:
        raise InputError(f"cannot write the findings there ({error.strerror or type(error).__name__}); "
                         f"give --out a folder you can write.", out) from None


def findings_markdown(findings: list[Finding], rows: int, tokenizer: TokenizerSource | None = None) -> str:
    """A pasteable summary: one table row per finding, then each fix in full."""
    lines = [f"# gradian diagnose: {len(findings)} finding(s) over {rows} rows", ""]
    if tokenizer is not None:
        lines += [f"Tokenizer read: {tokenizer.describe()}.", ""]
    if not findings:
        return "\n".join(lines + ["No mechanical faults found.", ""])
    lines += ["| severity | check | finding | rows |", "|---|---|---|---|"]
    for f in findings:
        lines.append(f"| {f.severity} | `{f.check}` | {f.title.replace('|', '/')} | {len(f.example_ids) or ''} |")
    lines += ["", "## Fixes", ""]
    lines += [f"- **{f.check}**: {f.fix}" for f in findings]
    return "\n".join(lines) + "\n"
