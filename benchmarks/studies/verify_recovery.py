"""`gradian verify` on the data-cause scenarios: does removing the named rows bring the capability back?

For each scenario (built into the shared scenario cache if needed): `attribute`, then `verify --groups 3`, and one
Markdown row: rows removed, recovery with its CI, the random controls' recovery, seed noise, the status, the wall
time of one retrain ÷ the original training time, and whether the group that recovers most when removed is the one
the gradient ranking puts first.

    python -m benchmarks.studies.verify_recovery --cache /work/scen/tests [--scenarios truncated-cluster format-cluster]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from gradian import attribute
from gradian.report.wording import pct
from gradian.scenarios import build, built_before
from gradian.scenarios.base import one_thread
from gradian.settings import AttributeSettings
from gradian.verify import VerifySettings, verify

DATA_CAUSES = ("truncated-cluster", "format-cluster")
HEADER = ("| scenario | verdict | removed | recovery (95% CI) | random recovery (95% CI) | seed noise | status | "
          "retrain ÷ original time | top-ranked group recovers most |\n|---|---|---|---|---|---|---|---|---|")


def scenario_folder(cache: Path, name: str) -> Path:
    found = sorted(p for p in (cache / "built").glob(f"{name}-seed0-*") if p.is_dir() and not p.suffix)
    for folder in found:
        if built_before(folder, name, 0):
            return folder
    return build(name, cache / "built" / f"{name}-seed0-bench", 0, cache_dir=cache)


def row(name: str, folder: Path, out: Path, groups: int) -> str:
    attribute(AttributeSettings(base_model=str(folder / "base"), adapter=str(folder / "run"), run=str(folder / "run"),
                                dataset=str(folder / "train.jsonl"), eval_dataset=str(folder / "eval.jsonl"),
                                capability="json_formatting", out=str(out)))
    v = verify(VerifySettings(report=str(out), groups=groups, device="cpu"))
    interval = lambda ci: f"{pct(ci[0])} to {pct(ci[1])}" if ci else "n/a"  # noqa: E731
    trained = [r for r in v["retrains"] if not r["reused"]]
    ratio = (sum(r["wall_s"] for r in trained) / len(trained) / v["original_train_s"]
             if trained and v["original_train_s"] else None)
    best = min(v["groups"], key=lambda g: g["recovery_rank"]) if v["groups"] else None
    first = "n/a" if best is None else ("yes" if best["harm_rank"] == 1 else f"no (rank {best['harm_rank']})")
    return (f"| {name} | {v['verdict']} | {v['removed']} | {pct(v['recovery'])} ({interval(v['recovery_ci'])}) | "
            f"{pct(v['random_recovery'])} ({interval(v['random_recovery_ci'])}) | {pct(v['seed_noise'], signed=True)} | "
            f"{v['status']} | {'n/a' if ratio is None else f'{ratio:.1f}'} | {first} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, required=True, help="scenario cache (GRADIAN_TEST_SCENARIOS)")
    parser.add_argument("--scenarios", nargs="+", default=list(DATA_CAUSES))
    parser.add_argument("--groups", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="also write every verification.json here")
    args = parser.parse_args()
    lines, everything = [HEADER], {}
    with tempfile.TemporaryDirectory() as scratch, one_thread():
        for name in args.scenarios:
            out = Path(scratch) / name
            lines.append(row(name, scenario_folder(args.cache, name), out, args.groups))
            everything[name] = json.loads((out / "verification.json").read_text())
            print(lines[-1], flush=True)
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps(everything, indent=2) + "\n")


if __name__ == "__main__":
    main()
