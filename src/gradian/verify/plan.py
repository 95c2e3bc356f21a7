"""Which retrains check a report's answer: without the named rows, random controls, another seed, the fix, groups.

Every removal keeps the run's rows, seed, data order and step count and gives the removed rows zero loss weight
(`weighting`), so it differs from the fine-tune in those rows alone:

- `without-culprits`: the named rows at zero weight (for a report naming none, `without-top-group`: its most harmful
  candidate group);
- `without-culprits-dropped`: the named rows dropped from the file (`train.cleaned.jsonl`), what a user who retrains
  on the cleaned file will see (every batch after the first dropped row differs);
- `control-k`: as many rows drawn at random (seeded), K of them; `control-k-dropped` (`--dropped-controls`): the
  first of those sets dropped from the file instead, the comparisons of `without-culprits-dropped` (a packed run's
  controls are drops already); `same-category` / `same-cluster`: as many rows drawn from the named rows' own category
  (a `category` column) or report cluster, when it holds more rows;
- `reseeded`: the full data with the run's seed + 1, how far seed noise alone moves the capability (shown only);
- `fix` (setup verdicts): the named setting changed (rows it drops at zero weight), same seed and order;
- `group-k` (`--groups G`): each of the G most harmful candidate groups (clusters and per-row findings);
- `top-<share>` and `top-<share>-random-j` (`--curve`): the ranking's top k rows for k = 1, 2, 5, 10, 20% of the rows,
  each beside K random sets of the same size.

A report that names no rows and no fix (no-regression, diffuse) with no candidate group is checked by the controls
and the reseeded run alone (`NULL_REMOVAL_SHARE` of the rows). A packed or padding-free recipe has no rows in its
batches to weight, so its removals drop the rows instead (`Plan.scheme`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gradian.data.examples import Example
from gradian.verify.recipe import Recipe
from gradian.verify.retrain import Retrain
from gradian.verify.sets import curve_sizes, named_topic, random_set, ranking_of, topic_set

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
class CurvePoint:
    """One k of the recovery curve: the retrain without the ranking's top k rows and its random sets."""

    share: float
    size: int
    top: str
    randoms: list[str]


@dataclass
class Topic:
    """The same-topic control: which topic, how many rows it holds, and the retrain's name (None: why not)."""

    source: str
    name: str
    pool: int
    retrain: str | None
    note: str | None


@dataclass
class Plan:
    jobs: list[tuple[str, Retrain]]  # (kind, retrain): removal, dropped, control, dropped-control, topic, reseeded,
    # fix, group, curve
    primary: str | None  # the retrain whose paired tests decide the status
    removed: int
    fix: Fix | None = None
    fix_note: str | None = None
    groups: list[Group] = field(default_factory=list)
    scheme: str = "zero-weight"  # or "dropped" (packed or padding-free recipes)
    scheme_note: str | None = None
    topic: Topic | None = None
    curve: list[CurvePoint] | None = None
    ranking: str | None = None  # the examples.jsonl field the curve ranks by


class Removals:
    """Builds the retrains that remove rows, by zero weight (or by dropping them where a recipe has no rows to weight)."""

    def __init__(self, examples: list[Example], seed: int, zero_weight: bool,
                 order: list[list[int]] | None = None) -> None:
        self.examples, self.seed, self.zero_weight, self.order = examples, seed, zero_weight, order

    def without(self, name: str, ids: set[str] | list[str]) -> Retrain:
        drop = frozenset(ids)
        if self.zero_weight:
            return Retrain(name, self.examples, self.seed, zero_ids=drop, order=self.order)
        return Retrain(name, [e for e in self.examples if e.id not in drop], self.seed)

    def dropped(self, name: str, ids: set[str] | list[str]) -> Retrain:
        drop = set(ids)
        return Retrain(name, [e for e in self.examples if e.id not in drop], self.seed)


