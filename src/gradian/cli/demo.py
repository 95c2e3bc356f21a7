"""`gradian demo`: the whole story on a scenario with a planted cause, with the commands a user would type."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from gradian.cli.exit_codes import EPILOG
from gradian.cli.progress import console, say
from gradian.settings import MAX_SEED


@click.command("demo", epilog=EPILOG)
@click.option("--out", "out", default="gradian-demo", show_default=True, type=click.Path(file_okay=False),
              help="Folder for the scenario and the reports.")
@click.option("--model", type=click.Choice(["tiny", "smollm2"]), default="tiny", show_default=True,
              help="tiny: a ~1M-parameter Llama (minutes on a laptop); smollm2: SmolLM2-135M-Instruct (about 25 minutes on one CPU thread).")
@click.option("--seed", type=click.IntRange(0, MAX_SEED), default=0, show_default=True,
              help="Seed of the scenario (which category, how many rows).")
@click.pass_context
def demo_command(ctx: click.Context, out: str, model: str, seed: int) -> None:
    """Build the truncated-cluster scenario (once per --out), then run `diagnose` and `attribute` on it as a user would."""
    from gradian.scenarios import build, built_before

    root = Path(out)
    name = "truncated-cluster" if model == "tiny" else "truncated-cluster-smollm2"
    scenario = root / "scenario"
    if built_before(scenario, name, seed):  # a second `gradian demo --out` the same folder: build once
        say(f"using the {name} scenario (seed {seed}) built before in {scenario}")
    else:
        say(f"building the {name} scenario (seed {seed}) in {scenario}")
        build(name, scenario, seed)
    common = ["--dataset", str(scenario / "train.jsonl"), "--base-model", str(scenario / "base")]
    diagnose_args = ["diagnose", *common, "--run", str(scenario / "run"), "--eval-dataset",
                     str(scenario / "eval.jsonl"), "--out", str(root / "diagnose"), "--fail-on", "critical"]
    attribute_args = ["attribute", *common, "--adapter", str(scenario / "run"), "--run", str(scenario / "run"),
                      "--eval-dataset", str(scenario / "eval.jsonl"), "--capability", "json_formatting",
                      "--out", str(root / "report")]
    for args in (diagnose_args, attribute_args):
        console.rule(f"[bold]$ gradian {shlex.join(args)}", align="left")
        code = _run(ctx, args)
        if code == 2:
            ctx.exit(2)
    console.print(f"\nThe planted cause is in {scenario / 'truth.json'}; the report is {root / 'report' / 'report.html'}")


def _run(ctx: click.Context, args: list[str]) -> int:
    """Run one gradian command in this process; returns its exit code."""
    code = ctx.find_root().command.main(args, prog_name="gradian", standalone_mode=False)
    return code if isinstance(code, int) else 0
