"""Capabilities: what "the fine-tune got worse at X" means, as a score of one output in [0, 1].

A capability is named by a spec string: `json_formatting`, `json_formatting:keys`, `exact_match`,
`contains`, `regex:<pattern>`, `json_schema:<file>`, or a plug-in `module:function` (also
`path/to/file.py:function`) whose function takes `(output, reference)` and returns a float in [0, 1].
Built-ins register with `@register_capability(name)` exactly as third-party code can; an installed package adds
its own under the `gradian.capabilities` entry point (`gradian.plugins`), with no flag.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gradian.capabilities.repair import normal_key, parse_object, repair_json_object
from gradian.errors import InputError, reason
from gradian.plugins import CAPABILITIES as CAPABILITY_GROUP
from gradian.plugins import load_group, plugin_code

Factory = Callable[[str | None], "Capability"]
_REGISTRY: dict[str, Factory] = {}
PASS_SCORE = 0.5  # a score at or above it passes the capability


class Capability(ABC):
    """Scores one generated answer. `binary` capabilities return exactly 0.0 or 1.0 (McNemar applies)."""

    name: str = ""
    binary: bool = True
    needs_reference: bool = False

    @abstractmethod
    def score(self, output: str, reference: str | None) -> float:
        """1.0 = the output has the capability, 0.0 = it does not."""

    def repair(self, output: str, reference: str) -> str | None:
        """A correct answer that keeps the failing output up to where it failed (None: no minimal edit known)."""
        return None

    def passes(self, output: str, reference: str | None) -> bool:
        return passed(self.score(output, reference))


def passed(score: float) -> bool:
    """The pass threshold, for a score already computed: the one place it is decided."""
    return score >= PASS_SCORE


def register_capability(name: str) -> Callable[[Factory], Factory]:
    """Decorator: `factory(argument)` builds the capability for spec `name` or `name:argument`."""

    def decorate(factory: Factory) -> Factory:
        _REGISTRY[name] = factory
        return factory

    return decorate


def unregister_capability(name: str) -> None:
    """Remove the capability registered under `name`: what a plug-in's test calls after itself so the next test sees
    the registry it found. A built-in's name removes the built-in for the rest of the process. A name nothing
    registered is a `ValueError`."""
    if name not in _REGISTRY:
        raise ValueError(f"no capability is registered as {name!r}")
    del _REGISTRY[name]


def available_capabilities() -> list[str]:
    _load_installed()
    return sorted(_REGISTRY)


def _load_installed() -> None:
    """Capabilities installed packages declare under the `gradian.capabilities` entry point (no flag needed)."""
    for point, value in load_group(CAPABILITY_GROUP):
        if point.name in BUILT_IN:
            raise InputError(f"the plug-in capability {point.name!r} ({point.value}) would replace the built-in one; "
                             f"rename its entry point.")
        if not callable(value):
            raise InputError(f"entry point {point.name!r} = {point.value!r} should name a Capability subclass or a "
                             f"factory (argument) -> Capability.")
        _REGISTRY[point.name] = _installed(f"the plug-in capability {point.name!r} = {point.value!r}", value)


def _installed(plugin: str, factory: Factory) -> Factory:
    """An installed package's factory, built and called as plug-in code (`gradian.plugins.plugin_code`)."""

    def build(argument: str | None) -> Capability:
        with plugin_code(plugin, "building the capability"):
            return InstalledCapability(plugin, factory(argument))

    return build


class InstalledCapability(Capability):
    """A capability an installed package declares, every call into it run as plug-in code: its prints on stderr,
    whatever it raises (SystemExit too) one sentence naming it."""

    def __init__(self, plugin: str, capability: Capability) -> None:
        self.plugin, self.capability = plugin, capability
        self.name, self.binary = capability.name, capability.binary
        self.needs_reference = capability.needs_reference

    def score(self, output: str, reference: str | None) -> float:
        with plugin_code(self.plugin, "scoring an answer"):
            value = self.capability.score(output, reference)
            return checked_score(value, self.binary, self.plugin)

    def repair(self, output: str, reference: str) -> str | None:
        with plugin_code(self.plugin, "repairing an answer"):
            return checked_repair(self.capability.repair(output, reference), self.plugin)


def checked_score(value: Any, binary: bool, plugin: str, path: str | None = None) -> float:
    """A plug-in's score as a float in [0, 1] (exactly 0 or 1 when it says it is `binary`), else `InputError`."""
    try:
        number = float(value)
    except Exception:  # a plug-in's own type may raise anything from __float__
        raise InputError(f"{plugin} returned {_shown(value)}, not a number; scores must be floats in [0, 1].",
                         path) from None
    if not 0.0 <= number <= 1.0:
        raise InputError(f"{plugin} returned {number}, outside [0, 1]; scores must be in [0, 1].", path)
    if binary and number not in (0.0, 1.0):
        raise InputError(f"{plugin} is binary but returned {number}; a binary capability returns exactly 0 or 1 "
                         "(or drop `binary`).", path)
    return number


