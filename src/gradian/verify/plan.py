"""Which retrains check a report's answer: without the culprits, random controls, another seed, the fix, groups.

- `without-culprits`: the training file minus the named rows (`train.cleaned.jsonl`);
- `control-k`: minus as many rows drawn at random (seeded), K of them;
- `reseeded`: the full data with the run's seed + 1, to see how far seed noise alone moves the capability;
- `fix` (setup verdicts): the full data with the named fix applied, one setting changed;
- `group-k` (`--groups G`): minus each of the G most harmful candidate groups (clusters and per-row findings).

A report that names no rows and no fix (no-regression, diffuse) is checked by removing its most harmful candidate
group when attribution ran, else only by the controls and the reseeded run (`NULL_REMOVAL_SHARE` of the rows).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gradian.data.examples import Example
from gradian.verify.recipe import Recipe
from gradian.verify.retrain import Retrain

# A group holding more than this share of the rows is the data, not a group: removing it tells nothing.
MAX_GROUP_SHARE = 0.5
# Controls of a report that names no rows remove this share of the rows: the middle of the 5-20% clusters the
# scenario world plants.
NULL_REMOVAL_SHARE = 0.1


@dataclass
class Fix:
    """The named fix of a setup verdict as settings (`changes`) or rows to drop (`drop_ids`)."""

    check: str
    description: str
    changes: dict[str, Any] = field(default_factory=dict)
    drop_ids: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, "description": self.description, "changes": self.changes,
                "dropped": len(self.drop_ids)}


@dataclass
class Group:
    name: str
    source: str  # "cluster" | "finding"
    example_ids: list[str]
    harm_share: float


@dataclass
class Plan:
    jobs: list[tuple[str, Retrain]]  # (kind, retrain): kind is removal, control, reseeded, fix or group
    primary: str | None  # the retrain whose recovery decides the status
    removed: int
    fix: Fix | None = None
    fix_note: str | None = None
    groups: list[Group] = field(default_factory=list)


def plan(report: dict[str, Any], recipe: Recipe, examples: list[Example], cleaned: list[Example] | None,
         tokenizer: Any, *, controls: int, groups: int, seed: int) -> Plan:
    """The retrains for `report` (report.json as a dict); `cleaned` is train.cleaned.jsonl read, when present."""
    verdict = report["verdict"]
    culprits = set(verdict.get("culprit_ids") or [])
    jobs: list[tuple[str, Retrain]] = [("reseeded", Retrain("reseeded", examples, recipe.seed + 1))]
    primary, removed, fix, note = None, 0, None, None
    candidates = candidate_groups(report)
    if culprits:
        rows = cleaned if cleaned is not None else [e for e in examples if e.id not in culprits]
        jobs.insert(0, ("removal", Retrain("without-culprits", rows, recipe.seed)))
        primary, removed = "without-culprits", len(examples) - len(rows)
    elif verdict["kind"] == "setup":
        fix, note = setup_fix(verdict.get("evidence", {}).get("finding", {}), recipe, tokenizer)
        if fix is not None:
            kept = [e for e in examples if e.id not in set(fix.drop_ids)]
            jobs.insert(0, ("fix", Retrain("fix", kept, recipe.seed, fix.changes)))
            primary = "fix"
    elif candidates:
        top = candidates[0]
        drop = set(top.example_ids)
        jobs.insert(0, ("removal", Retrain("without-top-group", [e for e in examples if e.id not in drop], recipe.seed)))
        primary, removed = "without-top-group", len(drop)
    size = removed or (0 if verdict["kind"] == "setup" else max(1, round(NULL_REMOVAL_SHARE * len(examples))))
    for k in range(1, controls + 1 if size else 1):
        drop = set(np.random.default_rng([seed, k]).choice([e.id for e in examples], size=size, replace=False))
        jobs.append(("control", Retrain(f"control-{k}", [e for e in examples if e.id not in drop], recipe.seed)))
    chosen = candidates[:groups]
    for k, group in enumerate(chosen, start=1):
        drop = set(group.example_ids)
        jobs.append(("group", Retrain(f"group-{k}", [e for e in examples if e.id not in drop], recipe.seed)))
    return Plan(jobs, primary, removed, fix, note, chosen)


def candidate_groups(report: dict[str, Any]) -> list[Group]:
    """Clusters and per-row findings with their share of the harm, most harmful first (same rows counted once).

    `report["examples"]` are the rows of examples.jsonl (each row's effect and cluster)."""
    effect = {row["id"]: row["effect"] for row in report.get("examples", []) if row.get("effect") is not None}
    harm = {i: max(-e, 0.0) for i, e in effect.items()}
    total = sum(harm.values())
    n_rows = max(len(report.get("examples", [])), 1)
    members: dict[int, list[str]] = {}
    for row in report.get("examples", []):
        if row.get("cluster") is not None:
            members.setdefault(int(row["cluster"]), []).append(row["id"])
    found = [Group(f"cluster {c['id']}: {c['name']}", "cluster", members.get(int(c["id"]), []),
                   float(c["harm_share"])) for c in report.get("clusters", [])]
    if total > 0:
        found += [Group(f"finding {f['check']}", "finding", list(f["example_ids"]),
                        sum(harm.get(i, 0.0) for i in f["example_ids"]) / total)
                  for f in report.get("findings", []) if f.get("example_ids")]
    seen: set[frozenset[str]] = set()
    groups = []
    for group in sorted(found, key=lambda g: -g.harm_share):
        key = frozenset(group.example_ids)
        if key in seen or len(key) > MAX_GROUP_SHARE * n_rows or group.harm_share <= 0:
            continue
        seen.add(key)
        groups.append(group)
    return groups


def setup_fix(finding: dict[str, Any], recipe: Recipe, tokenizer: Any) -> tuple[Fix | None, str | None]:
    """The setting a setup finding names as its fix, applied to the recipe; (None, why) when there is none."""
    check, values = finding.get("check"), finding.get("values") or {}
    if check == "pad_eos_masking":
        eos = tokenizer.eos_token
        for token in (tokenizer.pad_token, tokenizer.unk_token):
            if token is not None and token != eos and token != recipe.training.get("eos_token"):
                return Fix(check, f"a distinct pad token ({token!r}, not EOS {eos!r})", {"pad_token": token}), None
        return None, "the tokenizer has no token other than EOS to pad with; add one and retrain"
    if check == "missing_eos" and values.get("configured_eos_token") is not None:
        return Fix(check, f"the model's own EOS instead of eos_token={values['configured_eos_token']!r}",
                   {"eos_token": None}), None
    if check == "prompt_loss":
        return Fix(check, "completion-only loss (completion_only_loss=True)", {"completion_only_loss": True}), None
    if check == "truncated_completion":
        length = max(int(values.get("p99_length") or 0), int(values.get("max_length") or 0) + 1)
        return Fix(check, f"max_length raised to {length} (the p99 of rendered rows)", {"max_length": length}), None
    if check == "train_eval_overlap":
        ids = list(finding.get("example_ids") or [])
        return Fix(check, f"the {len(ids)} rows copied from the eval set dropped", drop_ids=ids), None
    return None, f"Gradian has no automatic fix for the {check or 'named'} finding to retrain with"
