"""Every threshold the verdict's rules use, each with the reason for its value."""

from __future__ import annotations

# data-cluster thresholds. A cluster must hold at least twice the harm its size would predict: a group merely
# a little above average is what any split of noisy effects produces.
MIN_LIFT = 2.0
# ... the lower end of its bootstrap CI over eval queries must stay 1.5x above its size share, so the concentration
# does not hinge on a few queries ...
MIN_CI_LOW_OVER_SIZE = 1.5
# ... and it must hold a quarter of all harm, else dropping it would leave most of the regression in place.
MIN_HARM_SHARE = 0.25
# A step size whose log shows smooth training (a warning, no damage) outranks a cluster of clean rows unless the
# cluster holds four fifths of the harm even at the low end of its CI: a step size acts on every row, so the harm it
# does spreads (the tiny `diffuse` collapse: 53-73%), where rows that taught the failure hold nearly all of it
# (smol-home-rename-volume: 86-99.9%, and removing them recovered the drop while lowering the rate did not).
DECISIVE_HARM = 0.8
# A per-example finding is the cluster's mechanism when its rate inside exceeds the rate outside by 30 points:
# "81% of this cluster vs 2% elsewhere" explains it, "12% vs 9%" does not.
MIN_FLAG_GAP = 0.30
# Without a mechanism flag, a row of the cluster is a culprit when its effect lies 3 robust standard deviations
# (1.4826 x MAD) below the median effect of the rows outside the cluster: those rows show what an innocent row's
# effect looks like, and 3 sigma keeps a Gaussian background's false-positive rate near 0.1%.
CULPRIT_ROBUST_Z = 3.0
MAD_TO_SIGMA = 1.4826
# Those outlying rows are named only when they hold at least half of all harm (by the rows' mean effects): without a
# mechanism or an audit finding the gradients are the only evidence, and rows holding less leave most of the
# regression unexplained. A clean fine-tune that drifts in one topic concentrates harm on that topic's cluster: on the
# dev family kitchen-null-bpe (clean data, 15 seeds built for this) 5 runs passed the test above, their outlying rows
# holding 17-48% of the harm, and `verify` confirmed none of them (removing them no better than removing rows at
# random). Where rows taught the failure with no mark on their text they hold 68-99% (tickets-swap-intent,
# BENCHMARKS.md). Half is the majority, not a fitted value; on seeds 17-31 of the four clean families, built after it
# was written, 58 of 60 verdicts are right, where the rule without it had 45.
MIN_OUTLIER_HARM = 0.5
# ... and only when they write what the failing answers write where they leave the answer they should give (a
# `Departure`: the same words after the same words) more often than the other rows do, by MIN_FLAG_GAP: the same test
# an audit flag passes to be the cluster's mechanism, read from the answers instead of a check. Rows that taught the
# failure write it (tickets-swap-intent: every named row writes `account_access` where the failing answers put it for
# `invoice_copy`, 14-15% of the other rows); a clean topic's drift teaches nothing its rows write (the four clean runs
# whose outlying rows held half the harm, two of them on seeds built after this was written: 0-32% of them, 0-25% of
# the other rows; `verify` confirmed none). Where no failing answer has an answer to give, the test cannot be read
# and the half decides alone. At most OTHER_ROWS of the other rows are read, a seeded sample.
OTHER_ROWS = 20000
# A critical per-example finding covering at least this share of rows is a setup fault, not a cluster.
SETUP_ROW_SHARE = 0.5
# A group sits where the failures are when at least a quarter of the failing prompts' nearest training rows are its
# rows, and twice as many as its size predicts: a group the failing prompts resemble no more than any rows is
# not where they fail.
MIN_FAILURE_SHARE = 0.25
MIN_FAILURE_LIFT = 2.0
# The gradients agree with a finding group when the most harmful cluster is concentrated and holds at least half
# of the group's rows ...
MIN_AGREEMENT = 0.5
# ... or when the cluster lies inside the named rows: at least 90% of its rows are named (a subset of a finding's
# rows is the gradients pointing at part of the same cause, not elsewhere).
MIN_CLUSTER_INSIDE = 0.9

# Further causes beside the first (rule 8). A cause must explain a share of the failing answers by its symptom:
# at least 15% of them fail the way its rows teach; one stray answer in twenty is 5%, not a cause. In the SmolLM2 run
# of issue 29 (built separately, outside the project's suites: 30 rows of one task cut and all 40 rows of another
# fenced) the fence explains 3 of the 12 failing answers, 25%. The value was checked on the dev family
# travel-cut-prose seed 1 (below: 3 of 18 failing answers wrapped, 17%), not chosen on a test-split family; a later
# build of that seed on other machines wraps 2 of 23 (8.7%) and its prose rows are rightly not named.
MIN_CAUSE_EXPLAINS = 0.15
# ... and hold harm beyond its size: the lower end of its harm share's 95% CI above its size share (a significant
# excess, where the first cause must pass the stricter data-cluster test), the rows it adds beyond the causes already
# named holding more than their size share too (so a group does not pass on harm borrowed from rows named before),
# and at least a tenth of all harm: a second cause holds part of the harm, the first holds most of the rest.
# On travel-cut-prose seed 1 (dev) the prose rows hold 21.5% of the harm for 13.8% of the rows (CI 15.2% to 27.2%):
# 1.56x, short of the data-cluster test's 2x, while the wrapped answers they teach are 3 of the 18 failing ones
# (the later build: 25.3% of the harm, CI 16.6% to 32.6%, and 2 of 23 answers).
MIN_CAUSE_CI_LOW_OVER_SIZE = 1.0
MIN_CAUSE_LIFT = 1.0
MIN_CAUSE_HARM_SHARE = 0.10
# A candidate that overlaps the rows already named by half or more is the same cause seen again, not another.
MAX_CAUSE_OVERLAP = 0.5

# A setting that changed some rows as they were trained (a max-length cut with EOS appended after it) is the cause,
# not the rows, when the symptom its rows teach is that of at least this share of the failing answers: half, set
# before any run was measured with it.
MIN_SETTING_EXPLAINS = 0.5

# The served drop is the serving stack's (`serving`) when it is significant and the training path's drop is not, or
# is at most this share of it: then more than half of what the user measured happens after training (an export, a
# chat template, stop tokens), and attributing it to training rows would blame them for a drop they did not cause.
# Above it both paths regress alike and the training verdict stands, with the served-only part stated beside it.
SERVING_ONLY_SHARE = 0.5
