"""TracIn-CP equals a naive float64 sum over checkpoints; weights follow the logged learning rate; bad input is refused."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file

from conftest import make_tiny_model
from gradian.data.render import IGNORE, Rendered
from gradian.errors import InputError
from gradian.gradients.extract import extract_train_features
from gradian.gradients.point import restored_weights
from gradian.gradients.settings import GradientSettings
from gradian.scores.queries import QueryPair
from gradian.scores.tracin import checkpoint_weights, load_checkpoint, tracin_cp_effects

torch.set_num_threads(2)

EXACT = GradientSettings(proj_dim=None, store_dtype="float32")
STEPS = (4, 8, 10)
PAIRS = [QueryPair("a", [5, 6, 7], [8, 9, 10, 2], [8, 9, 12, 2]), QueryPair("b", [6, 5], [9, 8, 2], [11, 2])]


def lr(step: int) -> float:
    return 0.01 * (1 - step / 10)


def trainer_state(log_every: int = 2, last: int = 10) -> dict:
    """A linearly decaying schedule logged every `log_every` steps, plus rows without a learning rate."""
    log = [{"step": s, "learning_rate": lr(s), "loss": 1.0} for s in range(log_every, last + 1, log_every)]
    return {"global_step": last, "log_history": [*log, {"step": 6, "eval_loss": 0.5}, {"step": last, "train_loss": 1}]}


def lora(tokenizer, r: int = 2):
    base = make_tiny_model(tokenizer, seed=4, dtype=torch.float64)
    return get_peft_model(base, LoraConfig(r=r, target_modules="all-linear", init_lora_weights=False))


def perturbed(model, seed: int):
    """A copy of `model` whose LoRA weights moved by a seeded random step (a checkpoint of the same run)."""
    other = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in other.named_parameters():
            if "lora_" in name:
                param.add_(0.3 * torch.randn(param.shape, generator=generator, dtype=param.dtype))
    return other


@pytest.fixture
def run(tmp_path, tiny_tokenizer):
    """(final model, checkpoint models, run folder): checkpoint-N/ saved with save_pretrained."""
    model = lora(tiny_tokenizer)
    saved = []
    for seed, step in enumerate(STEPS):
        checkpoint = perturbed(model, seed)
        checkpoint.save_pretrained(tmp_path / "run" / f"checkpoint-{step}")
        saved.append(checkpoint)
    (tmp_path / "run" / "trainer_state.json").write_text(json.dumps(trainer_state()))
    return model, saved, tmp_path / "run"


def rendered_rows(vocab: int, lengths=(6, 3, 9, 5)) -> list[Rendered]:
    generator = torch.Generator().manual_seed(1)
    rows = []
    for i, n in enumerate(lengths):
        ids = torch.randint(4, vocab, (n,), generator=generator).tolist()
        rows.append(Rendered(f"r{i}", ids, [IGNORE] * 2 + ids[2:], n, 2))
    return rows


def log_prob(model, ids: list[int], labels: list[int]) -> torch.Tensor:
    """Σ log p(token) over the supervised tokens of one unpadded row."""
    logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, :-1], dim=-1)  # (T-1, V)
    target = torch.tensor(labels[1:])
    keep = target != IGNORE
    return logp[torch.arange(len(ids) - 1)[keep], target[keep]].sum()


def answer_log_prob(model, prompt: list[int], answer: list[int]) -> torch.Tensor:
    return log_prob(model, prompt + answer, [IGNORE] * len(prompt) + answer)


def flat_grad(model, value: torch.Tensor) -> np.ndarray:
    params = [p for name, p in model.named_parameters() if "lora_" in name]
    return torch.cat([g.flatten() for g in torch.autograd.grad(value, params)]).numpy()


def naive_effects(model, rows: list[Rendered], kind: str, unit_norm_train: bool) -> np.ndarray:
    """(Q, N) −q̂·g_i at one set of weights, with one autograd call per example and per answer."""
    model.eval()
    grads = np.stack([flat_grad(model, -log_prob(model, r.input_ids, r.labels)) for r in rows])  # (N, k) ∇NLL
    if unit_norm_train:
        grads /= np.linalg.norm(grads, axis=1, keepdims=True)
    queries = []
    for pair in PAIRS:
        f = answer_log_prob(model, pair.prompt_ids, pair.positive_ids)
        if kind == "contrastive":
            f = f - answer_log_prob(model, pair.prompt_ids, pair.negative_ids)
        q = flat_grad(model, f)
        queries.append(q / np.linalg.norm(q))
    return -np.stack(queries) @ grads.T


def state(model) -> dict[str, bytes]:
    return {key: value.detach().numpy().tobytes() for key, value in model.state_dict().items()}


@pytest.mark.parametrize("kind,unit_norm_train", [("contrastive", True), ("naive", False)])
def test_tracin_cp_equals_naive_sum_over_checkpoints(run, tiny_tokenizer, tmp_path, kind, unit_norm_train):
    model, saved, folder = run
    rows = rendered_rows(len(tiny_tokenizer))
    checkpoints = checkpoint_weights(folder)
    got = tracin_cp_effects(model, rows, PAIRS, checkpoints, tmp_path / "stores", settings=EXACT, kind=kind,
                            unit_norm_train=unit_norm_train)
    weights = [c.weight for c in checkpoints]
    expected = sum(w * naive_effects(m, rows, kind, unit_norm_train) for w, m in zip(weights, saved, strict=True))
    expected /= sum(weights)
    assert got.shape == (len(PAIRS), len(rows))
    assert np.allclose(got, expected, rtol=1e-5, atol=1e-7)
    final = naive_effects(model, rows, kind, unit_norm_train)
    assert not np.allclose(got, final, rtol=1e-3)  # the checkpoints, not the final weights, were used
    assert {p.name for p in (tmp_path / "stores").iterdir()} == {f"checkpoint-{s}" for s in STEPS}


def test_a_checkpoint_with_the_final_weights_reads_the_final_store(run, tiny_tokenizer, tmp_path):
    model, _, folder = run
    rows, checkpoints = rendered_rows(len(tiny_tokenizer)), checkpoint_weights(folder)
    fresh = tracin_cp_effects(model, rows, PAIRS, checkpoints, tmp_path / "fresh", settings=EXACT, kind="contrastive")
    with restored_weights(model):
        load_checkpoint(model, checkpoints[-1])  # the final adapter is the last checkpoint, as a trainer saves it
        final = extract_train_features(model, rows, tmp_path / "final", settings=EXACT)
        reused = tracin_cp_effects(model, rows, PAIRS, checkpoints, tmp_path / "reused", settings=EXACT,
                                   kind="contrastive", final_store=final)
        other = extract_train_features(model, rows, tmp_path / "other", settings=GradientSettings(proj_dim=64))
        tracin_cp_effects(model, rows, PAIRS, checkpoints, tmp_path / "unused", settings=EXACT, kind="contrastive",
                          final_store=other)  # other settings: not the same features, so extracted again
    assert np.allclose(reused, fresh, rtol=1e-12, atol=1e-14)
    assert {p.name for p in (tmp_path / "reused").iterdir()} == {f"checkpoint-{s}" for s in STEPS[:-1]}
    assert {p.name for p in (tmp_path / "unused").iterdir()} == {f"checkpoint-{s}" for s in STEPS}


def test_final_weights_come_back_byte_equal(run, tiny_tokenizer, tmp_path):
    model, _, folder = run
    before = state(model)
    tracin_cp_effects(model, rendered_rows(len(tiny_tokenizer)), PAIRS, checkpoint_weights(folder), tmp_path / "s",
                      settings=EXACT, kind="contrastive-first")
    assert state(model) == before
    with restored_weights(model):
        load_checkpoint(model, checkpoint_weights(folder)[0])
        assert state(model) != before
    assert state(model) == before


def test_weights_integrate_the_logged_learning_rate(tmp_path):
    for step in (10, 4, 8):  # folder order is not step order
        (tmp_path / f"checkpoint-{step}").mkdir()
        save_file({"x": torch.zeros(1)}, str(tmp_path / f"checkpoint-{step}" / "adapter_model.safetensors"))
    (tmp_path / "trainer_state.json").write_text(json.dumps(trainer_state()))
    # lr(t) for t = 1..10, held at the first logged value (step 2) before it: steps (0,4], (4,8], (8,10]
    per_step = [lr(2), lr(2)] + [lr(t) for t in range(3, 11)]
    expected = [sum(per_step[0:4]), sum(per_step[4:8]), sum(per_step[8:10])]
    got = checkpoint_weights(tmp_path)
    assert [c.step for c in got] == [4, 8, 10]
    assert [c.steps for c in got] == [4, 4, 2]
    assert np.allclose([c.weight for c in got], expected, rtol=1e-12)
    assert np.allclose([c.mean_lr * c.steps for c in got], expected, rtol=1e-12)


def test_weights_read_the_newest_checkpoint_state_without_a_root_state(tmp_path):
    for step, last in ((3, 3), (6, 6)):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        save_file({"x": torch.zeros(1)}, str(folder / "adapter_model.safetensors"))
        (folder / "trainer_state.json").write_text(json.dumps(trainer_state(log_every=1, last=last)))
    got = checkpoint_weights(tmp_path)
    assert np.allclose([c.weight for c in got], [sum(lr(t) for t in range(1, 4)), sum(lr(t) for t in range(4, 7))])


def test_missing_or_damaged_files_are_refused(run):
    _, _, folder = run
    (folder / "checkpoint-8" / "adapter_model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(InputError, match="checkpoint-8"):
        checkpoint_weights(folder)
    (folder / "checkpoint-8" / "adapter_model.safetensors").unlink()
    with pytest.raises(InputError, match="checkpoint-8.*has no adapter_model.safetensors"):
        checkpoint_weights(folder)
    (folder / "checkpoint-8").rename(folder / "elsewhere")
    (folder / "trainer_state.json").write_text(json.dumps({"log_history": [{"step": 3, "loss": 1.0}]}))
    with pytest.raises(InputError, match="trainer_state.json.*learning_rate"):
        checkpoint_weights(folder)
    (folder / "trainer_state.json").write_text("{not json")
    with pytest.raises(InputError, match="trainer_state.json"):
        checkpoint_weights(folder)


def test_checkpoint_of_another_adapter_is_refused_and_weights_restored(run, tiny_tokenizer, tmp_path):
    model, _, folder = run
    lora(tiny_tokenizer, r=3).save_pretrained(folder / "checkpoint-8")  # other shapes at step 8
    before = state(model)
    checkpoints = checkpoint_weights(folder)
    with pytest.raises(InputError, match="checkpoint-8.*does not fit"):
        load_checkpoint(model, checkpoints[1])
    with pytest.raises(InputError, match="checkpoint-8"):
        tracin_cp_effects(model, rendered_rows(len(tiny_tokenizer)), PAIRS, checkpoints, tmp_path / "s",
                          settings=EXACT, kind="contrastive")
    assert state(model) == before
    assert not (tmp_path / "s").exists()  # refused before any gradient was computed
    partial = {k: v for k, v in lora(tiny_tokenizer).state_dict().items() if "lora_A" in k}
    save_file({k.replace(".default", ""): v.contiguous() for k, v in partial.items()},
              str(folder / "checkpoint-8" / "adapter_model.safetensors"))  # lora_B missing
    with pytest.raises(InputError, match="lacks the adapter weight"):
        load_checkpoint(model, checkpoints[1])


def test_a_run_record_weighs_each_checkpoint_by_the_learning_rates_it_recorded(run, tmp_path):
    """With gradian_run.json, η_c is the sum of the recorded rates of the steps checkpoint c stands for, not the
    interpolation of log_history."""
    import json

    from gradian.data.run_record import RECORD_FORMAT, RECORD_NAME, RECORD_VERSION, read_run_record

    _, _, folder = run
    rates = [1e-3 * (1 + (step % 3)) for step in range(1, STEPS[-1] + 1)]  # no schedule log_history could give
    steps = [{"step": step, "epoch": 0, "learning_rate": rate, "rows": []} for step, rate in enumerate(rates, 1)]
    (folder / RECORD_NAME).write_text(json.dumps({"format": RECORD_FORMAT, "version": RECORD_VERSION,
                                                  "steps": steps}))
    try:
        record = read_run_record(folder)
    finally:
        (folder / RECORD_NAME).unlink()
    weights = [c.weight for c in checkpoint_weights(folder, record)]
    bounds = [0, *STEPS]
    assert weights == pytest.approx([sum(rates[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)])
    assert weights != pytest.approx([c.weight for c in checkpoint_weights(folder)])
    record.data["steps"] = steps[:-1]  # the last step unrecorded: the last checkpoint cannot be weighed
    with pytest.raises(InputError, match=f"records no learning rate for step {STEPS[-1]}"):
        checkpoint_weights(folder, record)
