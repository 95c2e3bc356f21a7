"""The one error type users see: a sentence naming the file (and line) and what to do."""

from __future__ import annotations

import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

LOG_DIR_VARIABLE = "GRADIAN_LOG_DIR"


class InputError(Exception):
    """Bad input from the user. The CLI prints `str(error)` and exits with code 2, never a traceback."""

    def __init__(self, message: str, path: str | Path | None = None, line: int | None = None) -> None:
        self.message = message
        self.path = str(path) if path is not None else None
        self.line = line
        super().__init__(self.__str__())

    def __str__(self) -> str:
        """One line: a path or spec with a newline or another unprintable character in it is shown quoted and
        escaped (`'nope:\\n0'`), and a message's line breaks become spaces."""
        where = ""
        if self.path is not None:
            shown = self.path if self.path.isprintable() else repr(self.path)
            where = f"{shown}:{self.line}: " if self.line is not None else f"{shown}: "
        return f"{where}{' '.join(self.message.splitlines())}"


def reason(error: BaseException, limit: int = 200) -> str:
    """The first line of a library's error message, to quote inside one sentence (never a traceback)."""
    lines = str(error).strip().splitlines()
    return lines[0][:limit] if lines else type(error).__name__


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
