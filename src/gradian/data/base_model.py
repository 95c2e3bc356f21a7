"""Where the base model lives: a local folder, a GGUF file, or a hub id already in the local HF cache.

Gradian never downloads: every load here runs with `local_files_only=True`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradian.errors import InputError, reason

# The files whose change makes a folder another model.
WEIGHT_FILES = ("config.json", "*.safetensors", "*.bin", "*.pt", "*.gguf", "tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True)
class BaseModelRef:
    """`path` is what `from_pretrained` takes; `gguf_file` is set for GGUF checkpoints."""

    spec: str
    path: str
    gguf_file: str | None = None

    def kwargs(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"local_files_only": True}
        if self.gguf_file:
            extra["gguf_file"] = self.gguf_file
        return extra

    def identity(self) -> dict[str, Any]:
        """What a cache of results from this base is keyed by: where it is, and each weight and config file's size
        and modification time, so a model replaced in place at the same path is another base (stat calls only)."""
        folder = Path(self.path)
        names = [self.gguf_file] if self.gguf_file else sorted(
            p.name for pattern in WEIGHT_FILES for p in folder.glob(pattern))
        files = []
        for name in names:
            try:
                stat = (folder / name).stat()
            except OSError:
                continue
            files.append([name, stat.st_size, stat.st_mtime_ns])
        return {"path": str(folder.resolve()), "files": files}


def loaded_identity(model: Any) -> dict[str, Any]:
    """The identity of the base `model` was loaded from, which caches of its answers and gradients are keyed by:
    its `BaseModelRef.identity`, kept on the model by `regression.loading.load_models`; a model loaded otherwise is
    known by its config's `name_or_path` alone."""
    kept = getattr(model, "gradian_base", None)
    if kept is not None:
        return dict(kept)
    return {"path": str(getattr(getattr(model, "config", None), "name_or_path", ""))}


def resolve_base_model(spec: str | Path) -> BaseModelRef:
    spec = str(spec)
    path = Path(spec)
    if path.is_file() and path.suffix == ".gguf":
        return BaseModelRef(spec, str(path.parent), path.name)
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if not (path / "config.json").exists() and len(ggufs) == 1:
            return BaseModelRef(spec, str(path), ggufs[0].name)
        if not (path / "config.json").exists():
            raise InputError("has no config.json (nor a single .gguf file); point --base-model at a model folder.",
                             path)
        return BaseModelRef(spec, str(path))
    if path.exists():
        raise InputError("is neither a model folder nor a .gguf file.", path)
    if spec.count("/") == 1 and not spec.startswith((".", "/")):
        return _from_cache(spec)
    raise InputError("no such model folder; give a local folder, a .gguf file or a hub id in the local cache.", spec)


def _from_cache(repo_id: str) -> BaseModelRef:
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(repo_id, local_files_only=True)
    except Exception:
        raise InputError(
            "is not in the local Hugging Face cache, and Gradian never downloads; "
            "download it first (huggingface-cli download) or give a local folder.",
            repo_id,
        ) from None
    return BaseModelRef(repo_id, folder)


def load_tokenizer(ref: BaseModelRef) -> Any:
    """The base model's tokenizer (fast), with its chat template."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(ref.path, **ref.kwargs())
    except Exception as error:
        raise InputError(f"could not load its tokenizer ({reason(error)}); is the folder complete?",
                         ref.spec) from None


def load_saved_tokenizer(folder: Path) -> Any:
    """The tokenizer a trainer saved beside its adapter (tokenizer_config.json, tokenizer.json, chat template).

    Loaded offline and without remote code: a `tokenizer_class` the folder names but transformers does not
    ship fails here instead of running. Raises `InputError` naming the folder when it cannot be loaded.
    """
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    except Exception as error:
        raise InputError(f"holds a tokenizer that could not be loaded ({reason(error)}).", folder) from None


def load_config(ref: BaseModelRef) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(ref.path, **ref.kwargs())
    except Exception as error:
        raise InputError(f"could not read its config ({reason(error)}).", ref.spec) from None
