"""The JSON Schemas the package ships (report.json, verification.json, gradian_run.json): loading one, and saying
in a few words where a value breaks it."""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any


def load_schema(package: str, name: str) -> dict[str, Any]:
    """A JSON Schema shipped as a data file of `package`."""
    return json.loads(files(package).joinpath(name).read_text(encoding="utf-8"))


def validator_of(schema: dict[str, Any]) -> Any:
    """A jsonschema validator of `schema`, of the draft it names."""
    import jsonschema

    return jsonschema.validators.validator_for(schema)(schema)


def schema_problem(validator: Any, value: Any) -> str | None:
    """The first way `value` breaks the schema, in a few words (`at verdict: 'x' is not of type 'object'`)."""
    import jsonschema

    try:
        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    except RecursionError:
        return "nested too deeply"
    if error is None:
        return None
    where = ".".join(map(str, error.absolute_path)) or "the top level"
    message = " ".join(error.message.split())
    return f"at {where}: {message[:150]}{'...' if len(message) > 150 else ''}"
