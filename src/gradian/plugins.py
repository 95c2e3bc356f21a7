"""Plug-ins a team ships as a package: entry points, found with no flag once the package is installed.

Two groups, declared in the plug-in's `pyproject.toml`:

    [project.entry-points."gradian.capabilities"]
    yes_no = "my_checks:YesNo"            # a Capability subclass, or a factory `(argument) -> Capability`

    [project.entry-points."gradian.checks"]
    my_checks = "my_checks.audit"         # a module whose `@check(name, category=...)` functions register on import

`examples/gradian-example-checks/` is a worked example.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points
from typing import Any

from gradian.errors import InputError, reason

CAPABILITIES = "gradian.capabilities"
CHECKS = "gradian.checks"


def load_group(group: str) -> list[tuple[EntryPoint, Any]]:
    """Every installed entry point of `group`, loaded; one that fails to import is bad input naming its package."""
    loaded = []
    for point in sorted(entry_points(group=group), key=lambda p: p.name):
        try:
            loaded.append((point, point.load()))
        except Exception as error:  # a plug-in's import error is the user's to fix, not a Gradian traceback
            package = point.dist.name if point.dist is not None else "its package"
            raise InputError(f"the plug-in {point.name!r} = {point.value!r} ({package}, entry point group {group}) "
                             f"failed to load ({reason(error)}); fix or uninstall {package}.") from None
    return loaded
