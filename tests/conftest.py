"""Shared fixtures: a tiny word-level tokenizer, tiny Llama models from a seed, an isolated home."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
import torch
from filelock import FileLock
from transformers import LlamaConfig, LlamaForCausalLM

from gradian.scenarios.tokenizer import build_tokenizer

WORDS = "refund order invoice currency amount shipping account please my the is was late hello help need a for".split()


@pytest.fixture(autouse=True)
def isolated_home(tmp_path_factory, monkeypatch):
    """No test reads or writes the user's caches, and nothing may reach a hub."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HF_HOME", str(home / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("WANDB_DISABLED", "true")
    yield home


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return build_tokenizer(WORDS)


def make_tiny_model(tokenizer, seed: int = 0, dtype: torch.dtype = torch.float32, **overrides) -> LlamaForCausalLM:
    """A ~100k-parameter Llama over `tokenizer`'s vocabulary, weights drawn from `seed`."""
    settings = dict(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    settings.update(overrides)
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**settings)).to(dtype)


@pytest.fixture
def tiny_model(tiny_tokenizer):
    return make_tiny_model(tiny_tokenizer)


def _scenario_code_hash() -> str:
    import gradian.scenarios

    digest = hashlib.sha256()
    for path in sorted(Path(gradian.scenarios.__file__).parent.glob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


@pytest.fixture(scope="session")
def scenario(request):
    """`scenario(name, seed)`: a built scenario folder, kept in pytest's cache while the scenario code is unchanged.

    Every test module shares it, so each scenario is fine-tuned once per machine (seconds to minutes on 2 cores).
    `GRADIAN_TEST_SCENARIOS=DIR` shares one cache between checkouts; a lock per scenario keeps two runs from
    building the same one at once.
    """
    shared = os.environ.get("GRADIAN_TEST_SCENARIOS")
    cache = Path(shared) if shared else Path(request.config.cache.mkdir("gradian-scenarios"))
    key = _scenario_code_hash()

    def get(name: str, seed: int = 0) -> Path:
        folder = cache / "built" / f"{name}-seed{seed}-{key}"
        folder.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(f"{folder}.lock"):
            if not (folder / "measured.json").exists():
                _build(name, seed, folder, cache, drop_stale=not shared)
        return folder

    return get


def _build(name: str, seed: int, folder: Path, cache: Path, *, drop_stale: bool) -> None:
    from gradian.scenarios import build

    if drop_stale:
        for stale in folder.parent.glob(f"{name}-seed{seed}-*"):  # builds of older scenario code
            if stale.suffix != ".lock":
                shutil.rmtree(stale, ignore_errors=True)
    staging = folder.with_name(folder.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    build(name, staging, seed, cache_dir=cache)
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)


@pytest.fixture(scope="session")
def attributed(scenario, tmp_path_factory, worker_id):
    """`attributed(name, seed)`: the report folder of a default `attribute` of a built scenario, made once per test
    run and shared by its workers (a lock per scenario). Read it; a test that writes (verify, another query into the
    same folder) copies it first (`attributed_copy`)."""
    from gradian import attribute
    from gradian.scenarios import attribute_settings

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if worker_id != "master" else base) / "attributed"  # this run's, shared by its workers
    root.mkdir(parents=True, exist_ok=True)

    def get(name: str, seed: int = 0) -> Path:
        folder, out = scenario(name, seed), root / f"{name}-seed{seed}"
        with FileLock(f"{out}.lock"):
            if not (out / "attributed.done").exists():
                shutil.rmtree(out, ignore_errors=True)
                attribute(attribute_settings(folder, out))
                (out / "attributed.done").touch()
        return out

    return get


@pytest.fixture(scope="session")
def attributed_copy(attributed):
    """`attributed_copy(name, dest, seed=0)`: a private copy of `attributed(name, seed)` at `dest`, to write into."""

    def copy(name: str, dest: Path, seed: int = 0) -> Path:
        shutil.copytree(attributed(name, seed), dest, ignore=shutil.ignore_patterns("attributed.done"))
        return dest

    return copy


@pytest.fixture
def cli_runner():
    from click.testing import CliRunner

    return CliRunner()


def pytest_configure(config):
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_modifyitems(config, items):
    """The tests that read `verified` (six retrains, minutes) go first, in their order. xdist's worksteal hands each
    worker a contiguous half of the collection and steals from the end of a queue, so they all stay on the worker
    that builds the fixture: with them in the middle, one worker sat 270 s on the fixture's lock while the other
    retrained."""
    items.sort(key=lambda item: "verified" not in item.fixturenames)  # stable: the rest keep their order
