"""`DIR/verification.json`: what each retrain recovered, against random controls and seed noise, and the status.

Status, for the answer the report gives (the culprits of a data-cluster verdict, the fix of a setup verdict, the
most harmful group otherwise):
- `confirmed`: the lower end of its recovery CI lies above the controls' recovery CI and above seed noise (the
  reseeded full run's recovery, in absolute value);
- `not-confirmed`: the upper end of its recovery CI does not reach the controls' mean recovery or seed noise, so
  acting on the answer does no better than removing rows at random or rerunning with another seed;
- `inconclusive`: the intervals overlap, or there is nothing Gradian could retrain to test.
A report without a regression (nothing lost) is `confirmed` when the reseeded run shows no significant drop from
the base either and no retrain moves the capability beyond seed noise, `not-confirmed` when the reseeded run does
drop significantly, `inconclusive` otherwise. Documented field by field in docs/report-schema.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from gradian.files import atomic_write
from gradian.regression.statistics import compare
from gradian.report.schema import jsonable
from gradian.verify.measure import Original, change, mean_scores, recovery
from gradian.verify.plan import Plan
from gradian.verify.recipe import Recipe

VERIFICATION_VERSION = "1.0"
FILE = "verification.json"
STATUSES = ("confirmed", "not-confirmed", "inconclusive")


def summarize(
    plan: Plan, original: Original, scores: dict[str, np.ndarray], markers: dict[str, dict[str, Any]],
    recipe: Recipe, report: dict[str, Any], *, seed: int, device: str, max_steps: int | None,
    original_train_s: float | None,
) -> dict[str, Any]:
    """verification.json as a dict: one entry per retrain, the headline numbers, and the status."""
    seed_change = change(scores["reseeded"], original.finetuned, seed)
    band = abs(seed_change.delta)
    retrains = [_retrain(name, kind, scores[name], markers[name], original, band, seed)
                for kind, name in ((kind, job.name) for kind, job in plan.jobs)]
    by_name = {r["name"]: r for r in retrains}
    controls = [scores[r["name"]] for r in retrains if r["kind"] == "control"]
    random = recovery(mean_scores(controls), original, seed) if controls else None
    primary = by_name.get(plan.primary) if plan.primary else None
    out: dict[str, Any] = {
        "schema_version": VERIFICATION_VERSION,
        "verdict": report["verdict"]["kind"],
        "capability": report["regression"].get("capability"),
        "n": len(original.ids),
        "base_rate": float(original.base.mean()),
        "finetuned_rate": float(original.finetuned.mean()),
        "removed": plan.removed,
        "recovery": primary["recovery"] if primary and primary["kind"] == "removal" else None,
        "recovery_ci": primary["recovery_ci"] if primary and primary["kind"] == "removal" else None,
        "random_recovery": random.value if random else None,
        "random_recovery_ci": list(random.ci) if random and random.ci else None,
        "seed_noise": seed_change.delta,
        "seed_noise_ci": list(seed_change.ci),
        "seed_recovery": by_name["reseeded"]["recovery"],
        "fix": plan.fix.to_dict() if plan.fix else None,
        "fix_note": plan.fix_note,
        "fix_recovery": primary["recovery"] if primary and primary["kind"] == "fix" else None,
        "fix_recovery_ci": primary["recovery_ci"] if primary and primary["kind"] == "fix" else None,
        "primary": plan.primary,
        "groups": _groups(plan, by_name),
        "retrains": retrains,
        "recipe": recipe.to_dict(),
        "device": device,
        "max_steps": max_steps,
        "capped": max_steps is not None,
        "original_train_s": original_train_s,
        "retrain_s": float(sum(m.get("wall_s", 0.0) for m in markers.values())),
    }
    out["reseeded_regression"] = _reseeded_regression(scores["reseeded"], original, report, seed)
    out["status"], out["status_reason"] = status(out)
    return jsonable(out)


def _retrain(name: str, kind: str, after: np.ndarray, marker: dict[str, Any], original: Original, band: float,
             seed: int) -> dict[str, Any]:
    moved = change(after, original.finetuned, seed)
    recovered = recovery(after, original, seed)
    beyond = kind != "reseeded" and (moved.ci[0] > band or moved.ci[1] < -band)
    return {
        "name": name, "kind": kind, "rows": marker.get("rows"), "seed": marker.get("seed"),
        "changes": marker.get("changes", {}), "rate": float(np.mean(after)), "change": moved.delta,
        "change_ci": list(moved.ci), "recovery": recovered.value,
        "recovery_ci": list(recovered.ci) if recovered.ci else None, "beyond_seed_noise": bool(beyond),
        "global_step": marker.get("global_step"), "capped": marker.get("capped", False),
        "wall_s": marker.get("wall_s"), "reused": marker.get("reused", False),
    }


def _groups(plan: Plan, by_name: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each tested group with its harm rank (the report's) and its recovery rank (what removing it recovered)."""
    rows = []
    for rank, group in enumerate(plan.groups, start=1):
        result = by_name[f"group-{rank}"]
        rows.append({"name": group.name, "source": group.source, "size": len(group.example_ids),
                     "harm_share": group.harm_share, "harm_rank": rank, "rate": result["rate"],
                     "recovery": result["recovery"], "recovery_ci": result["recovery_ci"],
                     "change": result["change"], "beyond_seed_noise": result["beyond_seed_noise"]})
    order = sorted(rows, key=lambda r: -(r["recovery"] if r["recovery"] is not None else r["change"]))
    for position, row in enumerate(order, start=1):
        row["recovery_rank"] = position
    return rows


