"""Overhead of `GradianCallback(capture=True)` on a training step, as a ratio measured in one process.

Two shapes, random weights built from a config (nothing is downloaded): the tests' tiny Llama, and SmolLM2-135M's
shape (30 layers, hidden 576, 9 heads / 3 KV heads, vocabulary 49,152). Each trains the same rows with real TRL
`SFTTrainer` + LoRA (r=8 on q, k, v, o), bf16 off, batch 4, rows of ~60 tokens, `STEPS` optimizer steps: once with
`GradianCallback(capture=False)` (preflight and record only) and once with `capture=True` (default projection,
8,192 floats per row, float16 store), alternating `REPEATS` times. The run's step time is the mean step from the
first `on_step_begin` after `WARMUP` steps to the end of training, after the callback's own `on_train_end` (forward,
backward, the capture's hooks and projection, the update, and every store write, the last one included: capture
writes its kept steps every `CHUNK_STEPS` steps, so the tiny run takes two chunks and the SmolLM2-shaped run, ten
steps of seconds each, writes once at its end). The ratio is the median over repeats of capture ÷ plain (goal
≤ 1.20): preflight and model building are once per run and stay out of it. Prints a table and writes
benchmarks/results/capture_overhead.json.

    PYTHONPATH=src:tests python -m benchmarks.speed.capture_overhead [--repeats 3] [--shapes tiny smollm2_135m_shape]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import LlamaConfig, LlamaForCausalLM, PrinterCallback, TrainerCallback
from trl import SFTConfig, SFTTrainer

from callback_runs import ticket
from conftest import WORDS
from gradian import GradianCallback
from gradian.callback.capture import CHUNK_STEPS
from gradian.scenarios.tokenizer import build_tokenizer

RESULTS = Path(__file__).resolve().parents[1] / "results" / "capture_overhead.json"
WARMUP, REPEATS = 2, 3
STEPS = {"tiny": 2 * CHUNK_STEPS + WARMUP, "smollm2_135m_shape": 10}
SHAPES = {
    "tiny": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2),
    "smollm2_135m_shape": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                               num_key_value_heads=3, vocab_size=49152),
}


class StepTimer(TrainerCallback):
    """The mean step after `WARMUP`, to the end of training (listed after GradianCallback: its last write inside)."""

    def __init__(self) -> None:
        self.marks: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.marks.append(time.perf_counter())

    def on_train_end(self, args, state, control, **kwargs):
        self.marks.append(time.perf_counter())

    def mean_step(self) -> float:
        return (self.marks[-1] - self.marks[WARMUP]) / (len(self.marks) - 1 - WARMUP)


def run(shape: dict, tokenizer, capture: bool, steps: int) -> float:
    settings = {"vocab_size": len(tokenizer), "max_position_embeddings": 256, "tie_word_embeddings": False,
                "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
                "pad_token_id": tokenizer.pad_token_id, **shape}
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**settings))
    rows = [{k: v for k, v in ticket(i, long=True).items() if k != "id"} for i in range(4 * steps)]
    timer = StepTimer()
    with tempfile.TemporaryDirectory() as out:
        config = SFTConfig(output_dir=out, report_to="none", use_cpu=True, disable_tqdm=True, bf16=False,
                           per_device_train_batch_size=4, max_steps=steps, save_strategy="no", max_length=128,
                           dataloader_num_workers=0)
        trainer = SFTTrainer(model=model, args=config, train_dataset=Dataset.from_list(rows),
                             processing_class=tokenizer,
                             peft_config=LoraConfig(task_type="CAUSAL_LM", r=8, lora_alpha=16, lora_dropout=0.0,
                                                    target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
                             callbacks=[GradianCallback(capture=capture, on_critical="warn", echo=lambda _: None),
                                        timer])
        trainer.remove_callback(PrinterCallback)
        trainer.train()
        return timer.mean_step()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    options = parser.parse_args()
    tokenizer = build_tokenizer(WORDS)
    results = {}
    for name in options.shapes:
        plain, captured = [], []
        for _ in range(options.repeats):
            plain.append(run(SHAPES[name], tokenizer, False, STEPS[name]))
            captured.append(run(SHAPES[name], tokenizer, True, STEPS[name]))
            print(f"{name}: plain {plain[-1]:.2f} s, capture {captured[-1]:.2f} s", flush=True)
        ratio = statistics.median(c / p for c, p in zip(captured, plain, strict=True))
        results[name] = {"steps": STEPS[name], "warmup": WARMUP, "chunk_steps": CHUNK_STEPS, "plain_step_s": plain,
                         "capture_step_s": captured, "ratio": round(ratio, 3)}
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print("| shape | plain step (s) | step with capture (s) | ratio |\n|---|---|---|---|")
    for name, row in results.items():
        print(f"| {name} | {statistics.median(row['plain_step_s']):.3f} | {statistics.median(row['capture_step_s']):.3f} | "
              f"{row['ratio']} |")


if __name__ == "__main__":
    main()
