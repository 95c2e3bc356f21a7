"""`gradian extract`: the training rows' LoRA gradient features into `--out`, for a cluster job.

The same stage `attribute` runs (`gradian.stages.extract`), so `gradian attribute --out` the same folder later
finds the stores complete and goes straight to scoring. Under `torchrun --nproc-per-node N --no-python gradian
extract ...` (or `accelerate launch`) every process writes its own files of each store.
"""

from __future__ import annotations

import functools
import typing

import click

from gradian.cli.exit_codes import EPILOG
from gradian.cli.options import settings_options
from gradian.cli.progress import bar, say
from gradian.settings import ExtractSettings


@click.command("extract", epilog=EPILOG)
@functools.partial(settings_options, cls=ExtractSettings)
def extract_command(**options: typing.Any) -> None:
    """Compute and store the per-example gradient features of the training rows (resumable; shards over processes).

    Exit code 0 when every store is complete, 2 on bad input. Over N processes or machines:
    `torchrun --nproc-per-node N --no-python -- gradian extract ...` (the `--` keeps torchrun from reading
    `--run` as its own `--run-path`); `gradian attribute` runs the same way.
    """
    from gradian.gradients.distributed import join, leave
    from gradian.gradients.point import adapter_point, gradient_point
    from gradian.stages import extract, load, output_folder, prepare, run_audit

    try:
        settings = ExtractSettings(**options)
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    ranks = join()
    speak = say if ranks.is_main else (lambda _: None)
    with output_folder(settings, ranks):  # rank 0 holds the folder's lock, as attribute does
        speak("audit: rendering the rows as trained")
        audit = run_audit(settings, write=False)
        model, _ = load(settings, audit, ranks)
        prepared = prepare(settings, audit, model)
        point = gradient_point(settings, prepared.checkpoints)
        speak(f"gradients: {len(audit.rendered)} training rows"
              + (" (as the trainer prepared them, from the run's record)" if audit.setup.rows_from == "record" else "")
              + (f", read with the adapter's B × {point:g}" if point != 1.0 else "")
              + (f", {ranks.world} processes" if ranks.world > 1 else ""))
        with adapter_point(model, point):  # where attribute reads them
            extraction = extract(settings, audit, model, ranks=ranks, bar=bar if ranks.is_main else None,
                                 prepared=prepared)
    leave(ranks)
    if ranks.is_main:
        stores = [extraction.store, *extraction.checkpoint_stores]
        click.echo(f"Features: {extraction.store.root} ({extraction.store.n_rows} rows × {extraction.store.dim})"
                   + (f", and {len(stores) - 1} checkpoint stores" if len(stores) > 1 else ""))
