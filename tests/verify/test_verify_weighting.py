"""Removal by zero loss weight (`gradian.verify.weighting`) on a tiny Llama, with real TRL SFTTrainer + PEFT LoRA.

- nothing removed: the retrain is the plain TRL run bit for bit (same seed, same order, same steps);
- rows removed: the retrain equals a reference loop in float64 that replays the recorded order and drops those
  rows' token NLL from each step's sum while still dividing by every supervised token of the step (tolerance: the
  retrain runs in float32, the reference in float64, through ten AdamW steps);
- a recorded order replayed through the sampler reproduces the run bit for bit.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model_state_dict
from safetensors.torch import load_file
from transformers import get_scheduler

from conftest import WORDS, make_tiny_model
from gradian.data.base_model import BaseModelRef, resolve_base_model
from gradian.data.examples import read_dataset
from gradian.scenarios.base import one_thread
from gradian.verify.recipe import Recipe, training_kwargs
from gradian.verify.retrain import ORDER, Retrain, build_trainer, retrain

ROWS = 27  # batch 3 × accumulation 2: 9 micro-batches an epoch, so each epoch ends in a one-batch step
RECIPE = Recipe(
    training={"per_device_train_batch_size": 3, "gradient_accumulation_steps": 2, "num_train_epochs": 2,
              "learning_rate": 0.02, "lr_scheduler_type": "linear", "warmup_steps": 1, "max_grad_norm": 1.0,
              "weight_decay": 0.0, "optim": "adamw_torch", "max_length": 32, "completion_only_loss": True,
              "bf16": False},
    lora={"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj", "down_proj"]},
    seed=3)


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_tokenizer):
    """A tiny base model folder and a 27-row prompt/completion file."""
    root = tmp_path_factory.mktemp("weighting")
    make_tiny_model(tiny_tokenizer).save_pretrained(root / "base")
    tiny_tokenizer.save_pretrained(root / "base")
    rng = np.random.default_rng(0)
    lines = []
    for i in range(ROWS):
        prompt = " ".join(rng.choice(WORDS, size=int(rng.integers(2, 6))))
        completion = " ".join(rng.choice(WORDS, size=int(rng.integers(1, 8))))
        lines.append(json.dumps({"id": f"r{i}", "prompt": prompt, "completion": " " + completion}))
    (root / "train.jsonl").write_text("\n".join(lines) + "\n")
    return root, resolve_base_model(str(root / "base")), read_dataset(root / "train.jsonl")


def adapter(folder) -> dict[str, torch.Tensor]:
    return load_file(folder / "adapter_model.safetensors")


def plain_trl_run(root, base, rows, callbacks=(), out="plain") -> dict[str, torch.Tensor]:
    """The run as a user trains it: TRL SFTTrainer with the recipe, no Gradian class in the loop (but `callbacks`)."""
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    config = SFTConfig(output_dir=str(root / out), report_to="none", save_strategy="no", seed=RECIPE.seed,
                       use_cpu=True, disable_tqdm=True, **training_kwargs(RECIPE))
    trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(base.path, dtype=torch.float32), args=config,
                         train_dataset=datasets.Dataset.from_list([e.fields for e in rows]),
                         processing_class=AutoTokenizer.from_pretrained(base.path),
                         peft_config=LoraConfig(task_type="CAUSAL_LM", **RECIPE.lora), callbacks=list(callbacks))
    trainer.train()
    trainer.save_model(str(root / out))
    return adapter(root / out)


@pytest.fixture(scope="module")
def nothing_removed(world):
    root, base, rows = world
    with one_thread():
        folder, _ = retrain(Retrain("nothing", rows, RECIPE.seed, zero_ids=frozenset()), RECIPE, base, root / "verify")
    return folder


def test_nothing_removed_is_the_plain_run_bit_for_bit(world, nothing_removed):
    root, base, rows = world
    with one_thread():
        plain = plain_trl_run(root, base, rows)
    ours = adapter(nothing_removed)
    assert sorted(ours) == sorted(plain)
    assert all(torch.equal(ours[k], plain[k]) for k in plain), "a zero-weight retrain removing nothing must be the run"
    order = json.loads((nothing_removed / ORDER).read_text())
    assert [len(step) for step in order] == [6, 6, 6, 6, 3] * 2  # 5 steps an epoch, the last one a single batch
    assert sorted(i for step in order[:5] for i in step) == list(range(ROWS))  # every row once an epoch


def test_a_recorded_order_replays_bit_for_bit(world, nothing_removed):
    root, base, rows = world
    order = json.loads((nothing_removed / ORDER).read_text())
    shifted = [order[5:], order[:5]]  # the epochs swapped: another order, so the replay cannot be a coincidence
    with one_thread():
        replayed, _ = retrain(Retrain("replayed", rows, RECIPE.seed, order=order), RECIPE, base, root / "verify")
        swapped, _ = retrain(Retrain("swapped", rows, RECIPE.seed, order=shifted[0] + shifted[1]), RECIPE, base,
                             root / "verify")
    assert json.loads((replayed / ORDER).read_text()) == order
    assert all(torch.equal(adapter(replayed)[k], v) for k, v in adapter(nothing_removed).items())
    assert json.loads((swapped / ORDER).read_text()) == shifted[0] + shifted[1]
    assert not all(torch.equal(adapter(swapped)[k], v) for k, v in adapter(nothing_removed).items())


def reference_loop(trainer, order: list[list[int]], removed: set[int]) -> dict[str, torch.Tensor]:
    """Float64 SGD-by-AdamW over `order`: per step, Σ NLL of the kept rows' tokens ÷ every supervised token."""
    model = trainer.model.double()
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    args = trainer.args
    optimizer = torch.optim.AdamW(params, lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2),
                                  eps=args.adam_epsilon, weight_decay=args.weight_decay)
    schedule = get_scheduler(args.lr_scheduler_type, optimizer, num_warmup_steps=args.warmup_steps,
                             num_training_steps=len(order))
    dataset, collate, size = trainer.train_dataset, trainer.data_collator, args.per_device_train_batch_size
    for step in order:
        batches = [collate([dataset[i] for i in step[j:j + size]]) for j in range(0, len(step), size)]
        supervised = sum(int((b["labels"][:, 1:] != -100).sum()) for b in batches)  # every row's tokens
        for batch in batches:
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits  # (B, T, V)
            labels = batch["labels"][:, 1:]  # (B, T-1)
            nll = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), labels.clamp(min=0),
                                                    reduction="none")  # (B, T-1)
            kept = (labels != -100) & torch.tensor([r not in removed for r in batch["gradian_row"].tolist()])[:, None]
            (nll[kept].sum() / supervised).backward()
        torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
    return {k: v.detach() for k, v in get_peft_model_state_dict(model).items()}


