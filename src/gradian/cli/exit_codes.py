"""The exit codes every command keeps and the table each `--help` ends with (the crash log behind exit code 3 is
`gradian.errors.write_crash_log`).

README's "Exit codes" section holds the same table; `cli.main.GradianGroup` maps every way a command can end onto it.
"""

from __future__ import annotations

CLEAN, FINDINGS, BAD_INPUT, INTERNAL, INTERRUPTED = 0, 1, 2, 3, 130

EPILOG = """\b
Exit codes:
  0    clean, or answered (a report written, a refusal inside the noise band included)
  1    findings at or above --fail-on (diagnose)
  2    bad input or usage (an output path that is an input included): one sentence naming the file
       (and line) and what to do; a full disk or a device out of memory: what to change
  3    internal error: one sentence and the path of a log file holding the traceback
  130  interrupted (Ctrl-C)"""
