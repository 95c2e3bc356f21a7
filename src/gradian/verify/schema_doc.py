"""docs/verification-schema.md, generated from the JSON Schema shipped with the package (`verification.schema.json`).

    python -m gradian.verify.schema_doc > docs/verification-schema.md
"""

from __future__ import annotations

from typing import Any

from gradian.report.schema_doc import header, section, type_text
from gradian.verify.verification import verification_schema

REFS = {"ci": "[number, number]", "ci_or_null": "[number, number] or null", "number_or_null": "number or null",
        "test": "object (a test)", "retrain": "object (a retrain)"}

# The nested objects documented in their own table: (where in the schema, heading).
SECTIONS = [(("$defs", "retrain"), "retrains[] (and curve.retrains[])"), (("$defs", "test"), "tests[]"),
            (("properties", "topic"), "topic"), (("properties", "dropped"), "dropped"),
            (("properties", "curve"), "curve")]


def kind(spec: dict[str, Any]) -> str:
    """A property's type in words, `$ref`, `enum` and `const` included."""
    if "$ref" in spec:
        return REFS[spec["$ref"].rsplit("/", 1)[1]]
    if "const" in spec:
        return "string"
    if "enum" in spec:
        return "one of " + ", ".join(f"`{value}`" for value in spec["enum"])
    if "oneOf" in spec:
        return " or ".join(kind(option) for option in spec["oneOf"])
    if spec.get("type") == "array" and "$ref" in spec.get("items", {}):
        return f"list of {kind(spec['items'])}"
    return type_text(spec)


def render_doc(schema: dict[str, Any]) -> str:
    lines = header(schema, "verification.json", "gradian.verify.schema_doc",
                   "src/gradian/verify/verification.schema.json", kind=kind, flatten=False)
    for path, heading in SECTIONS:
        spec = schema
        for key in path:
            spec = spec[key]
        lines += section(heading, spec.get("description", ""), spec["properties"], kind=kind, flatten=False)
    points = schema["properties"]["curve"]["properties"]["points"]["items"]
    lines += section("curve.points[]", properties=points["properties"], kind=kind, flatten=False)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_doc(verification_schema()), end="")