def test_rows_removed_match_a_float64_loop_that_masks_their_loss(world, nothing_removed):
    root, base, rows = world
    removed_ids = {e.id for e in rows[::4]}  # 7 rows
    job = Retrain("removed", rows, RECIPE.seed, zero_ids=frozenset(removed_ids))
    with one_thread():
        folder, marker = retrain(job, RECIPE, base, root / "verify")
        order = json.loads((folder / ORDER).read_text())
        reference = reference_loop(build_trainer(job, RECIPE, base, root / "reference"), order, job.zero_rows())
    assert marker["zero_weight"] == 7 and marker["rows"] == ROWS - 7 and marker["global_step"] == 10
    assert order == json.loads((nothing_removed / ORDER).read_text()), "zero weight keeps the data order"
    ours, full = adapter(folder), adapter(nothing_removed)
    assert sorted(ours) == sorted(reference)
    gap = max(float((ours[k].double() - reference[k]).abs().max()) for k in ours)
    moved = max(float((ours[k] - full[k]).abs().max()) for k in ours)
    assert gap < 1e-5, gap
    assert moved > 1e-3, "removing 7 of 27 rows must change the adapter far beyond the tolerance"


def test_the_order_a_gradian_callback_recorded_replays_the_run_bit_for_bit(world):
    """verify's retrains replay gradian_run.json's order: the recorded run's adapter, to the bit."""
    from gradian import GradianCallback
    from gradian.data.run_record import read_run_record

    root, base, rows = world
    with one_thread():
        recorded = plain_trl_run(root, base, rows, [GradianCallback(on_critical="warn")], out="recorded")
        order = read_run_record(root / "recorded").order
        assert order is not None and sorted(i for step in order[:5] for i in step) == list(range(ROWS))
        replayed, _ = retrain(Retrain("from-record", rows, RECIPE.seed, order=order), RECIPE, base, root / "verify")
    assert json.loads((replayed / ORDER).read_text()) == order
    assert all(torch.equal(adapter(replayed)[k], v) for k, v in recorded.items())


