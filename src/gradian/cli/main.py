"""`gradian`: one command per user task. Bad input becomes one sentence and exit code 2; anything unexpected one
sentence, a log file with the traceback and exit code 3 (`cli.exit_codes`)."""

from __future__ import annotations

import os
import sys
import warnings

import click

from gradian import __version__
from gradian.cli.exit_codes import BAD_INPUT, EPILOG, INTERNAL, INTERRUPTED
from gradian.errors import InputError, reason, write_crash_log
from gradian.space import disk_full_sentence, is_disk_full, is_out_of_memory, out_of_memory_sentence


class GradianGroup(click.Group):
    """Every way a command ends, as the exit codes say: `InputError` anywhere below is one sentence on stderr and
    exit code 2; click's own usage errors and exits pass as they are; Ctrl-C is 130; anything else (a bug in
    Gradian or a library, a stray `sys.exit` that would end the run with nothing checked) is one sentence naming a
    log file that holds the traceback, and exit code 3, never a traceback on the terminal nor exit code 1. A full
    disk or a device out of memory is exit code 2: a setting or the machine, said in a sentence of what to change."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except InputError as error:
            click.echo(f"Error: {error}", err=True)
            ctx.exit(BAD_INPUT)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except KeyboardInterrupt:
            click.echo("Error: interrupted; run the same command again to resume from what was finished.", err=True)
            ctx.exit(INTERRUPTED)
        except OSError as error:
            if not is_disk_full(error):
                click.echo(f"Error: {internal_error(error)}", err=True)
                ctx.exit(INTERNAL)
            click.echo(f"Error: {disk_full_sentence(error)}", err=True)  # no log: writing one would need the disk
            ctx.exit(BAD_INPUT)
        except BaseException as error:  # SystemExit included: nothing below may end the run on its own
            if is_out_of_memory(error):
                click.echo(f"Error: {out_of_memory_sentence(error, ctx.invoked_subcommand)}", err=True)
                ctx.exit(BAD_INPUT)
            click.echo(f"Error: {internal_error(error)}", err=True)
            ctx.exit(INTERNAL)


def internal_error(error: BaseException) -> str:
    """The one sentence for an unexpected error: what it was and the log file holding its traceback."""
    what = (f"something called sys.exit({error.code!r}) before the command finished" if isinstance(error, SystemExit)
            else f"{type(error).__name__}: {reason(error)}")
    log = write_crash_log(error)
    where = f"the traceback is in {log}" if log is not None else "no log file could be written"
    return f"internal error ({what}); {where}; please report it with that file."


@click.group(cls=GradianGroup, epilog=EPILOG)
@click.version_option(__version__, prog_name="gradian")
def cli() -> None:
    """Find which training examples, or which setting, made a LoRA fine-tune worse at one thing."""


def register_commands() -> None:
    """Add every command to `cli` (kept out of import time, so `import gradian.cli.main` stays cheap); tests and
    tools that drive `cli` with click's `CliRunner` call it first. Calling it again changes nothing."""
    from gradian.cli import commands

    for command in commands.ALL:
        cli.add_command(command)


def quiet_libraries() -> None:
    """Library deprecation warnings and weight-loading bars stay off the user's terminal (set before the libraries
    load): Gradian's own progress bars are the ones a user sees."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' loading bars follow the hub's switch
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    for category in (FutureWarning, DeprecationWarning):
        warnings.filterwarnings("ignore", category=category)


def tolerant_output() -> None:
    """A character the terminal's encoding cannot show (a table's dash under LC_ALL=C PYTHONUTF8=0) is printed as
    `?` on stdout (stderr already escapes it), never a crash in the middle of an answer."""
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if callable(reconfigure):
        try:
            reconfigure(errors="replace")
        except (ValueError, OSError):  # a stream already written in another way: leave it
            pass


def main() -> None:
    tolerant_output()
    quiet_libraries()
    register_commands()
    sys.exit(cli.main(standalone_mode=True))