def plan(report: dict[str, Any], recipe: Recipe, examples: list[Example], cleaned: list[Example] | None,
         tokenizer: Any, *, controls: int, groups: int, seed: int, curve: bool = False, report_dir: Any = None,
         order: list[list[int]] | None = None, dropped_controls: int = 0) -> Plan:
    """The retrains for `report` (report.json as a dict, `examples` the rows of examples.jsonl); `cleaned` is
    train.cleaned.jsonl read, when present; `order` the run's recorded rows per optimizer step (gradian_run.json),
    replayed by every retrain that keeps the run's rows and seed."""
    verdict = report["verdict"]
    culprits = set(verdict.get("culprit_ids") or [])
    scheme_note = zero_weight_note(recipe)
    remove = Removals(examples, recipe.seed, scheme_note is None, order)
    jobs: list[tuple[str, Retrain]] = []
    primary, removed, fix, note, named = None, 0, None, None, set()
    candidates = harm_groups(report)
    if culprits:
        primary, named = "without-culprits", culprits
        jobs.append(("removal", remove.without(primary, culprits)))
        rows = cleaned if cleaned is not None else [e for e in examples if e.id not in culprits]
        jobs.append(("dropped", Retrain(f"{primary}-dropped", rows, recipe.seed)))
        removed = len(examples) - len(rows)
    elif verdict["kind"] == "setup":
        fix, note = setup_fix(verdict.get("evidence", {}).get("finding", {}), recipe, tokenizer)
        if fix is not None:
            job = remove.without("fix", fix.drop_ids) if fix.drop_ids else Retrain("fix", examples, recipe.seed,
                                                                                    order=order)
            job.changes = fix.changes
            jobs.append(("fix", job))
            primary = "fix"
    elif candidates:
        primary, named = "without-top-group", set(candidates[0].example_ids)
        jobs.append(("removal", remove.without(primary, named)))
        jobs.append(("dropped", remove.dropped(f"{primary}-dropped", named)))
        removed = len(named)
    size = removed or (0 if verdict["kind"] == "setup" else max(1, round(NULL_REMOVAL_SHARE * len(examples))))
    for k in range(1, controls + 1 if size else 1):
        jobs.append(("control", remove.without(f"control-{k}", random_set(examples, size, [seed, k]))))
    if scheme_note is None and any(kind == "dropped" for kind, _ in jobs):  # the controls' draws, dropped instead
        for k in range(1, dropped_controls + 1):
            jobs.append(("dropped-control", remove.dropped(f"control-{k}-dropped",
                                                           random_set(examples, size, [seed, k]))))
    topic = _topic(examples, report.get("examples", []), named, size, seed, remove, jobs) if named else None
    jobs.append(("reseeded", Retrain("reseeded", examples, recipe.seed + 1)))
    chosen = candidates[:groups]
    for k, group in enumerate(chosen, start=1):
        jobs.append(("group", remove.without(f"group-{k}", group.example_ids)))
    points, ranking = None, None
    if curve:
        points, ranking = _curve(report, examples, remove, jobs, controls=controls, seed=seed, report_dir=report_dir)
    return Plan(jobs, primary, removed, fix, note, chosen, "zero-weight" if scheme_note is None else "dropped",
                scheme_note, topic, points, ranking)


def zero_weight_note(recipe: Recipe) -> str | None:
    """Why this recipe's removals cannot be by zero weight (None: they can)."""
    for name in ("packing", "padding_free"):
        if recipe.training.get(name):
            return (f"the run trains with {name}=True, so its batches hold no separate rows to weight: removals drop "
                    "the rows instead (batches after the first dropped row differ)")
    return None


def _topic(examples: list[Example], rows: list[dict[str, Any]], named: set[str], size: int, seed: int,
           remove: Removals, jobs: list[tuple[str, Retrain]]) -> Topic | None:
    topic = named_topic(examples, rows, named)
    if topic is None:
        return None
    drawn, why = topic_set(topic, size, seed)
    name = None
    if drawn is not None:
        name = f"same-{topic.source}"
        jobs.append(("topic", remove.without(name, drawn)))
    return Topic(topic.source, topic.name, len(topic.pool), name, why)


def _curve(report: dict[str, Any], examples: list[Example], remove: Removals, jobs: list[tuple[str, Retrain]], *,
           controls: int, seed: int, report_dir: Any) -> tuple[list[CurvePoint], str]:
    ranked, field_name = ranking_of(report.get("examples", []), report_dir)
    points = []
    for share, k in curve_sizes(len(examples)):
        label = f"top-{share * 100:g}pct"
        jobs.append(("curve", remove.without(label, ranked[:k])))
        randoms = [f"{label}-random-{j}" for j in range(1, controls + 1)]
        for j, name in enumerate(randoms, start=1):
            jobs.append(("curve-control", remove.without(name, random_set(examples, k, [seed, k, j]))))
        points.append(CurvePoint(share, k, label, randoms))
    return points, field_name


def harm_groups(report: dict[str, Any]) -> list[Group]:
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
    """The setting a setup finding names as its fix, applied to the recipe; (None, why) when there is none.

    A check states its fix as training settings in `values["fix_settings"]` (SFTConfig fields); pad == eos needs the
    tokenizer to pick a pad token, and eval overlap drops rows, so those two are decided here."""
    check, values = finding.get("check"), finding.get("values") or {}
    settings = values.get("fix_settings")
    if isinstance(settings, dict) and settings:
        said = ", ".join(f"{name}={value!r}" for name, value in settings.items())
        return Fix(str(check), f"{said}, as the finding's fix says", dict(settings)), None
    if check == "pad_eos_masking":
        eos = tokenizer.eos_token
        for token in (tokenizer.pad_token, tokenizer.unk_token):
            if token is not None and token != eos and token != recipe.training.get("eos_token"):
                return Fix(check, f"a distinct pad token ({token!r}, not EOS {eos!r})", {"pad_token": token}), None
        return None, "the tokenizer has no token other than EOS to pad with; add one and retrain"
    if check == "train_eval_overlap":
        ids = list(finding.get("example_ids") or [])
        return Fix(check, f"the {len(ids)} rows copied from the eval set dropped", drop_ids=ids), None
    return None, f"Gradian has no automatic fix for the {check or 'named'} finding to retrain with"
