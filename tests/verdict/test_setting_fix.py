"""A setting's exact fix travels on the cause the audit finding named: the next action reads it from there."""

from __future__ import annotations

from gradian.audit.finding import Finding
from gradian.clusters.groups import FindingGroup
from gradian.clusters.summary import ClusterSummary
from gradian.verdict.causes import cluster_cause, group_cause
from gradian.verdict.wording import drop_action

IDS = [f"row{i}" for i in range(40)]
SETTING = ("raise max_length to \u2265 158 (the longest row as trained, so no row is cut; the p99 of 157 would still "
           "cut some)")
TRUNCATED = Finding("truncated_completion", "critical", "40 of 400 rows exceed max_length=128 and are truncated.",
                    f"{SETTING}, or shorten/drop rows row0, row1, ...", example_ids=IDS,
                    values={"max_length": 128, "longest": 158, "p99_length": 157,
                            "fix_settings": {"max_length": 158}, "setting_fix": SETTING})
CUT = Finding("cut_in_data", "critical", "12 rows have completions cut in the data itself.", "complete or drop them",
              example_ids=[f"row{i}" for i in range(100, 112)])
GROUP = FindingGroup("truncated_completion", "critical", TRUNCATED.title, IDS, size_share=0.1, harm_share=0.6,
                     harm_share_ci=(0.5, 0.7), lift=6.0)


def test_a_cause_built_from_a_max_length_finding_carries_the_setting_fix_and_the_next_action_leads_with_it():
    cause = group_cause(GROUP, None, [CUT, TRUNCATED], "failures")
    assert cause.setting_fix == SETTING and cause.setting_finding == TRUNCATED.title
    assert cause.fix == TRUNCATED.fix
    action = drop_action(cause.size, [cause])
    assert action == (f"{SETTING}: 40 of 400 rows exceed max_length=128 and are truncated; or drop these 40 rows: "
                      "culprits.jsonl (train.cleaned.jsonl is the dataset without them)")
    assert cause.to_dict()["setting_fix"] == SETTING  # report.json's causes hold it too


def test_a_gradient_cluster_whose_mechanism_is_the_cut_carries_it_and_a_cause_without_a_setting_does_not():
    cluster = ClusterSummary(3, "invoice, amount", IDS + ["row60"], size_share=0.125, harm_share=0.6,
                             harm_share_ci=(0.5, 0.7), lift=4.8, mean_effect=-1.0)
    cause = cluster_cause(cluster, IDS, "truncated_completion", None, [TRUNCATED])
    assert cause.setting_fix == SETTING and drop_action(cause.size, [cause]).startswith(f"{SETTING}: 40 of 400")
    plain = group_cause(FindingGroup("cut_in_data", "critical", CUT.title, CUT.example_ids, size_share=0.03),
                        None, [CUT, TRUNCATED], "failures")
    assert (plain.setting_fix, plain.setting_finding) == ("", "")
    assert drop_action(plain.size, [plain]) == ("drop these 12 rows: culprits.jsonl (train.cleaned.jsonl is the "
                                                "dataset without them); or fix them: complete or drop them")
    # a setting behind any cause named leads, once, before the rows of every cause
    assert drop_action(52, [plain, cause, cause]).startswith(f"{SETTING}: 40 of 400 rows exceed max_length=128 and "
                                                            "are truncated; or drop these 52 rows")
