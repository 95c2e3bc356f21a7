"""Read the fields of `training_args.bin` without ever running its code.

`training_args.bin` is `torch.save(TrainingArguments)`: a pickle, and unpickling a pickle can run any
callable it names. Gradian reads it with an unpickler whose `find_class` imports nothing: every global
the file names becomes an inert `Placeholder` that records its arguments and state, except a tiny
allow-list of side-effect-free builtins. The result is converted to plain dicts, lists and scalars
(an enum such as `IntervalStrategy("steps")` becomes `"steps"`).
"""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path
from typing import Any

from gradian.errors import InputError

# Globals that build plain data and have no side effects; everything else becomes a Placeholder.
SAFE_GLOBALS: dict[tuple[str, str], Any] = {
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "list"): list,
    ("builtins", "dict"): dict,
    ("builtins", "tuple"): tuple,
    ("builtins", "int"): int,
    ("builtins", "float"): float,
    ("builtins", "str"): str,
    ("builtins", "bool"): bool,
    ("builtins", "complex"): complex,
    ("collections", "OrderedDict"): dict,
    ("__builtin__", "set"): set,
}
MAX_BYTES = 64 * 1024 * 1024


class Placeholder:
    """Stands in for any object the pickle names: keeps its class name, arguments and state, runs nothing."""

    qualname = "?"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs
        self.state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state

    # NEWOBJ calls cls.__new__(cls, *args) and never __init__: keep the arguments there too.
    def __new__(cls, *args: Any, **kwargs: Any) -> Placeholder:
        instance = super().__new__(cls)
        instance.args = args
        instance.kwargs = kwargs
        instance.state = None
        return instance

    def __call__(self, *args: Any, **kwargs: Any) -> Placeholder:  # a placeholder used as a callable
        return _placeholder_class(self.qualname + "()")(*args, **kwargs)


def _placeholder_class(qualname: str) -> type[Placeholder]:
    return type("Placeholder", (Placeholder,), {"qualname": qualname})


def _reconstructor(cls: Any, base: Any, state: Any = None) -> Placeholder:
    """Safe stand-in for `copyreg._reconstructor` (protocol 0/1 objects)."""
    qualname = getattr(cls, "qualname", "?")
    return _placeholder_class(qualname)()


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that cannot execute code: no import, no call of anything it has not built itself."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in SAFE_GLOBALS:
            return SAFE_GLOBALS[(module, name)]
        if (module, name) == ("copyreg", "_reconstructor"):
            return _reconstructor
        return _placeholder_class(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> str:
        return "<tensor>"  # torch.save stores tensors out of band; the arguments never need them


def read_training_args(path: str | Path) -> dict[str, Any]:
    """The fields of a `training_args.bin` (zip or legacy pickle), as plain data.

    Raises `InputError` naming the file when it is not a pickle Gradian can read; runs no code either way.
    """
    path = Path(path)
    try:
        data = _pickle_bytes(path)
        value = SafeUnpickler(io.BytesIO(data)).load()
    except InputError:
        raise
    except Exception as error:  # any malformed pickle: report, never run anything
        raise InputError(f"could not read it as a training-arguments pickle ({type(error).__name__}).", path) from None
    plain = to_plain(value)
    if not isinstance(plain, dict):
        raise InputError("holds no training arguments (expected a pickled TrainingArguments object).", path)
    return plain


def _pickle_bytes(path: Path) -> bytes:
    if not path.is_file():
        raise InputError("is not a regular file; the run folder looks damaged.", path)
    if path.stat().st_size > MAX_BYTES:
        raise InputError("is too large to be training arguments.", path)
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            names = [name for name in archive.namelist() if name.endswith("data.pkl")]
            if not names:
                raise InputError("is a zip file without data.pkl; not a torch.save file.", path)
            return archive.read(names[0])
    return path.read_bytes()


def to_plain(value: Any, depth: int = 0) -> Any:
    """Placeholders → dicts of their state (enums → their value); containers recursively; scalars as is."""
    if depth > 20:
        return None
    if isinstance(value, Placeholder):
        return _placeholder_plain(value, depth)
    if isinstance(value, dict):
        return {str(key): to_plain(item, depth + 1) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_plain(item, depth + 1) for item in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


def _placeholder_plain(value: Placeholder, depth: int) -> Any:
    state = value.state
    if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict):
        state = {**(state[0] or {}), **state[1]}  # (dict state, slots state)
    if isinstance(state, dict):
        fields = to_plain(state, depth + 1)
        fields.setdefault("__class__", value.qualname)
        return fields
    if len(value.args) == 1 and isinstance(value.args[0], (str, int, float, bool)):
        return value.args[0]  # an Enum member, torch.device("cpu"), ...
    return f"<{value.qualname}>"
