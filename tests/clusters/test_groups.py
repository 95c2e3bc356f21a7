"""Finding groups carry the numbers a cluster carries, from the same code; failure shares locate the failing prompts."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.feature_extraction.text import TfidfVectorizer

from gradian.audit.finding import Finding
from gradian.clusters.groups import NEIGHBOURS, candidate_groups, failure_share, finding_groups, nearest_rows
from gradian.clusters.summary import summarize_clusters
from gradian.data.examples import Example

TOPICS = {"invoice": "invoice currency amount billing", "shipping": "shipping tracking courier delivery",
          "account": "account password login locked"}


def examples(seed: int = 0) -> list[Example]:
    rng = np.random.default_rng(seed)
    rows = []
    for topic, words in TOPICS.items():
        for k in range(20):
            prompt = f"ticket {k}: " + " ".join(rng.choice(words.split(), size=3, replace=False)) + " please help"
            rows.append(Example(f"{topic}-{k}", len(rows) + 1, {"prompt": prompt, "completion": '{"a": 1}'}))
    return rows


ROWS = examples()
IDS = [e.id for e in ROWS]
CUT = Finding("cut_in_data", "critical", "16 rows cut.", "complete them", example_ids=IDS[:16])
CUT_MORE = Finding("cut_in_data", "warning", "2 more rows cut.", "complete them", example_ids=["account-3", "zzz"])
DUPLICATE = Finding("duplicate", "warning", "3 copies.", "drop them", example_ids=["shipping-1", "shipping-2",
                                                                                   "account-9"])
RUN_WIDE = Finding("learning_rate", "warning", "lr high.", "lower it")


def effects_for(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    effects = rng.normal(0.0, 0.3, size=(12, len(IDS)))  # (Q, N)
    effects[:, :16] -= 2.0
    return effects


def test_groups_match_a_naive_float64_reference():
    effects = effects_for()
    groups = {g.check: g for g in finding_groups(IDS, [CUT, CUT_MORE, DUPLICATE, RUN_WIDE], effects, seed=0)}
    assert set(groups) == {"cut_in_data", "duplicate"}  # one group per check naming rows; run-wide ones name none
    cut = groups["cut_in_data"]
    assert cut.example_ids == IDS[:16] + ["account-3"]  # merged, dataset order, unknown ids dropped
    assert cut.severity == "critical" and cut.title == CUT.title  # the most severe finding names the group
    harm = np.maximum(-effects.mean(axis=0), 0.0)
    for group in groups.values():
        inside = np.array([i in set(group.example_ids) for i in IDS])
        share = sum(h for h, hit in zip(harm, inside, strict=True) if hit) / sum(harm)
        assert group.harm_share == pytest.approx(share, abs=1e-12)
        assert group.size_share == pytest.approx(inside.mean())
        assert group.lift == pytest.approx(share / inside.mean(), abs=1e-12)
        assert group.mean_effect == pytest.approx(effects.mean(axis=0)[inside].mean(), abs=1e-12)
        assert group.harm_share_ci[0] <= group.harm_share <= group.harm_share_ci[1]
    assert cut.harm_share > 0.9 and groups["duplicate"].harm_share < 0.1


def test_a_group_equal_to_a_cluster_has_the_cluster_numbers():
    effects = effects_for(1)
    labels = np.array([0 if i < 16 else 1 for i in range(len(IDS))])
    cluster = next(c for c in summarize_clusters(IDS, labels, effects, {}, [], seed=3) if c.id == 0)
    group = finding_groups(IDS, [CUT], effects, seed=3)[0]
    assert group.example_ids == cluster.example_ids
    assert np.allclose([group.harm_share, *group.harm_share_ci, group.lift, group.mean_effect],
                       [cluster.harm_share, *cluster.harm_share_ci, cluster.lift, cluster.mean_effect], atol=1e-12)


def test_without_effects_groups_have_no_harm_numbers_and_sort_by_size():
    groups = finding_groups(IDS, [DUPLICATE, CUT], None)
    assert [g.check for g in groups] == ["cut_in_data", "duplicate"]
    assert all(g.harm_share is None and g.harm_share_ci is None and g.lift is None for g in groups)
    data = groups[0].to_dict()
    assert data["harm_share_ci"] is None and data["size"] == 16 and "example_ids" not in data


def test_failing_prompts_sit_with_the_rows_they_resemble():
    prompts = ["my invoice amount is wrong", "the currency on my billing is wrong", "invoice please"]
    groups = candidate_groups(ROWS, [CUT, DUPLICATE], effects_for(), None, prompts)
    by_check = {g.check: g for g in groups.groups}
    assert groups.n_failing_prompts == 3 and groups.sites()["neighbours"] == NEIGHBOURS
    cut = by_check["cut_in_data"]  # 16 of the 20 invoice rows, the only rows the prompts resemble
    assert 0.6 <= cut.failure_share <= 1.0 and cut.failure_lift == pytest.approx(cut.failure_share / (16 / 60))
    assert by_check["duplicate"].failure_share == 0.0
    labels = np.array([i // 20 for i in range(len(IDS))])
    clusters = summarize_clusters(IDS, labels, effects_for(), {}, [], seed=0)
    placed = candidate_groups(ROWS, [], effects_for(), clusters, prompts).clusters
    shares = {c.id: c.failure_share for c in placed}
    assert shares[0] == pytest.approx(1.0) and shares[1] == shares[2] == 0.0
    assert sum(shares.values()) == pytest.approx(1.0)  # a partition shares the nearest rows out exactly


def test_nearest_rows_match_a_naive_cosine_loop():
    prompts = ["shipping courier late", "password locked account login", "invoice amount", "nothing in common xyz"]
    texts = [e.prompt_text for e in ROWS]
    found = nearest_rows(texts, prompts, k=5)
    vectorizer = TfidfVectorizer(sublinear_tf=True, token_pattern=r"(?u)\b\w+\b")
    rows = vectorizer.fit_transform(texts).toarray().astype(np.float64)
    queries = vectorizer.transform(prompts).toarray().astype(np.float64)
    expected = []
    for query in queries:
        cosine = [float(query @ r) / (np.linalg.norm(query) * np.linalg.norm(r)) if np.linalg.norm(query) else 0.0
                  for r in rows]
        if max(cosine) > 0:
            expected.append(sorted(range(len(rows)), key=lambda i: (-cosine[i], i))[:5])
    assert len(found) == 3  # the prompt sharing no word with any row is left out
    for got, want in zip(found, expected, strict=True):  # ties may order differently: compare the similarity sets
        assert sorted(got.tolist()) == sorted(want) or {IDS[i].split("-")[0] for i in got} == \
            {IDS[i].split("-")[0] for i in want}
    inside = np.array([i.startswith("shipping") for i in IDS])
    assert failure_share(found[:1], inside) == 1.0
    assert nearest_rows([], prompts) is None and nearest_rows(texts, []) is None


def test_a_capability_group_splits_by_the_symptom_of_its_targets():
    """Rows cut mid-object and rows wrapped in prose both fail json_formatting; the group is also split in two, each
    part with its own harm numbers from the same code, and a group whose targets fail one way only is not split."""
    rows = [Example(e.id, e.line, {**e.raw, "completion": ('{"a": 1, "b' if i < 10 else 'Here it is: {"a": 1}'
                                                           if i < 25 else '{"a": 1}')})
            for i, e in enumerate(ROWS)]
    fails = Finding("fails_capability", "critical", "25 completions fail json_formatting.", "fix them",
                    example_ids=IDS[:25], values={"capability": "json_formatting"})
    effects = effects_for()
    groups = {g.name: g for g in finding_groups(IDS, [fails], effects, seed=0, examples=rows)}
    assert set(groups) == {"fails_capability", "fails_capability:stops-early", "fails_capability:wrapped"}
    assert groups["fails_capability:stops-early"].example_ids == IDS[:10]
    assert groups["fails_capability:wrapped"].example_ids == IDS[10:25]
    assert groups["fails_capability:wrapped"].to_dict()["symptom"] == "wrapped"
    harm = np.maximum(-effects.mean(axis=0), 0.0)  # (N,) float64
    assert groups["fails_capability:wrapped"].harm_share == pytest.approx(harm[10:25].sum() / harm.sum())
    cut_only = Finding("fails_capability", "critical", "10 fail.", "fix them", example_ids=IDS[:10],
                       values={"capability": "json_formatting"})
    assert [g.name for g in finding_groups(IDS, [cut_only], effects, seed=0, examples=rows)] == ["fails_capability"]
    unnamed = Finding("fails_capability", "critical", "25 fail.", "fix them", example_ids=IDS[:25])  # no capability
    assert [g.name for g in finding_groups(IDS, [unnamed], effects, seed=0, examples=rows)] == ["fails_capability"]