def checked_repair(value: Any, plugin: str, path: str | None = None) -> str | None:
    """A plug-in's repaired answer: text or None, else `InputError`."""
    if value is not None and not isinstance(value, str):
        raise InputError(f"{plugin}'s repair returned {_shown(value)}; it must return the corrected text or None.",
                         path)
    return value


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def get_capability(spec: str) -> Capability:
    """The capability a spec names; an unknown name or a plug-in that fails to import raises `InputError`."""
    spec = spec.strip()
    _load_installed()
    name, colon, argument = spec.partition(":")
    if name in _REGISTRY:
        return _REGISTRY[name](argument if colon else None)
    if colon and argument:
        return PluginCapability(spec, _import_plugin(name, argument, spec))
    known = ", ".join(available_capabilities())
    raise InputError(f"unknown capability; use one of {known}, or module:function for a plug-in.", spec)


def capability_file(spec: str | None) -> str | None:
    """The file a capability spec reads, if any: a plug-in's `path/to/file.py` or a `json_schema:` schema file."""
    name, colon, argument = (spec or "").strip().partition(":")
    if name == "json_schema" and argument:
        return argument
    return name if colon and name.endswith(".py") else None


def _reference_required(capability: Capability, reference: str | None) -> str:
    if reference is None:
        raise InputError(f"the capability {capability.name} needs a reference answer on every eval row.")
    return reference


@register_capability("json_formatting")
class JsonFormatting(Capability):
    """The output parses as one JSON object; with `:keys`, one with exactly the reference's keys (whitespace in a
    key aside: a tokenizer that decodes with spaces writes `" intent "`)."""

    def __init__(self, argument: str | None = None) -> None:
        if argument not in (None, "keys"):
            raise InputError("json_formatting takes no argument or ':keys'.", f"json_formatting:{argument}")
        self.same_keys = argument == "keys"
        self.needs_reference = self.same_keys
        self.name = "json_formatting:keys" if self.same_keys else "json_formatting"

    def score(self, output: str, reference: str | None) -> float:
        value = _loads(output)
        if not isinstance(value, dict):
            return 0.0
        if not self.same_keys:
            return 1.0
        wanted = _loads(_reference_required(self, reference))
        return float(isinstance(wanted, dict) and set(map(normal_key, value)) == set(map(normal_key, wanted)))

    def repair(self, output: str, reference: str) -> str | None:
        if self.score(output, reference) == 1.0 or not isinstance(_loads(reference), dict):
            return None
        allowed = set(parse_object(reference).keys()) if self.same_keys else None
        return repair_json_object(output, reference, allowed_keys=allowed)


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None


@register_capability("exact_match")
class ExactMatch(Capability):
    """The output equals the reference, ignoring leading and trailing whitespace."""

    name = "exact_match"
    needs_reference = True

    def __init__(self, argument: str | None = None) -> None:
        if argument:
            raise InputError("exact_match takes no argument.", f"exact_match:{argument}")

    def score(self, output: str, reference: str | None) -> float:
        return float(output.strip() == _reference_required(self, reference).strip())

    def repair(self, output: str, reference: str) -> str | None:
        return None if self.score(output, reference) else reference


@register_capability("contains")
class Contains(Capability):
    """The output contains the reference (or, for `contains:<text>`, that text)."""

    def __init__(self, argument: str | None = None) -> None:
        self.text = argument or None
        self.needs_reference = self.text is None
        self.name = f"contains:{argument}" if argument else "contains"

    def score(self, output: str, reference: str | None) -> float:
        wanted = self.text if self.text is not None else _reference_required(self, reference).strip()
        return float(wanted in output)


@register_capability("regex")
class Regex(Capability):
    """`re.search(pattern, output)` finds a match (anchor the pattern with ^...$ for a full match)."""

    def __init__(self, argument: str | None = None) -> None:
        if not argument:
            raise InputError("regex needs a pattern, as in regex:^\\{.*\\}$.", "regex")
        try:
            self.pattern = re.compile(argument, re.DOTALL)
        except re.error as error:
            raise InputError(f"is not a valid regular expression ({error}).", f"regex:{argument}") from None
        except (OverflowError, RecursionError) as error:  # a repeat count past Python's limit, nesting too deep
            raise InputError(f"is not a regular expression Python can compile ({reason(error)}); use a smaller "
                             "repeat count or less nesting.", f"regex:{argument}") from None
        self.name = f"regex:{argument}"

    def score(self, output: str, reference: str | None) -> float:
        return float(self.pattern.search(output) is not None)


