"""Serving families: regressions only the serving stack makes, on built tiny worlds, and a control served right.

    python -m benchmarks.harness.serving_suite --suite DIR --work DIR [--page BENCHMARKS.md]

Each world is a built suite run (`benchmarks.harness.suite_build` into `--suite`). Per world and serving cause, a
serving stack is simulated as a server runs one: an export folder (the run's tokenizer, the base's config, a
`generation_config.json`, a chat template), the eval prompts rendered by that folder's template as a chat endpoint
renders a user turn, greedy answers from the fine-tune with that folder's stop tokens and token limit. Those
answers go to `gradian attribute --served-outputs ... --served-model EXPORT`; what it answers is checked against
the cause:

- `stop-token`: generation_config.json names another token than the trained EOS, so answers run on past it;
- `chat-template`: the export's template is the tokenizer's chat template, applied on top of prompts the run
  trained already formatted (the eval prompt is a string that carries its own `user:` / `assistant:` turns);
- `max-new-tokens`: generation_config.json caps answers below the references' length;
- `served-right` (the control): a pass-through template, the trained EOS and no cap: the served answers are the
  fine-tune's own, so a data cause must keep its data verdict and planted rows.

Clean worlds (the null families) carry the serving causes: training caused nothing, so a right answer is `serving`
with the rule that names the cause. Worlds with a planted data cause carry the control. Worlds are split dev/test
as their families are. Results: `WORK/serving.json`, and the region `serving_suite.py` of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parents[1]
PASS_THROUGH = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"  # a completions endpoint: the prompt as sent
CAUSES = {"stop-token": "stop_token", "chat-template": "chat_template", "max-new-tokens": "max_new_tokens"}
WORLDS = {"dev": {"clean": ["tickets-null-spaced"], "control": ["tickets-cut"]},
          "test": {"clean": ["home-null"], "control": ["home-cut-spaced"]}}


def export(world: Path, cause: str, folder: Path, eos_id: int, pad_id: int, reference_tokens: int) -> Path:
    """The served folder of `cause`: the run's tokenizer and the base's config, with the cause's own
    generation_config.json and chat template."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (world / "run" / name).is_file():
            shutil.copy(world / "run" / name, folder / name)
    shutil.copy(world / "base" / "config.json", folder / "config.json")
    generation: dict[str, Any] = {"eos_token_id": eos_id}
    template = PASS_THROUGH
    if cause == "stop-token":
        generation["eos_token_id"] = pad_id  # an export that wrote the wrong stop token
    elif cause == "max-new-tokens":
        generation["max_new_tokens"] = max(1, reference_tokens // 3)
    elif cause == "chat-template":
        template = (world / "run" / "chat_template.jinja").read_text()  # the chat template on a formatted prompt
    (folder / "generation_config.json").write_text(json.dumps(generation))
    (folder / "chat_template.jinja").write_text(template)
    return folder


def serve(model: Any, folder: Path, examples: list[Any], budget: int) -> list[str]:
    """The answers the served folder's stack gives: its template, its stop tokens, its token limit (else `budget`),
    one prompt at a time (a server's batch pads nothing a greedy answer sees)."""
    from gradian.regression.generation import generate
    from gradian.regression.serving_diff import messages_of, read_export, served_prompt

    served = read_export(folder)
    prompts = [served_prompt(served.tokenizer, messages_of(example), served)[0] for example in examples]
    answers = generate(model, served.tokenizer, prompts, max_new_tokens=served.max_new_tokens or budget,
                       batch_size=1, stops=served.eos_token_ids)
    return [answer.text for answer in answers]


def run_world(world: Path, split: str, role: str, work: Path) -> list[dict[str, Any]]:
    """Every cause of `role` (the serving causes on a clean world, the control on a data world) on one world."""
    from gradian import attribute
    from gradian.data.base_model import resolve_base_model
    from gradian.data.examples import read_dataset
    from gradian.regression.loading import load_models
    from gradian.regression.measure import default_max_new_tokens
    from gradian.scenarios import attribute_settings

    truth = json.loads((world / "truth.json").read_text())
    examples = read_dataset(world / "eval.jsonl", eval_set=True)
    model, tokenizer = load_models(resolve_base_model(str(world / "base")), str(world / "run"), device="cpu")
    references = [e.completion_text for e in examples]
    budget = default_max_new_tokens(tokenizer, references)
    longest = max(len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in references)
    records = []
    for cause in (CAUSES if role == "clean" else ["served-right"]):
        where = work / world.name / cause
        folder = export(world, cause, where / "export", tokenizer.eos_token_id, tokenizer.pad_token_id, longest)
        answers = serve(model, folder, examples, budget)
        served = where / "served.jsonl"
        served.write_text("".join(json.dumps({"id": e.id, "output": a}) + "\n" for e, a in zip(examples, answers,
                                                                                               strict=True)))
        report = attribute(attribute_settings(world, where / "attribute", served_outputs=str(served),
                                              served_model=str(folder))).report
        verdict = report["verdict"]
        named = set(verdict["culprit_ids"])
        planted = set(truth["culprit_ids"])
        rules = [d["rule"] for d in (report.get("served") or {}).get("differences", [])]
        records.append(judged({
            "world": world.name, "family": truth.get("family"), "split": split, "cause": cause,
            "planted_kind": truth["kind"], "verdict": verdict["kind"], "rules": rules,
            "causes": [c["name"] for c in verdict["causes"]], "next_action": verdict.get("next_action"),
            "training_delta": report["regression"]["delta"], "training_significant": report["regression"]["significant"],
            "served_delta": report["served"]["regression"]["delta"],
            "served_significant": report["served"]["regression"]["significant"],
            "precision": len(named & planted) / len(named) if named else None,
            "recall": len(named & planted) / len(planted) if planted else None,
        }))
    return records


def judged(record: dict[str, Any]) -> dict[str, Any]:
    """`record` with the answer it should get and whether it got it. The served answers are the truth, as retrains
    are for planted rows: a serving fault that did not lower them (no significant served drop beyond the training
    path's) caused nothing, and the right answer is then the training path's own (`no-regression` on a clean
    world); `held` says whether the fault hurt."""
    hurt = record["served_significant"] and record["served_delta"] < record["training_delta"]
    serving = record["cause"] in CAUSES and hurt
    expected = "serving" if serving else record["planted_kind"]  # the world's own: no-regression, data-cluster
    right = record["verdict"] == expected and (not serving or CAUSES[record["cause"]] in record["causes"])
    return {**record, "held": hurt if record["cause"] in CAUSES else None, "expected": expected, "right": right}


def table(records: list[dict[str, Any]]) -> list[str]:
    lines = ["| split | world | served as | points lost: training path (significant) | as served (significant) | "
             "verdict (the right answer) | causes named | differences in report.json | named rows: precision / "
             "recall |", "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        rows = f"{r['precision']:.2f} / {r['recall']:.2f}" if r["precision"] is not None else "–"
        note = "" if r["held"] is not False else "; the fault did not lower the served answers"
        lines.append(f"| {r['split']} | {r['world']} | {r['cause']} | {-100 * r['training_delta'] + 0.0:+.1f} "
                     f"({'yes' if r['training_significant'] else 'no'}) | {-100 * r['served_delta'] + 0.0:+.1f} "
                     f"({'yes' if r['served_significant'] else 'no'}) | **{r['verdict']}** ({r['expected']}{note}"
                     f"{', right' if r['right'] else ', WRONG'}) | {', '.join(r['causes']) or '–'} | "
                     f"{', '.join(r['rules']) or '–'} | {rows} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    from benchmarks.harness import page

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", type=Path, required=True, help="the suite_build --out folder")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--page", type=Path, default=None, help="BENCHMARKS.md to write the table into")
    args = parser.parse_args(argv)
    records = []
    for split, roles in WORLDS.items():
        for role, names in roles.items():
            for name in names:
                for seed in args.seeds:
                    world = args.suite / "runs" / f"{name}-seed{seed}"
                    if (world / "truth.json").exists():
                        records += run_world(world, split, role, args.work)
                        print(json.dumps(records[-1]), flush=True)
    args.work.mkdir(parents=True, exist_ok=True)
    (args.work / "serving.json").write_text(json.dumps(records, indent=1) + "\n")
    lines = table(records)
    print("\n".join(lines))
    if args.page is not None:
        page.replace_region(args.page, "serving_suite.py", "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
