"""A valid tiny world (base model, LoRA adapter, run folder, datasets) that bad-input cases copy and damage.

Built once per test session into a temporary folder: a ~100k-parameter Llama over the word-level test
tokenizer, a PEFT LoRA adapter on q_proj/v_proj with non-zero weights, a run folder with trainer_state.json,
and small train/eval datasets in the JSON-formatting task the tiny model can be asked about.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from gradian.scenarios.tokenizer import build_tokenizer

WORDS = ("refund order invoice currency amount shipping account please my the is was late hello help need a for "
         "json name id true false null").split()


@dataclass(frozen=True)
class Workspace:
    """Paths of the valid inputs; `root` is private to one session, `scratch(name)` gives a fresh folder."""

    root: Path
    model: Path
    adapter: Path
    run: Path
    dataset: Path
    eval_dataset: Path

    def scratch(self, name: str) -> Path:
        folder = self.root / "cases" / name
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        return folder

    def copy_model(self, name: str) -> Path:
        target = self.scratch(name) / "model"
        shutil.copytree(self.model, target)
        return target

    def copy_adapter(self, name: str) -> Path:
        target = self.scratch(name) / "adapter"
        shutil.copytree(self.adapter, target)
        return target

    def copy_run(self, name: str) -> Path:
        target = self.scratch(name) / "run"
        shutil.copytree(self.run, target)
        return target


def tiny_model(tokenizer, seed: int = 0, **overrides):
    """The conftest factory's tiny Llama (imported lazily: conftest is only importable under pytest)."""
    from conftest import make_tiny_model

    return make_tiny_model(tokenizer, seed=seed, **overrides)


def save_adapter(model, folder: Path, seed: int = 1) -> Path:
    """A LoRA adapter (r=2, q_proj/v_proj, random non-zero B) on `model`, saved to `folder`."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    peft_model = get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"],
                                                  init_lora_weights=False))
    peft_model.save_pretrained(folder)
    return folder


def train_rows(n: int = 8) -> list[dict]:
    words = ["refund", "order", "invoice", "amount", "account", "shipping", "currency", "help"]
    return [{"id": f"t{i}", "prompt": f"please json for my {words[i % len(words)]}",
             "completion": f'{{"name": "{words[(i + 1) % len(words)]}", "id": {i % 10}}}'} for i in range(n)]


def eval_rows(n: int = 4) -> list[dict]:
    words = ["refund", "order", "invoice", "amount"]
    return [{"id": f"e{i}", "prompt": f"json for the {words[i % len(words)]}",
             "completion": f'{{"name": "{words[i % len(words)]}", "id": {i}}}'} for i in range(n)]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def build_workspace(root: Path) -> Workspace:
    """Write the valid world under `root` (a few hundred KB, about a second on CPU)."""
    tokenizer = build_tokenizer(WORDS)
    model_dir, run_dir = root / "base", root / "run"
    base = tiny_model(tokenizer, seed=0)
    base.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    adapter_dir = save_adapter(tiny_model(tokenizer, seed=0), root / "adapter")
    shutil.copytree(adapter_dir, run_dir)
    state = {"global_step": 4, "num_train_epochs": 2, "train_batch_size": 4,
             "log_history": [{"step": s, "epoch": s / 2, "loss": 2.0 - 0.1 * s, "learning_rate": 1e-4}
                             for s in range(1, 5)]}
    (run_dir / "trainer_state.json").write_text(json.dumps(state), encoding="utf-8")
    dataset = write_jsonl(root / "train.jsonl", train_rows())
    eval_dataset = write_jsonl(root / "eval.jsonl", eval_rows())
    return Workspace(root, model_dir, adapter_dir, run_dir, dataset, eval_dataset)
