"""The one error type users see: a sentence naming the file (and line) and what to do."""

from __future__ import annotations

from pathlib import Path


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
