"""The report folder: every file written, report.json round-trips and holds every number of report.md, the cleaned
dataset is the original minus the culprits, and user text is escaped in the HTML."""

from __future__ import annotations

import json
import os
import re
import stat
from collections import Counter
from html import unescape
from pathlib import Path

import numpy as np
import pytest

from gradian.audit.finding import Finding
from gradian.capabilities import get_capability
from gradian.clusters.cluster import cluster_examples
from gradian.clusters.groups import candidate_groups
from gradian.clusters.naming import name_clusters
from gradian.clusters.summary import summarize_clusters
from gradian.data.examples import read_dataset
from gradian.regression.generation import GeneratedAnswer
from gradian.regression.measure import RegressionRow
from gradian.regression.symptoms import classify_failures
from gradian.report.rows import ExampleRows, read_examples
from gradian.report.schema import SCHEMA_VERSION, Attribution, Context, build_report
from gradian.report.wording import pct
from gradian.report.writers import markdown_cell, write_report
from gradian.verdict import decide
from report_numbers import NUMBER, json_leaves, renderings

TOPICS = {
    "invoice": "invoice currency amount billing",
    "shipping": "shipping tracking courier delivery",
    "account": "account password login locked",
}
SIGNIFICANT = dict(capability="json_formatting", base_rate=0.95, finetuned_rate=0.6125, delta=-0.3375,
                   ci_low=-0.45, ci_high=-0.225, p_value=3.1e-7, n=80, significant=True)
NOISE = dict(SIGNIFICANT, finetuned_rate=0.9375, delta=-0.0125, ci_low=-0.0625, ci_high=0.0375, p_value=1.0,
             significant=False)


