"""Plug-ins a team ships as a package: entry points, found with no flag once the package is installed.

Two groups, declared in the plug-in's `pyproject.toml`:

    [project.entry-points."gradian.capabilities"]
    yes_no = "my_checks:YesNo"            # a Capability subclass, or a factory `(argument) -> Capability`

    [project.entry-points."gradian.checks"]
    my_checks = "my_checks.audit"         # a module whose `@check(name, category=...)` functions register on import

`examples/gradian-example-checks/` is a worked example.

Plug-in code (an entry point's import, a capability's file or module, each call into them) runs inside
`plugin_code`: what it prints goes to stderr, so `--json` on stdout stays one JSON document, and whatever it raises,
`SystemExit` included (a script with no `if __name__ == "__main__":` guard exits at import), is bad input naming the
plug-in (exit code 2), never a silent exit 0 with nothing checked. KeyboardInterrupt passes: Ctrl-C is the user's.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

from gradian.errors import InputError, reason

CAPABILITIES = "gradian.capabilities"
CHECKS = "gradian.checks"


def load_group(group: str) -> list[tuple[EntryPoint, Any]]:
    """Every installed entry point of `group`, loaded; one that fails to import is bad input naming its package."""
    loaded = []
    for point in sorted(entry_points(group=group), key=lambda p: p.name):
        package = point.dist.name if point.dist is not None else "its package"
        plugin = f"the plug-in {point.name!r} = {point.value!r} ({package}, entry point group {group})"
        with plugin_code(plugin, "loading", fix=f"fix or uninstall {package}"):
            try:
                loaded.append((point, point.load()))
            except Exception as error:
                raise InputError(f"{plugin} failed to load ({reason(error)}); fix or uninstall {package}.") from None
    return loaded


@contextlib.contextmanager
def plugin_code(plugin: str, doing: str, *, path: str | Path | None = None, fix: str = "fix the plug-in") \
        -> Iterator[None]:
    """Run a plug-in's code: its prints on stderr, anything it raises (SystemExit too) an `InputError` naming
    `plugin` (and `path`, its file) that says what it was `doing` (loading, scoring) and ends with `fix`."""
    try:
        with contextlib.redirect_stdout(sys.stderr):  # stdout is Gradian's (--json)
            yield
    except (InputError, KeyboardInterrupt):
        raise
    except SystemExit as error:
        if doing == "loading":
            raise InputError(f"{plugin} exits while it is imported (sys.exit({error.code!r})), so nothing would be "
                             "checked; put its script part under `if __name__ == \"__main__\":` so that importing "
                             "it only defines functions.", path) from None
        raise InputError(f"{plugin} called sys.exit({error.code!r}) while {doing}; a plug-in returns its answer, "
                         f"never exits, so {fix}.", path) from None
    except BaseException as error:  # a plug-in's error is the user's to fix, not a Gradian traceback
        raise InputError(f"{plugin} failed while {doing} ({type(error).__name__}: {reason(error)}); {fix}.",
                         path) from None