def _reseeded_regression(after: np.ndarray, original: Original, report: dict[str, Any], seed: int) -> dict[str, Any]:
    summary = compare(original.base.tolist(), after.tolist(), binary=bool(report["regression"].get("binary", True)), seed=seed,
                      min_effect=float(report["regression"].get("min_effect", 0.0)))
    return {"delta": summary.delta, "ci": [summary.ci_low, summary.ci_high], "significant": summary.significant}


def status(v: dict[str, Any]) -> tuple[str, str]:
    """The status rule of the module docstring, with the reason in one sentence."""
    if v["verdict"] == "no-regression" or v["finetuned_rate"] >= v["base_rate"]:
        moved = [r["name"] for r in v["retrains"] if r["beyond_seed_noise"]]
        if v["reseeded_regression"]["significant"]:
            return "not-confirmed", "the reseeded full run regresses significantly from the base"
        if moved:
            return "inconclusive", f"{', '.join(moved)} moved the capability beyond seed noise"
        return "confirmed", "no retrain moves the capability beyond seed noise"
    primary = next((r for r in v["retrains"] if r["name"] == v.get("primary")), None)
    if primary is None or primary["recovery_ci"] is None:
        return "inconclusive", v.get("fix_note") or "nothing in the report could be retrained to test it"
    low, high = primary["recovery_ci"]
    noise = abs(v["seed_recovery"] or 0.0)
    random_high = v["random_recovery_ci"][1] if v["random_recovery_ci"] else float("-inf")
    random_mean = v["random_recovery"] if v["random_recovery"] is not None else float("-inf")
    what = "the fix" if primary["kind"] == "fix" else f"removing the {v['removed']} rows"
    against = "random removal and seed noise" if v["random_recovery_ci"] else "seed noise"
    if low > max(random_high, noise):
        return "confirmed", f"{what} recovers more than {against} (its CI lies above)"
    if high <= max(random_mean, noise):
        return "not-confirmed", f"{what} recovers no more than {against}"
    return "inconclusive", f"the recovery of {what} overlaps {against}"


def write_verification(report_dir: Path, verification: dict[str, Any], report: dict[str, Any]) -> dict[str, Path]:
    """verification.json, and report.json/md/html again with their verification section."""
    from gradian.report.writers import render_html, render_markdown

    report = {**report, "verification": verification}
    text = json.dumps(report, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    return {
        FILE: atomic_write(report_dir / FILE, json.dumps(verification, indent=2, allow_nan=False) + "\n"),
        "report.json": atomic_write(report_dir / "report.json", text),
        "report.md": atomic_write(report_dir / "report.md", render_markdown(report)),
        "report.html": atomic_write(report_dir / "report.html", render_html(report)),
    }
