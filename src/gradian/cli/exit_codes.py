"""The exit codes every command keeps, the table each `--help` ends with, and the crash log behind exit code 3.

README's "Exit codes" section holds the same table; `cli.main.GradianGroup` maps every way a command can end onto it.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

CLEAN, FINDINGS, BAD_INPUT, INTERNAL, INTERRUPTED = 0, 1, 2, 3, 130
LOG_DIR_VARIABLE = "GRADIAN_LOG_DIR"

EPILOG = """\b
Exit codes:
  0    clean, or answered (a report written, a refusal inside the noise band included)
  1    findings at or above --fail-on (diagnose)
  2    bad input or usage (an output path that is an input included): one sentence naming the file
       (and line) and what to do; a full disk or a device out of memory: what to change
  3    internal error: one sentence and the path of a log file holding the traceback
  130  interrupted (Ctrl-C)"""


def log_folder() -> Path:
    """Where crash logs go: $GRADIAN_LOG_DIR, else $XDG_STATE_HOME/gradian/logs, else ~/.local/state/gradian/logs."""
    if os.environ.get(LOG_DIR_VARIABLE):
        return Path(os.environ[LOG_DIR_VARIABLE])
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "gradian" / "logs"


def write_crash_log(error: BaseException) -> Path | None:
    """A new log file holding the command line and `error`'s traceback (the temporary folder when the log folder
    cannot be written); None when no file could be written at all."""
    text = (f"gradian crashed at {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\ncommand: {' '.join(sys.argv)}\n"
            f"python: {sys.version.split()[0]}\n\n" + "".join(traceback.format_exception(error)))
    for folder in (log_folder(), Path(tempfile.gettempdir())):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            handle, name = tempfile.mkstemp(prefix="gradian-crash-", suffix=".log", dir=folder)
            with os.fdopen(handle, "w", encoding="utf-8", errors="replace") as stream:
                stream.write(text)
            return Path(name)
        except OSError:
            continue
    return None