@register_capability("json_schema")
class JsonSchema(Capability):
    """The output parses as JSON and validates against a JSON Schema file."""

    def __init__(self, argument: str | None = None) -> None:
        import jsonschema

        if not argument:
            raise InputError("json_schema needs a schema file, as in json_schema:answer.schema.json.", "json_schema")
        path = Path(argument)
        if not path.is_file():
            raise InputError("no such JSON Schema file; check the path after json_schema:.", path)
        schema = _loads(path.read_text(encoding="utf-8", errors="replace"))
        if not isinstance(schema, (dict, bool)):
            raise InputError("is not a JSON Schema (expected a JSON object).", path)
        validator_class = jsonschema.validators.validator_for(schema)
        try:
            validator_class.check_schema(schema)
        except jsonschema.SchemaError as error:
            raise InputError(f"is not a valid JSON Schema ({error.message}).", path) from None
        remote = _remote_ref(schema)
        if remote is not None:
            raise InputError(f"refers to another document ($ref: {remote!r}), which Gradian does not fetch (it runs "
                             "offline); inline the referenced schema under $defs and refer to it as #/$defs/<name>.",
                             path)
        self.validator, self.path = validator_class(schema), path
        self.name = f"json_schema:{argument}"
        for probe in _PROBES:  # a $ref that loops on itself fails on any value: say so before generating
            self._valid(probe)

    def score(self, output: str, reference: str | None) -> float:
        try:
            value = json.loads(output)
        except (json.JSONDecodeError, RecursionError):
            return 0.0
        return float(self._valid(value))

    def _valid(self, value: Any) -> bool:
        import referencing.exceptions

        try:
            return bool(self.validator.is_valid(value))
        except RecursionError:
            raise InputError("never finishes validating a value: a $ref refers to itself with nothing in between "
                             "(as {\"$ref\": \"#\"} does); make every recursive $ref go through a property or item.",
                             self.path) from None
        except referencing.exceptions.Unresolvable as error:
            raise InputError(f"has a $ref that cannot be resolved ({reason(error)}); fix the reference.",
                             self.path) from None


_PROBES: tuple[Any, ...] = (None, True, 0, 0.5, "", [], {}, [{}], {"a": []})


def _remote_ref(schema: Any) -> str | None:
    """The first `$ref` (or `$dynamicRef`) in `schema` that names another document than the schema itself."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("$ref", "$dynamicRef") and isinstance(value, str) and not value.startswith("#"):
                    return value
                stack.append(value)
        elif isinstance(node, list):
            stack.extend(node)
    return None


class PluginCapability(Capability):
    """A user function `(output, reference) -> float in [0, 1]`; `binary` if the function says so."""

    def __init__(self, spec: str, function: Callable[..., Any]) -> None:
        self.name = spec
        self.function = function
        self.binary = bool(getattr(function, "binary", False))
        self.needs_reference = bool(getattr(function, "needs_reference", False))
        self._repair = getattr(function, "repair", None)

    def score(self, output: str, reference: str | None) -> float:
        with plugin_code("the plug-in", "scoring an answer", path=self.name):
            try:
                value = self.function(output, reference)
            except Exception as error:
                raise InputError(f"the plug-in raised {type(error).__name__}: {reason(error)}; fix the plug-in.",
                                 self.name) from None
        return checked_score(value, self.binary, "the plug-in", self.name)

    def repair(self, output: str, reference: str) -> str | None:
        if not callable(self._repair):
            return None
        with plugin_code("the plug-in", "repairing an answer", path=self.name):
            return checked_repair(self._repair(output, reference), "the plug-in", self.name)


def _import_plugin(module_name: str, function_name: str, spec: str) -> Callable[..., Any]:
    with plugin_code("the plug-in", "loading", path=module_name if module_name.endswith(".py") else spec):
        try:
            if module_name.endswith(".py"):
                module = _import_file(Path(module_name))
            else:
                module = importlib.import_module(module_name)
        except InputError:
            raise
        except Exception as error:
            raise InputError(f"the plug-in module could not be imported ({type(error).__name__}: {error}); "
                             "check it is on PYTHONPATH.", spec) from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise InputError(f"the module {module_name} has no function {function_name}.", spec)
    return function


def _import_file(path: Path) -> Any:
    if not path.is_file():
        raise InputError("no such plug-in file.", path)
    module_spec = importlib.util.spec_from_file_location(f"gradian_plugin_{path.stem}", path)
    if module_spec is None or module_spec.loader is None:
        raise InputError("cannot be imported as a Python module.", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


BUILT_IN = frozenset(_REGISTRY)  # every name registered above, before any plug-in
