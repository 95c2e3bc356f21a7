"""`DIR/verification.json`: what each retrain recovered, the paired tests that decide, and the status.

Every removal is a zero-weight retrain under the run's seed and data order (`plan`), so the named rows' retrain and
each control answer the same eval prompts with models that differ only in which rows carried loss. Status, for the
answer the report gives (the culprits of a data-cluster verdict, the fix of a setup verdict, the most harmful group
otherwise):
- `confirmed`: the answer's retrain beats every comparison by a paired test on the same prompts (`paired`: exact
  McNemar for pass/fail capabilities, Wilcoxon signed-rank for graded ones), at p < 0.05 after Holm's correction over
  the comparisons. A removal is compared with each random control (same size, same scheme) and with the fine-tune
  itself (the zero-weight retrain that removes nothing reproduces it exactly); a fix with the fine-tune.
- `not-confirmed`: the answer's retrain does no better on average than the fine-tune, or than the random controls
  (their per-prompt mean): acting on it does no better than removing rows at random;
- `inconclusive`: better on average, but not beyond every comparison; or nothing Gradian could retrain to test; or
  what would confirm, shown by retrains that `--max-steps` capped (a debugging option: they are not the run).
A removal's net rate can hide two moves: `answers` counts, per prompt, the failing answers its retrain fixes and
the right answers it breaks, and the status reason names the second when there are any (a removal that fixes what it
was named for can uncover another failure). The named rows dropped from the file (what the next action says to do)
are tested the same way against as many random rows dropped from the file (`--dropped-controls`): reported, not gated
on, and named in the status reason when the status is not `confirmed` (acting on the report can work where the
zero-weight removal, which keeps every batch, uncovers another failure). The same-topic control (rows drawn from the
named rows' own category or cluster) is tested and reported, not gated on: it says whether naming the rows beats naming their topic. Seed noise
(the full data under the run's seed + 1) is measured and shown beside; it no longer gates a removal, because removals
keep the seed. A report without a regression (nothing lost) is `confirmed` when the reseeded run shows no significant
drop from the base either and no retrain moves the capability beyond seed noise, `not-confirmed` when the reseeded
run does drop significantly, `inconclusive` otherwise. Each field is documented in `verification.schema.json`
(docs/verification-schema.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from gradian.files import atomic_write
from gradian.regression.statistics import change, compare
from gradian.report.schema import jsonable
from gradian.report.wording import pct
from gradian.schemas import load_schema
from gradian.verify.measure import Original, mean_scores, recovery
from gradian.verify.paired import ALPHA, paired_test, with_holm
from gradian.verify.plan import Plan
from gradian.verify.recipe import Recipe

VERIFICATION_VERSION = "2.3"  # 2.0: removals by zero weight, paired tests decide, `dropped`, `topic`, `curve`; 2.1: `answers`;
# 2.2: `dropped` against random drops (`controls`, `random_recovery`, `tests`, `beats_random`); 2.3: recovery CIs are
# posterior intervals (`verify.measure`), not paired bootstraps
FILE = "verification.json"
STATUSES = ("confirmed", "not-confirmed", "inconclusive")
TOP_LEVEL_KINDS = ("removal", "dropped", "control", "dropped-control", "topic", "reseeded", "fix", "group")


def summarize(
    plan: Plan, original: Original, scores: dict[str, np.ndarray], markers: dict[str, dict[str, Any]],
    recipe: Recipe, report: dict[str, Any], *, seed: int, device: str, max_steps: int | None,
    original_train_s: float | None,
) -> dict[str, Any]:
    """verification.json as a dict: one entry per retrain, the paired tests, the headline numbers, and the status."""
    binary = bool(report["regression"].get("binary", True))
    seed_change = change(scores["reseeded"], original.finetuned, binary=binary)
    band = abs(seed_change.delta)
    retrains = [_retrain(name, kind, scores[name], markers[name], original, band, seed, binary)
                for kind, name in ((kind, job.name) for kind, job in plan.jobs) if kind in TOP_LEVEL_KINDS]
    by_name = {r["name"]: r for r in retrains}
    control_names = [r["name"] for r in retrains if r["kind"] == "control"]
    random = _random_recovery(scores, control_names, original, seed)
    primary = by_name.get(plan.primary) if plan.primary else None
    removal = primary if primary and primary["kind"] == "removal" else None
    fixed = primary if primary and primary["kind"] == "fix" else None
    tests = _tests(plan.primary, scores, original, control_names, binary)
    out: dict[str, Any] = {
        "schema_version": VERIFICATION_VERSION,
        "verdict": report["verdict"]["kind"],
        "capability": report["regression"].get("capability"),
        "binary": binary,
        "n": len(original.ids),
        "base_rate": float(original.base.mean()),
        "finetuned_rate": float(original.finetuned.mean()),
        "scheme": plan.scheme,
        "scheme_note": plan.scheme_note,
        "removed": plan.removed,
        "recovery": removal["recovery"] if removal else None,
        "recovery_ci": removal["recovery_ci"] if removal else None,
        "random_recovery": random.value if random else None,
        "random_recovery_ci": list(random.ci) if random and random.ci else None,
        "tests": [t.to_dict() for t in tests],
        "alpha": ALPHA,
        "topic": _topic(plan, scores, binary, by_name),
        "dropped": _dropped(retrains, scores, original, seed, binary),
        "seed_noise": seed_change.delta,
        "seed_noise_ci": list(seed_change.ci),
        "seed_recovery": by_name["reseeded"]["recovery"],
        "fix": plan.fix.to_dict() if plan.fix else None,
        "fix_note": plan.fix_note,
        "fix_recovery": fixed["recovery"] if fixed else None,
        "fix_recovery_ci": fixed["recovery_ci"] if fixed else None,
        "primary": plan.primary,
        "answers": answers_moved(scores[plan.primary], original) if plan.primary and binary else None,
        "groups": _groups(plan, by_name),
        "retrains": retrains,
        "curve": _curve(plan, scores, markers, original, band, seed, binary),
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


def answers_moved(after: np.ndarray, original: Original) -> dict[str, int]:
    """Per prompt, what the answer's retrain (pass/fail scores, (n,)) changed: of the answers the fine-tune broke (the
    base passed, it fails), how many pass again; of those it got right, how many now fail. A removal can fix every
    failure it was named for and uncover another, which the net rate hides."""
    broken = original.base > original.finetuned  # (n,)
    right = original.finetuned > 0  # (n,)
    return {"broken_by_finetune": int(broken.sum()), "fixed": int((broken & (after > original.finetuned)).sum()),
            "newly_failing": int((right & (after < original.finetuned)).sum())}


def _tests(primary: str | None, scores: dict[str, np.ndarray], original: Original, controls: list[str],
           binary: bool) -> list[Any]:
    """The answer's retrain against the fine-tune and each random control, Holm-corrected together."""
    if primary is None:
        return []
    after = scores[primary]
    tests = [paired_test(after, original.finetuned, "fine-tuned", binary=binary)]
    tests += [paired_test(after, scores[name], name, binary=binary) for name in controls]
    return with_holm(tests)


