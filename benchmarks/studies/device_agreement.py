"""On an accelerator: hook gradients equal a naive loop there, and its features equal the CPU's.

    python -m benchmarks.studies.device_agreement --device cuda > benchmarks/results/gpu_agreement.txt

Both in float32 on the SmolLM2 shape (random weights, LoRA r=8 all-linear), as the largest relative L2 error of
a row. The first is exact (no projection), rows of mixed length under right and left padding; the second runs
`extract_train_features` on both devices with the default projection, so it also checks that the projection
drawn on the CPU reaches the device unchanged.
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np
import torch

from benchmarks.speed.gradient_speed import build, make_rows, naive_row_gradient
from gradian.gradients.batches import collate
from gradian.gradients.extract import GradientSettings, extract_train_features, per_example_gradients

MODEL = "smollm2-135m"


def worst_row_error(got: torch.Tensor | np.ndarray, want: torch.Tensor | np.ndarray) -> float:
    got, want = torch.as_tensor(got, dtype=torch.float64), torch.as_tensor(want, dtype=torch.float64)
    return ((got - want).norm(dim=1) / want.norm(dim=1)).max().item()


def hooks_against_naive_loop(device: str) -> list[str]:
    model = build(MODEL, device, torch.float32, "all-linear")
    rows = make_rows(MODEL, 6, seed=3)
    params = [p for p in model.parameters() if p.requires_grad]
    want = torch.stack([naive_row_gradient(model, row, params, device) for row in rows])  # (6, Σ LoRA sizes)
    lines = []
    for side in ("right", "left"):
        got = per_example_gradients(model, collate([(r.input_ids, r.labels) for r in rows], 0, side))
        lines.append(f"hook gradients vs a naive loop on {device}, float32, exact, {side} padding: "
                     f"max relative L2 error {worst_row_error(got, want):.1e}")
    return lines


def features_against_cpu(device: str) -> str:
    rows = make_rows(MODEL, 8, seed=5)
    features = {}
    for where in ("cpu", device):
        model = build(MODEL, where, torch.float32, "all-linear")
        with tempfile.TemporaryDirectory() as store:
            settings = GradientSettings(store_dtype="float32")
            features[where] = np.asarray(extract_train_features(model, rows, store, settings=settings))
    return (f"features extracted on {device} vs on the CPU, float32, projected to {features['cpu'].shape[1]}: "
            f"max relative L2 error {worst_row_error(features[device], features['cpu']):.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--threads", type=int, default=8, help="CPU threads for the CPU side of the comparison")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for line in [*hooks_against_naive_loop(args.device), features_against_cpu(args.device)]:
        print(f"- {line}")


if __name__ == "__main__":
    main()