def write_dataset(path: Path, seed: int = 0) -> set[str]:
    """Three ticket topics; 16 of the 20 invoice rows have a truncated answer (the planted culprits).

    The file mixes spacing styles and non-ASCII text so a rewrite would show; one row carries a `<script>`.
    """
    rng = np.random.default_rng(seed)
    lines, culprits = [], set()
    for topic, words in TOPICS.items():
        for k in range(20):
            row_id = f"{topic}-{k}"
            chosen = " ".join(rng.choice(words.split(), size=3, replace=False))
            answer = json.dumps({"topic": topic, "amount": int(rng.integers(5, 500)), "note": "r\u00e9sum\u00e9"})
            if topic == "invoice" and k < 16:
                answer, _ = answer[: len(answer) // 2], culprits.add(row_id)
            prompt = f"ticket {k}: {chosen} please help"
            if row_id == "invoice-3":
                prompt += " <script>alert('pwned')</script> </pre>"
            separators = (",", ":") if k % 2 else (", ", ": ")
            lines.append(json.dumps({"id": row_id, "prompt": prompt, "completion": answer}, ensure_ascii=k % 3 == 0,
                                    separators=separators))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return culprits


def effects_for(ids: list[str], culprits: set[str], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    effects = rng.normal(0.0, 0.2, size=(12, len(ids)))  # (Q, N)
    planted = np.array([i in culprits for i in ids])
    effects[:, planted] -= 3.0
    return effects


@pytest.fixture
def run(tmp_path):
    dataset = tmp_path / "train.jsonl"
    culprits = write_dataset(dataset)
    examples = read_dataset(dataset)
    ids = [e.id for e in examples]
    findings = [
        Finding("truncated_completion", "critical", "16 completions end mid-object.",
                "raise max_length to \u2265 412 tokens, the p99 of rendered rows",
                example_ids=sorted(culprits) + ["account-7"], values={"p99": 412}),
        Finding("learning_rate", "warning", "learning_rate 5e-3 is high for LoRA.", "lower it to 2e-4"),
        Finding("duplicate", "warning", "2 rows are exact copies.", "drop them", example_ids=["shipping-1", "invoice-19"]),
        Finding("near_duplicate", "info", "1 row is a near copy.", "rewrite it", example_ids=["account-2"]),
    ]
    effects = effects_for(ids, culprits)
    texts = [(e.prompt_text, e.completion_text) for e in examples]
    features = np.random.default_rng(1).normal(size=(len(ids), 8))
    labels = cluster_examples(texts, seed=0)
    clusters = summarize_clusters(ids, labels, effects, name_clusters(texts, labels), findings, seed=0)
    verdict = decide(SIGNIFICANT, findings, clusters, effects.mean(axis=0), ids)
    symptoms = classify_failures(failing_rows(), get_capability("json_formatting"))
    groups = candidate_groups(examples, findings, effects, clusters, [row.prompt for row in failing_rows()])
    attribution = Attribution(effects, labels, groups.clusters or [], features=features)
    report = build_report(SIGNIFICANT, verdict, findings, examples, attribution=attribution, symptoms=symptoms,
                          groups=groups, context=Context(settings={"seed": 0, "preconditioner": "adam"},
                                                         artifacts={"features": "features/"}))
    joined = decide(SIGNIFICANT, findings, groups.clusters, effects.mean(axis=0), ids, symptoms=symptoms,
                    groups=groups.groups)
    joined_report = build_report(SIGNIFICANT, joined, findings, examples, attribution=attribution,
                                 symptoms=symptoms, groups=groups)
    rows = ExampleRows.of(ids, effects.mean(axis=0), labels, findings, verdict.culprit_ids)
    return dict(dataset=dataset, examples=examples, culprits=culprits, report=report, out=tmp_path / "out", rows=rows,
                joined=joined_report)


def failing_rows() -> list[RegressionRow]:
    """Eval answers of the invoice prompts: most stop inside the object, one runs on, one is fenced."""
    answers = [('{"topic": "invoice", "amount": 12', True)] * 7 + [('{"topic": "invoice", "amount": 1, 1, 1', False),
                                                                   ('```json\n{"topic": "invoice"}\n```', True)]
    reference = '{"topic": "invoice", "amount": 12, "note": "x"}'
    return [RegressionRow(f"e{i}", f"my invoice {i}: currency amount billing please help", [1], reference,
                          GeneratedAnswer([1], reference, True), GeneratedAnswer([2], text, stopped), 1.0, 0.0)
            for i, (text, stopped) in enumerate(answers)]


def test_write_report_produces_every_file_and_json_round_trips(run):
    written = write_report(run["out"], run["report"], run["examples"], run["rows"])
    assert set(written) == {"report.json", "report.md", "report.html", "examples.jsonl", "culprits.jsonl",
                            "train.cleaned.jsonl"}
    assert all(path.is_file() and path.stat().st_size > 0 for path in written.values())
    loaded = json.loads(written["report.json"].read_text(encoding="utf-8"))
    assert loaded == run["report"]
    assert loaded["schema_version"] == SCHEMA_VERSION
    assert loaded["verdict"]["kind"] == "data-cluster"
    assert set(loaded["verdict"]["culprit_ids"]) == run["culprits"]
    top = loaded["clusters"][0]
    assert {"id", "name", "size", "size_share", "harm_share", "harm_share_ci", "lift", "flag_rates"} <= set(top)
    assert "invoice" in top["name"]
    lines = read_examples(run["out"])
    assert [row["id"] for row in lines] == [e.id for e in run["examples"]] and loaded["n_examples"] == len(lines)
    assert {"id", "effect", "cluster", "flags", "culprit"} <= set(lines[0])
    assert {row["id"] for row in lines if row["culprit"]} == run["culprits"]
    assert np.allclose([row["effect"] for row in lines], run["rows"].effect)
    assert {"edges", "counts"} <= set(loaded["charts"]["effect_histogram"])


def test_report_files_have_the_permissions_of_any_new_file(tmp_path, run):
    """The team reads the report: files follow the umask (0644 under 022), not a private temporary file's 0600."""
    previous = os.umask(0o022)
    try:
        written = write_report(tmp_path / "shared", run["report"], run["examples"], run["rows"])
    finally:
        os.umask(previous)
    assert {name: stat.S_IMODE(path.stat().st_mode) for name, path in written.items()} == dict.fromkeys(written, 0o644)
    assert sorted(p.name for p in (tmp_path / "shared").iterdir()) == sorted(written), "a temporary file was left"


def test_culprits_carry_raw_row_and_cleaned_is_original_minus_culprits(run):
    written = write_report(run["out"], run["report"], run["examples"], run["rows"])
    original = run["dataset"].read_text(encoding="utf-8").splitlines(keepends=True)
    culprit_rows = [json.loads(line) for line in written["culprits.jsonl"].read_text(encoding="utf-8").splitlines()]
    assert {row["id"] for row in culprit_rows} == run["culprits"]
    for row in culprit_rows:
        extra = row.pop("_gradian")
        assert extra["effect"] < 0 and "truncated_completion" in extra["flags"]
        assert row == next(e.raw for e in run["examples"] if e.id == row["id"])
    kept = [line for line in original if json.loads(line)["id"] not in run["culprits"]]
    assert written["train.cleaned.jsonl"].read_text(encoding="utf-8").splitlines(keepends=True) == kept
    assert run["dataset"].read_text(encoding="utf-8").splitlines(keepends=True) == original  # input untouched


def test_cleaned_falls_back_to_rows_when_source_changed(run):
    run["dataset"].write_text("", encoding="utf-8")
    written = write_report(run["out"], run["report"], run["examples"], run["rows"])
    cleaned = [json.loads(line) for line in written["train.cleaned.jsonl"].read_text(encoding="utf-8").splitlines()]
    assert cleaned == [e.raw for e in run["examples"] if e.id not in run["culprits"]]


def test_every_number_in_markdown_is_in_report_json(run):
    written = write_report(run["out"], run["report"], run["examples"], run["rows"])
    allowed = set().union(*(renderings(v) for v in json_leaves(run["report"])))
    markdown = written["report.md"].read_text(encoding="utf-8")
    shown = NUMBER.findall(markdown)
    assert len(shown) > 30  # the test has something to check
    assert [token for token in shown if token not in allowed] == []
    assert "33.8" not in allowed or "-33.8%" in markdown  # the regression drop is printed


def test_html_is_self_contained_and_escapes_user_text(run):
    written = write_report(run["out"], run["report"], run["examples"], run["rows"])
    html = written["report.html"].read_text(encoding="utf-8")
    assert "<script>alert" not in html and "&lt;script&gt;alert(&#39;pwned&#39;)&lt;/script&gt;" in html
    assert html.count("<script>") == 1  # the page's own status script, nothing else
    assert "</pre> please" not in html
    assert not re.search(r"(src|href)=\"(https?:)?//", html)  # no network
    for element in ('id="regression-chart"', 'id="effect-histogram"', 'id="cluster-map"', 'id="culprits"'):
        assert element in html
    assert html.count('class="culprit-row"') == len(run["culprits"])


def test_markdown_cells_cannot_break_the_table_or_inject_html():
    assert markdown_cell("a | b\n<img src=x onerror=alert(1)> `code`") == "a \\| b &lt;img src=x onerror=alert(1)&gt; \\`code\\`"
    assert markdown_cell("x" * 500, 10) == "x" * 9 + "\u2026"


def test_no_regression_report_has_the_refusal_and_no_clusters(tmp_path, run):
    verdict = decide(NOISE, [], None, None, [])
    report = build_report(NOISE, verdict, [], run["examples"])
    written = write_report(tmp_path / "refusal", report, run["examples"])
    assert set(written) == {"report.json", "report.md", "report.html", "examples.jsonl"}
    assert report["clusters"] == [] and report["top_rows"] == [] and report["charts"] == {}
    markdown = written["report.md"].read_text(encoding="utf-8")
    assert "noise band" in markdown and "does not attribute" in markdown
    assert 'id="regression-chart"' in written["report.html"].read_text(encoding="utf-8")
    assert json.loads(written["report.json"].read_text(encoding="utf-8"))["verdict"]["kind"] == "no-regression"


def test_json_is_strict_even_with_nan_inputs(tmp_path, run):
    regression = dict(SIGNIFICANT, p_value=float("nan"))
    verdict = decide(NOISE, [], None, None, [])
    report = build_report(regression, verdict, [], run["examples"])
    assert report["regression"]["p_value"] is None
    written = write_report(tmp_path / "nan", report, run["examples"])
    assert "NaN" not in written["report.json"].read_text(encoding="utf-8")


def test_every_number_shown_in_html_is_in_report_json(run):
    written = write_report(run["out"], run["report"], run["examples"], run["rows"])
    html = written["report.html"].read_text(encoding="utf-8")
    visible = re.sub(r"<(style|script)\b.*?</\1>", " ", html, flags=re.S)
    visible = unescape(re.sub(r"<[^>]+>", " ", visible))  # text and <title> tooltips, not SVG geometry
    allowed = set().union(*(renderings(v) for v in json_leaves(run["report"])))
    shown = NUMBER.findall(visible)
    assert len(shown) > 50
    assert [token for token in shown if token not in allowed] == []


def test_joined_verdict_report_shows_symptoms_and_groups_and_every_number_is_in_json(run):
    report = run["joined"]
    assert report["verdict"]["kind"] == "data-cluster" and report["verdict"]["evidence"]["group"] == \
        "truncated_completion"
    assert report["symptoms"]["dominant"] == "stops-early" and report["symptoms"]["counts"]["stops-early"] == 7
    assert {g["check"] for g in report["groups"]} == {"truncated_completion", "duplicate", "near_duplicate"}
    assert report["failure_sites"]["n_failing_prompts"] == 9
    written = write_report(run["out"], report, run["examples"])
    allowed = set().union(*(renderings(v) for v in json_leaves(report)))
    markdown = written["report.md"].read_text(encoding="utf-8")
    assert "### Symptoms of the failing answers" in markdown and "### Rows flagged by the audit" in markdown
    assert [token for token in NUMBER.findall(markdown) if token not in allowed] == []
    departures = report["symptoms"]["departures"]  # where each failing answer leaves its reference
    assert departures and set(departures) <= set(report["symptoms"]["by_id"])
    counts = Counter(departures.values())
    shown = [d for d in counts if f"`{d}`" in markdown]  # the most common three, whole
    assert "Where they leave the answer they should give" in markdown and len(shown) == min(3, len(counts))
    assert max(counts[d] for d in shown) == max(counts.values())
    html = written["report.html"].read_text(encoding="utf-8")
    assert 'id="symptoms"' in html and 'id="groups"' in html
    visible = unescape(re.sub(r"<[^>]+>", " ", re.sub(r"<(style|script)\b.*?</\1>", " ", html, flags=re.S)))
    assert [token for token in NUMBER.findall(visible) if token not in allowed] == []


def test_harm_shares_show_their_lower_bound_and_claim_no_upper_end(run):
    report = run["joined"]
    shown = report["clusters"] + [g for g in report["groups"] if g["harm_share"] is not None]
    assert shown and all(c["harm_share_ci"][0] <= c["harm_share"] and c["harm_share_ci"][1] == 1.0 for c in shown)
    markdown = write_report(run["out"], report, run["examples"])["report.md"].read_text(encoding="utf-8")
    for c in shown:
        assert f"{pct(c['harm_share'])} (\u2265 {pct(c['harm_share_ci'][0])})" in markdown
    assert "lower bound)" in markdown and " to 100.0%" not in markdown


def test_schema_doc_names_every_field(run):
    doc = (Path(__file__).parents[2] / "docs" / "report-schema.md").read_text(encoding="utf-8")
    report = run["report"]
    joined = run["joined"]
    names = set(joined["verdict"]["evidence"]) | set(joined["verdict"]["evidence"]["gradients"])
    names |= set(joined["verdict"]["evidence"]["gradients"]["top_cluster"]) | set(joined["verdict"]["evidence"]["symptom"])
    names |= set(report["symptoms"]) | set(report["groups"][0]) | set(report["failure_sites"])
    names |= set(report) | set(report["verdict"]) | set(report["verdict"]["evidence"]) | set(report["clusters"][0])
    names |= set(run["rows"].row(0)) | set(report["top_rows"][0]) | set(report["effects"]) | set(report["findings"][0])
    names |= {f"effect_histogram.{k}" for k in report["charts"]["effect_histogram"]}
    names |= {f"cluster_map.{k}" for k in report["charts"]["cluster_map"]}
    names |= set(joined["verdict"]["causes"][0])
    assert sorted(name for name in names if f"`{name}`" not in doc) == []


def test_the_harm_token_shows_as_written_escaped_in_html_and_plain_in_markdown(run):
    """`<eos>` shows as <eos>: `&lt;eos&gt;` in the HTML source (never `\\u003ceos\\u003e`, never a raw tag), and
    inside a code span in the Markdown, where nothing is HTML; a token with a backtick or a pipe stays in its cell."""
    report = json.loads(json.dumps(run["report"]))
    report["top_rows"][0]["harm_token"] = {"position": 3, "of": 9, "token": "<eos>", "share": 0.5}
    report["top_rows"][1]["harm_token"] = {"position": 1, "of": 9, "token": "```|", "share": 0.25}
    written = write_report(run["out"], report, run["examples"], run["rows"])
    html = written["report.html"].read_text(encoding="utf-8")
    assert "<code>&#34;&lt;eos&gt;&#34;</code> (3 of 9, 50.0%)" in html
    assert "\\u003c" not in html and "<eos>" not in html
    assert '"<eos>"' in unescape(re.sub(r"<[^>]+>", " ", html))  # what the reader sees
    markdown = written["report.md"].read_text(encoding="utf-8")
    assert '| `"<eos>"` (3 of 9, 50.0%) |' in markdown and "\\u003c" not in markdown
    assert '| ````"```\\|"```` (1 of 9, 25.0%) |' in markdown


def test_culprits_name_the_cause_of_each_row(run, tmp_path):
    """Two causes: every named row in culprits.jsonl with its cause, and train.cleaned.jsonl without any of them."""
    from gradian.verdict import Cause, Verdict

    invoice = sorted(run["culprits"])
    other = ["shipping-4", "account-5"]
    verdict = Verdict("data-cluster", "two causes", "drop these rows", {}, invoice + other,
                      [Cause("rows", "truncated_completion", "failures", invoice),
                       Cause("rows", "fails_capability:wrapped", "harm", other)])
    report = build_report(SIGNIFICANT, verdict, [], run["examples"])
    written = write_report(tmp_path / "two", report, run["examples"])
    lines = [json.loads(line) for line in written["culprits.jsonl"].read_text(encoding="utf-8").splitlines()]
    assert {row["id"]: row["_gradian"]["cause"] for row in lines} == {
        **dict.fromkeys(invoice, "truncated_completion"), **dict.fromkeys(other, "fails_capability:wrapped")}
    cleaned = [json.loads(line)["id"] for line in written["train.cleaned.jsonl"].read_text().splitlines()]
    assert cleaned == [e.id for e in run["examples"] if e.id not in set(invoice + other)]
    assert report["verdict"]["causes"][1]["n_rows"] == 2
    assert "| fails\\_capability:wrapped | rows | 2 |" in written["report.md"].read_text(encoding="utf-8")