def _retrain(name: str, kind: str, after: np.ndarray, marker: dict[str, Any], original: Original, band: float,
             seed: int, binary: bool) -> dict[str, Any]:
    moved = change(after, original.finetuned, binary=binary)
    recovered = recovery(after, original, seed)
    beyond = kind != "reseeded" and (moved.ci[0] > band or moved.ci[1] < -band)
    zero = int(marker.get("zero_weight") or 0)
    scheme = "zero-weight" if zero else ("dropped" if kind in ("dropped", "control", "removal", "topic", "group",
                                                                "curve", "curve-control") else "full")
    return {
        "name": name, "kind": kind, "scheme": scheme, "rows": marker.get("rows"), "zero_weight": zero,
        "seed": marker.get("seed"), "changes": marker.get("changes", {}), "rate": float(np.mean(after)),
        "change": moved.delta, "change_ci": list(moved.ci), "recovery": recovered.value,
        "recovery_ci": list(recovered.ci) if recovered.ci else None, "beyond_seed_noise": bool(beyond),
        "global_step": marker.get("global_step"), "capped": marker.get("capped", False),
        "wall_s": marker.get("wall_s"), "reused": marker.get("reused", False),
    }


def _topic(plan: Plan, scores: dict[str, np.ndarray], binary: bool,
           by_name: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The same-topic control: which topic, and whether the named rows beat it (reported, not gated on)."""
    if plan.topic is None:
        return None
    topic = plan.topic
    out: dict[str, Any] = {"source": topic.source, "name": topic.name, "pool": topic.pool, "retrain": topic.retrain,
                           "note": topic.note, "recovery": None, "recovery_ci": None, "test": None}
    if topic.retrain is not None and plan.primary is not None:
        row = by_name[topic.retrain]
        test = paired_test(scores[plan.primary], scores[topic.retrain], topic.retrain, binary=binary)
        out.update(recovery=row["recovery"], recovery_ci=row["recovery_ci"], test=test.to_dict())
    return out


def _dropped(retrains: list[dict[str, Any]], scores: dict[str, np.ndarray], original: Original, seed: int,
             binary: bool) -> dict[str, Any] | None:
    """The retrain a user would run (the rows dropped from the file): what they will see when they retrain, against
    the fine-tune and each random drop of as many rows (Holm-corrected together; none without --dropped-controls)."""
    row = next((r for r in retrains if r["kind"] == "dropped"), None)
    if row is None:
        return None
    controls = [r["name"] for r in retrains if r["kind"] == "dropped-control"]
    random = _random_recovery(scores, controls, original, seed)
    tests = _tests(row["name"], scores, original, controls, binary)
    return {**{key: row[key] for key in ("name", "rows", "rate", "change", "change_ci", "recovery", "recovery_ci")},
            "controls": controls, "random_recovery": random.value if random else None,
            "random_recovery_ci": list(random.ci) if random and random.ci else None,
            "tests": [t.to_dict() for t in tests] if controls else [],
            "beats_random": all(t.beats for t in tests) if controls else None}


def _random_recovery(scores: dict[str, np.ndarray], names: list[str], original: Original, seed: int) -> Any:
    """The recovery of random removals `names`, their per-prompt scores averaged; None without any."""
    return recovery(mean_scores([scores[n] for n in names]), original, seed) if names else None


def _curve(plan: Plan, scores: dict[str, np.ndarray], markers: dict[str, dict[str, Any]], original: Original,
           band: float, seed: int, binary: bool) -> dict[str, Any] | None:
    """Recovery at each k of the ranking's top k, beside random sets of the same size (`--curve`)."""
    if plan.curve is None:
        return None
    kinds = {job.name: kind for kind, job in plan.jobs}
    retrains = [_retrain(name, kinds[name], scores[name], markers[name], original, band, seed, binary)
                for name in kinds if kinds[name] in ("curve", "curve-control")]
    by_name = {r["name"]: r for r in retrains}
    points = []
    for point in plan.curve:
        top = by_name[point.top]
        mean = mean_scores([scores[name] for name in point.randoms]) if point.randoms else None  # (n,)
        random = recovery(mean, original, seed) if mean is not None else None
        tests = with_holm([paired_test(scores[point.top], scores[name], name, binary=binary)
                           for name in point.randoms])
        points.append({
            "share": point.share, "size": point.size, "name": point.top, "rate": top["rate"],
            "recovery": top["recovery"], "recovery_ci": top["recovery_ci"], "random": point.randoms,
            "random_rate": float(mean.mean()) if mean is not None else None,
            "random_recovery": random.value if random else None,
            "random_recovery_ci": list(random.ci) if random and random.ci else None,
            "tests": [t.to_dict() for t in tests], "beats_random": bool(tests) and all(t.beats for t in tests),
        })
    named = None
    if plan.primary is not None and plan.removed:
        named = {"size": plan.removed, "name": plan.primary}
    return {"ranking": plan.ranking, "controls": len(plan.curve[0].randoms) if plan.curve else 0,
            "n_rows": max((r["rows"] or 0) + r["zero_weight"] for r in retrains) if retrains else None,
            "points": points, "named": named, "retrains": retrains}


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
    """The status rule of the module docstring, with the reason in one sentence. Retrains capped by `--max-steps`
    are not the run retrained, so what they show is at most `inconclusive`."""
    state, reason = _status(v)
    if state == "confirmed" and v.get("capped"):
        steps = v["max_steps"]
        return "inconclusive", (f"{reason}, but every retrain was capped at {steps} optimizer "
                                f"step{'' if steps == 1 else 's'} "
                                "(--max-steps), so they are not the run retrained; rerun without it to confirm")
    return state, reason


def _status(v: dict[str, Any]) -> tuple[str, str]:
    if v["verdict"] == "no-regression" or v["finetuned_rate"] >= v["base_rate"]:
        moved = [r["name"] for r in v["retrains"] if r["beyond_seed_noise"]]
        if v["reseeded_regression"]["significant"]:
            return "not-confirmed", "the reseeded full run regresses significantly from the base"
        if moved:
            return "inconclusive", f"{', '.join(moved)} moved the capability beyond seed noise"
        return "confirmed", "no retrain moves the capability beyond seed noise"
    primary = next((r for r in v["retrains"] if r["name"] == v.get("primary")), None)
    if primary is None or not v["tests"]:
        return "inconclusive", v.get("fix_note") or "nothing in the report could be retrained to test it"
    what = "the fix" if primary["kind"] == "fix" else f"removing the {v['removed']} rows"
    controls = [r for r in v["retrains"] if r["kind"] == "control"]
    random_rate = float(np.mean([r["rate"] for r in controls])) if controls else None
    answers = v.get("answers")
    tail = ("" if not answers or not answers["newly_failing"] else (
        f"; it fixes {answers['fixed']} of the {answers['broken_by_finetune']} answers the fine-tune broke, and "
        f"{answers['newly_failing']} answers the fine-tune got right now fail: another failure the removal uncovered "
        f"(their outputs: verify/{v['primary']}/scores.json)")) + _acting(v.get("dropped"))
    if primary["rate"] <= v["finetuned_rate"]:
        return "not-confirmed", f"{what} answers no better than the fine-tune on the same prompts{tail}"
    if random_rate is not None and primary["rate"] <= random_rate:
        return "not-confirmed", f"{what} answers no better than removing as many rows at random{tail}"
    lost = [t for t in v["tests"] if not t["beats"]]
    against = "the fine-tune" + (f" and each of the {len(controls)} random removals" if controls else "")
    if not lost:
        worst = max(t["p_holm"] for t in v["tests"])
        return "confirmed", f"{what} answers better than {against} on the same prompts (paired tests, " \
                            f"p ≤ {worst:.2g} after Holm)"
    names = ", ".join(f"{t['against']} (better on {t['better']}, worse on {t['worse']}, p = {t['p_holm']:.2g})"
                      for t in lost)
    return "inconclusive", f"{what} answers better on average, but not beyond {names} after Holm{tail}"


def _acting(dropped: dict[str, Any] | None) -> str:
    """The status reason's last clause where the zero-weight removal is not confirmed: whether dropping the rows from
    the file (what retraining on train.cleaned.jsonl does) beats dropping as many rows at random
    (`--dropped-controls`)."""
    if dropped is None:
        return ""
    if dropped["beats_random"] is None:  # untested: worth a rerun only where the drop answered better
        return "; rerun with --dropped-controls 3 to test dropping them from the training file against random drops" \
            if dropped["change"] > 0 else ""
    drops = f"each of the {len(dropped['controls'])} random drops of as many rows"
    moved = f"recovery {pct(dropped['recovery'])} against {pct(dropped['random_recovery'])}"
    if dropped["beats_random"]:
        worst = max(t["p_holm"] for t in dropped["tests"])
        return (f"; dropping them from the training file instead answers better than the fine-tune and {drops} "
                f"({moved}, paired tests, p ≤ {worst:.2g} after Holm)")
    return (f"; dropping them from the training file instead does not answer better than the fine-tune and {drops} "
            f"after Holm ({moved})")


def verification_schema() -> dict[str, Any]:
    """The JSON Schema of verification.json (shipped beside this module)."""
    return load_schema("gradian.verify", "verification.schema.json")


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
