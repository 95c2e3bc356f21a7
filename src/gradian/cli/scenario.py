"""`gradian scenario`: build the synthetic scenarios with planted causes, or list them."""

from __future__ import annotations

import json

import click

from gradian.cli.exit_codes import EPILOG
from gradian.cli.progress import console, say
from gradian.settings import MAX_SEED


@click.group("scenario", epilog=EPILOG)
def scenario_command() -> None:
    """Synthetic fine-tunes with a planted cause and their ground truth (for tests, demos, benchmarks)."""


@scenario_command.command("list", epilog=EPILOG)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per scenario on stdout.")
def list_command(as_json: bool) -> None:
    """Every scenario and suite family, its kind and its planted cause (families also their dev/test split)."""
    from gradian.scenarios import CATALOG, FAMILIES
    from gradian.scenarios.family import describe

    rows = [{"name": s.name, "kind": s.kind, "summary": s.summary} for s in CATALOG.values()]
    rows += [{"name": f.name, "kind": f.kind, "summary": describe(f), "split": f.split} for f in FAMILIES.values()]
    for row in rows:
        if as_json:
            click.echo(json.dumps(row))
        else:
            split = f"[{row['split']}] " if "split" in row else ""
            click.echo(f"{row['name']:<28} {row['kind']:<14} {split}{row['summary']}")


@scenario_command.command("build", epilog=EPILOG)
@click.argument("name")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False), help="New folder for the scenario.")
@click.option("--seed", type=click.IntRange(0, MAX_SEED), default=0, show_default=True,
              help="Draws the culprit share, the category and the row order.")
@click.option("--base-seed", type=click.IntRange(0, MAX_SEED), default=0, show_default=True,
              help="Seed of the cached tiny base model.")
def build_command(name: str, out: str, seed: int, base_seed: int) -> None:
    """Build scenario NAME: base model, train/eval data, a real LoRA run, truth.json and measured.json."""
    from gradian.scenarios import build

    folder = build(name, out, seed, base_seed=base_seed, progress=say)
    measured = json.loads((folder / "measured.json").read_text())
    drop = measured["drop_points"]
    affected = f", {drop['affected']:.0f} on {measured['affected_category']}" if drop.get("affected") is not None else ""
    what = measured.get("capability", "json_validity")
    console.print(f"{name} built in {folder}: {what} dropped {drop['overall']:.0f} points overall{affected}")