def test_a_run_that_appends_eos_after_the_cut_is_retrained_on_its_own_tokens(world):
    """`add_eos_token` with truncation (no SFTConfig field says it): a row past max_length is cut and still ends in
    a supervised EOS, as the run trained it; under a fix that raises max_length each row is TRL's own, whole."""
    root, base, rows = world
    limit = 14  # inside the completion of every row it cuts (prompts take at most 12 tokens)
    recipe = dataclasses.replace(RECIPE, training={**RECIPE.training, "max_length": limit}, eos_after_truncation=True)
    cut = build_trainer(Retrain("cut", rows, RECIPE.seed), recipe, base, root / "eos-cut").train_dataset
    fixed = build_trainer(Retrain("fixed", rows, RECIPE.seed, changes={"max_length": 64}), recipe, base,
                          root / "eos-fixed").train_dataset
    plain = build_trainer(Retrain("trl", rows, RECIPE.seed, changes={"max_length": 64}), RECIPE, base, root / "trl")
    trl, eos = plain.train_dataset, plain.processing_class.eos_token_id  # TRL's own tokens, nothing cut
    assert len(cut) == len(fixed) == len(trl) == ROWS
    n_cut = 0
    for mine, whole, reference in zip(cut, fixed, trl, strict=True):
        assert whole["input_ids"] == reference["input_ids"] and whole["labels"] == reference["labels"]
        ids, labels = reference["input_ids"], reference["labels"]
        if len(ids) > limit:
            ids, labels, n_cut = ids[: limit - 1] + [eos], labels[: limit - 1] + [eos], n_cut + 1  # cut, then EOS
        assert mine["input_ids"] == ids and mine["labels"] == labels and ids[-1] == labels[-1] == eos
    assert 0 < n_cut < ROWS


def test_a_retrains_key_changes_with_the_columns_the_trainer_reads(tmp_path):
    """TRL's preparation reads a row's own columns (`Example.raw`), not only Gradian's normalised `fields`: a row
    whose columns changed is another retrain, never the cached one."""
    from gradian.data.examples import Example

    fields = {"prompt": "p", "completion": '{"a": 1}'}
    row = Example("1", 1, fields, raw={**fields, "completion": '{"a": 1}</s>'})
    fixed = dataclasses.replace(row, raw=dict(fields))
    base = BaseModelRef("base", str(tmp_path))
    assert Retrain("r", [row], 0).key(RECIPE, None, base) != Retrain("r", [fixed], 0).key(RECIPE, None, base)
    assert Retrain("r", [row], 0).key(RECIPE, None, base) == Retrain("r", [dataclasses.replace(row)], 0).key(
        RECIPE, None, base)


def test_a_retrains_key_changes_with_the_base_it_trains_from(tmp_path):
    """A report attributed again on another base (or a base folder whose weights were replaced in place) is retrained:
    the cached adapter was trained from other weights."""
    from gradian.data.examples import Example

    folder = tmp_path / "base"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"one")
    job = Retrain("r", [Example("1", 1, {"prompt": "p", "completion": "c"})], 0)
    before = job.key(RECIPE, None, BaseModelRef("base", str(folder)))
    assert job.key(RECIPE, None, BaseModelRef("base", str(folder))) == before
    (folder / "model.safetensors").write_bytes(b"other weights")
    assert job.key(RECIPE, None, BaseModelRef("base", str(folder))) != before
    other = tmp_path / "other"
    shutil.copytree(folder, other, copy_function=shutil.copy2)
    assert job.key(RECIPE, None, BaseModelRef("base", str(other))) != job.key(RECIPE, None, BaseModelRef("base", str(folder)))
