"""Every sentence of the verdict a user reads: the regression, the symptoms, each verdict's summary and next action.

The rules (`gradian.verdict.rules`, `causes`) decide; this module only words what they found, with the numbers
formatted by `gradian.report.wording` (`pct`, `number`) as the report formats them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gradian.audit.finding import Finding
from gradian.audit.registry import category_of
from gradian.clusters.groups import FindingGroup
from gradian.clusters.summary import ClusterSummary
from gradian.regression.symptoms import Symptoms
from gradian.report.wording import number, pct, ranker
from gradian.verdict.rules import Agreement, Outliers, Written
from gradian.verdict.thresholds import MIN_AGREEMENT, SERVING_ONLY_SHARE
from gradian.verdict.types import Cause

SYMPTOM_PHRASES = {
    "stops-early": "stop early inside the structure (EOS before it closes)",
    "never-stops": "never stop (they run on to the token limit, or past a complete answer)",
    "wrapped": "are wrapped in fences or prose around a valid answer",
    "wrong-fields": "are valid but have missing or renamed fields",
    "substitution": "have the reference's shape with a value or field swapped",
    "other": "fail in another way",
}

CHECK_PHRASES = {
    "truncated_completion": "completions truncated by the run's max length",
    "cut_in_data": "completions cut in the data itself",
    "missing_eos": "no EOS in the supervised tokens",
    "duplicate": "duplicated rows",
    "near_duplicate": "near-duplicate rows",
    "train_eval_overlap": "rows copied from the eval set",
    "prompt_loss": "loss on the prompt",
    "fails_capability": "completions that fail the capability themselves",
    "missing_fields": "completions that leave out fields the eval's answers have",
    "foreign_turn_marker": "answers carrying another chat template's turn marker as plain text",
}

# What the targets of a symptom sub-group look like ("fails_capability:wrapped").
TARGET_PHRASES = {
    "stops-early": "completions that stop inside the structure",
    "never-stops": "completions that run on past a complete answer",
    "wrapped": "completions wrapped in fences or prose",
    "wrong-fields": "completions with missing or renamed fields",
    "substitution": "completions with a value or field swapped",
    "other": "completions that fail the capability in another way",
}

# How a setup fault breaks the answers, said after its finding's title: the collator behind pad == eos.
SETUP_MECHANISMS = {
    "pad_eos_masking": ("A collator that sets the labels of pad ids to -100 (transformers' "
                        "DataCollatorForLanguageModeling, and TRL's SFT collator before 0.17) also hides every EOS "
                        "label when pad == eos, so the model never saw where an answer ends and runs on after it."),
}

NOT_RUN = "Attribution did not run, so this rests on the audit and the symptoms."
NO_CAUSE_ACTION = ("no cause found, so nothing to change on evidence: read the failing answers (Symptoms) and the "
                   "most harmful rows, then measure on more eval prompts or with reference answers and attribute again")


def measured(regression: dict[str, Any]) -> str:
    """The regression in one sentence: rates, difference, CI, p-value, n."""
    return (
        f"On {regression.get('capability', 'the capability')}, the fine-tuned model scores "
        f"{pct(regression.get('finetuned_rate'))} vs {pct(regression.get('base_rate'))} for the base model "
        f"(difference {pct(regression.get('delta'), signed=True)}, 95% CI {pct(regression.get('ci_low'), signed=True)} "
        f"to {pct(regression.get('ci_high'), signed=True)}, p = {number(regression.get('p_value'))}, "
        f"n = {regression.get('n', '?')} eval prompts)."
    )


def symptom_sentence(symptoms: Symptoms) -> str:
    """"90.0% of the 20 failing answers stop early ...", or the mix when no symptom dominates."""
    dominant = symptoms.dominant
    if dominant is None:
        mixed = ", ".join(f"{pct(symptoms.shares[s])} {s}" for s in symptoms.counts if symptoms.counts[s])
        return f"The {symptoms.n_failing} failing answers fail in mixed ways ({mixed})." if mixed else ""
    return (f"{pct(symptoms.shares[dominant])} of the {symptoms.n_failing} failing answers "
            f"{_never_stops(symptoms) if dominant == 'never-stops' else SYMPTOM_PHRASES[dominant]}.")


def _never_stops(symptoms: Symptoms) -> str:
    """`never-stops` said as the answers show it: run to the token limit, or more text after a complete answer and
    then EOS (another template's end marker written as text), or both."""
    if symptoms.ran_to_limit is None:
        return SYMPTOM_PHRASES["never-stops"]
    limit, after = symptoms.ran_to_limit, symptoms.counts["never-stops"] - symptoms.ran_to_limit
    if not after:
        return "never stop (they run on to the token limit)"
    if not limit:
        return "do not stop where the answer ends: each writes more text after a complete answer, then stops"
    return (f"do not stop where the answer ends ({limit} run on to the token limit, {after} write more text after a "
            "complete answer, then stop)")


def check_phrase(check: str) -> str:
    return CHECK_PHRASES.get(check, check.replace("_", " "))


def group_phrase(name: str) -> str:
    """What a group's rows have: its check's phrase, or its sub-group's targets ("fails_capability:wrapped")."""
    check, _, symptom = name.partition(":")
    return TARGET_PHRASES.get(symptom, check_phrase(check)) if symptom else check_phrase(check)


def no_regression(regression: dict[str, Any]) -> tuple[str, str]:
    if regression.get("significant"):
        reason = "The fine-tuned model is not worse, so there is no regression to attribute."
    else:
        reason = (f"This is inside the noise band{detectable(regression)}, so Gradian does not attribute it to any "
                  "training rows.")
    text = f"{measured(regression)} {reason}{training_noise(regression)}{hints(regression)}"
    moved, fell = regression.get("stricter"), regression.get("slice")
    if moved:
        return text, (f"Rerun with --capability {moved['capability']} and the same --out to attribute that drop (the "
                      "answers are kept, so only their scores are computed again).")
    if fell:
        return text, (f"Rerun with --eval-dataset holding only the {fell['n']} eval rows whose {fell['field']} is "
                      f"{fell['value']!r} (their ids are regression.slice.ids in report.json) to attribute that drop.")
    return text, ("Nothing to fix. To detect a smaller drop, measure on more eval prompts, or rerun with --force to "
                  "attribute anyway.")


def hints(regression: dict[str, Any]) -> str:
    """A refusal's hints as sentences, "" without: the drop a stricter capability sees in the same answers
    (`regression.stricter`), and the eval category that dropped while the whole did not (`regression.slice`)."""
    text = ""
    if moved := regression.get("stricter"):
        text += (f" But the answers moved on what {regression.get('capability')} does not check: on "
                 f"{moved['capability']} (the same answers, the same references) {_moved(moved, moved['p_value'])}).")
    if fell := regression.get("slice"):
        text += (f" But one kind of prompt got worse: on the {fell['n']} eval prompts whose {fell['field']} is "
                 f"{fell['value']!r} {_moved(fell, fell['p_holm'])} after Holm over {fell['categories']} categories).")
    return text


def _moved(block: dict[str, Any], p_value: float) -> str:
    """A hint's rates and changed answers, its closing parenthesis left to the caller."""
    return (f"the fine-tuned model scores {pct(block['finetuned_rate'])} vs {pct(block['base_rate'])} for the base "
            f"model ({block['n_broken']} answers broken, {block['n_fixed']} fixed, p = {number(p_value)}")


def training_noise(regression: dict[str, Any]) -> str:
    """The run's own training noise beside the prompts' (`regression.training_noise`), as a sentence; "" without."""
    band = regression.get("training_noise")
    if not band:
        return ""
    final = f" (step {band['final_step']})" if band.get("final_step") is not None else ""
    return (f" Training noise, from the run's own checkpoints: between {band['checkpoint']} (step {band['step']}) and "
            f"the final adapter{final} the capability moved {pct(band['moved'], signed=True)} (95% CI "
            f"{pct(band['ci_low'], signed=True)} to {pct(band['ci_high'], signed=True)}): a drop no larger than that "
            "is within the run's own movement late in training (`gradian verify` retrains with another seed for the "
            "seed's share).")


def detectable(regression: dict[str, Any]) -> str:
    """How large a drop the prompts could detect (`detectable_drop`), as a parenthesis; "" when not measured."""
    if "detectable_drop" not in regression or not regression.get("n"):
        return ""
    if regression["detectable_drop"] is None:
        return f" (no drop on {regression['n']} eval prompts could be significant)"
    return f" (these {regression['n']} eval prompts detect a drop of {pct(regression['detectable_drop'])} or more)"


def setup(regression: dict[str, Any], finding: Finding, symptoms: Symptoms | None) -> str:
    scope = "This affects every row, so dropping rows would not fix it."
    if finding.per_example and category_of(finding) == "setup":  # a setting that changed rows (verdict rule 2b)
        scope = ("The rows are whole in the data: the setting changed them as they were trained, so fixing it keeps "
                 "them, where dropping them would lose what they teach.")
    text = (f"{measured(regression)} The cause is in the training setup, not in a group of rows: "
            f"{finding.title.rstrip('.')}. {scope}")
    if finding.check in SETUP_MECHANISMS:
        text += f" {SETUP_MECHANISMS[finding.check]}"
    shown = symptoms is not None and bool(symptoms.n_failing) and category_of(finding) == "stop"  # rule 3: no majority
    if symptoms is not None and (symptoms.dominant is not None or shown):
        text += f" {symptom_sentence(symptoms)}"
    return text


def finding_summary(regression: dict[str, Any], group: FindingGroup, symptoms: Symptoms, located_by: str,
                    gradients: Agreement, rank: str = "gradient") -> str:
    """Rule 4: the finding's rows, found where the failures are or where the harm is; `rank` made the clusters."""
    text = (f"{measured(regression)} {symptom_sentence(symptoms)} {group.size} training rows "
            f"({pct(group.size_share)} of the data) have {group_phrase(group.name)}")
    nearest = f"{pct(group.failure_share or 0.0)} of their nearest training rows are these rows"
    if located_by == "failures":
        return (text + f", and the failing prompts resemble them: {nearest}, {group.failure_lift:.1f}x their share. "
                f"The model learned its failure from them. " + agreement_sentence(gradients, group.harm_share, rank))
    low = (group.harm_share_ci or (0.0, 1.0))[0]
    return (text + f", and they hold {pct(group.harm_share or 0.0)} of the negative influence (at least {pct(low)} at "
            f"95% confidence, {group.lift or 0.0:.1f}x their size). The failing prompts are about other rows "
            f"({nearest}): a defect taught in one topic can break answers in others. The model learned its failure "
            "from these rows.")


def cluster_summary(regression: dict[str, Any], cluster: ClusterSummary, found: tuple[str, float, float] | None,
                    n_culprits: int, threshold: float | None, written: Written | None = None) -> str:
    """Rule 5: one gradient cluster, with its mechanism or its effect threshold (and what those rows write)."""
    text = (
        f"{measured(regression)} One cluster of {cluster.size} training rows ({pct(cluster.size_share)} of the data), "
        f"grouped around \u201c{cluster.name}\u201d, holds {pct(cluster.harm_share)} of the negative influence "
        f"(at least {pct(cluster.harm_share_ci[0])} at 95% confidence, {cluster.lift:.1f}x its size)."
    )
    if found is not None:
        check, inside, outside = found
        return text + f" {pct(inside)} of this cluster has {check_phrase(check)}, vs {pct(outside)} elsewhere."
    text += f" Its culprits are the {n_culprits} rows whose effect is below {number(threshold)}."
    return text + (f" {departure_sentence(written)}" if written is not None else "")


def departure_sentence(written: Written) -> str:
    """How often the outlying rows write what the failing answers write where they leave the answer they should give."""
    return (f"{pct(written.inside)} of them write what the failing answers write where they leave the answer they "
            f"should give (`{written.example}`), against {pct(written.outside)} of the other rows.")


def _cluster_numbers(top: ClusterSummary) -> str:
    return f"\u201c{top.name}\u201d, which holds {pct(top.harm_share)} of the harm ({top.lift:.1f}x its size)"


def agreement_sentence(gradients: Agreement, own_harm: float | None, rank: str = "gradient") -> str:
    """How the ranking's top cluster stands to the named rows (`rules.Agreement`), worded by the method that made
    it (`rank`, `--rank`): its clusters are grouped on that ranking's effects."""
    top = gradients.top
    if top is None:
        return NOT_RUN
    numbers = _cluster_numbers(top)
    who, s = ranker(rank)
    lead = who[:1].upper() + who[1:]
    if gradients.agreement == "agree":
        if gradients.held >= MIN_AGREEMENT:
            return f"{lead} agree{s}: cluster {numbers}, holds {pct(gradients.held)} of these rows."
        return (f"{lead} agree{s}: cluster {numbers}, lies inside the named rows ({pct(gradients.inside)} "
                "of its rows are named), so it points at part of the same cause.")
    own = f" These rows hold {pct(own_harm)} of it." if own_harm is not None else ""
    if gradients.agreement == "spread":
        return f"{lead} alone name{s} no cluster: the most harmful, {numbers}, is not concentrated.{own}"
    return (f"{lead} and the audit disagree: {who} point{s} at cluster {numbers}, and it holds only "
            f"{pct(gradients.held)} of these rows.{own} Gradian names the rows whose defect matches the failing "
            "answers; check that cluster's rows too.")


def audit_elsewhere(groups: list[FindingGroup], rank: str = "gradient") -> str:
    named = "; ".join(f"{g.size} rows with {group_phrase(g.name)} ({pct(g.failure_share)} of the failing prompts' "
                      "nearest rows)" for g in groups)
    who = ranker(rank)[0]
    return f" {who[:1].upper() + who[1:]} and the audit disagree: the audit flags other rows where the failures sit, " \
           f"{named}; check them too."


def causes_sentence(causes: list[Cause]) -> str:
    """The causes named beside the first: one sentence each, with their rows, symptom share and harm share."""
    sentences = []
    for number_, cause in enumerate(causes, start=2):
        lead = f"Cause {number_}:"
        if cause.kind == "setup":
            sentences.append(f"{lead} the run's setup, {check_phrase(cause.name)}: {pct(cause.explains)} of the "
                             f"failing answers never stop, and this setting takes stopping away from every row.")
            continue
        low = (cause.harm_share_ci or (None, None))[0]
        symptom = (f"; {pct(cause.explains)} of the failing answers {SYMPTOM_PHRASES[cause.symptom]}"
                   if cause.symptom in SYMPTOM_PHRASES else
                   f"; they teach the failure of {pct(cause.explains)} of the failing answers")
        harm = (f"{pct(cause.harm_share)} of the harm (at least {pct(low)} at 95% confidence, "
                f"{cause.lift or 0.0:.1f}x their size)")
        if cause.located_by == "symptom-harm" and cause.symptom in SYMPTOM_PHRASES:
            sentences.append(f"{lead} {cause.size} more rows with {group_phrase(cause.name)}: {pct(cause.explains)} of "
                             f"the failing answers {SYMPTOM_PHRASES[cause.symptom]}, and on those answers these rows "
                             f"hold {harm}.")
            continue
        sentences.append(f"{lead} {cause.size} more rows with {group_phrase(cause.name)} hold {harm}{symptom}.")
    return " ".join(sentences)


def split_sentence(causes: list[Cause]) -> str:
    """The first cause's rows split by the symptom their targets show, when there is more than one part."""
    parts = [c for c in causes if c.kind == "rows"]
    if len(parts) < 2:
        return ""
    said = "; ".join(f"{c.size} with {group_phrase(c.name)}"
                     + (f" ({pct(c.explains)} of the failing answers {SYMPTOM_PHRASES[c.symptom]})"
                        if c.symptom in SYMPTOM_PHRASES else "") for c in parts)
    return f" These rows hold {len(parts)} causes: {said}."


def drop_action(n_rows: int, causes: list[Cause], latent: int = 0, latent_checks: Sequence[str] = ()) -> str:
    """The next action of a data-cluster verdict: a setting that cut the named rows as they were trained first (its
    one-line change, with the value that cuts no row, and why the rows hurt), then dropping the rows, or applying
    each cause's fix; then the `latent` rows no cause names that the findings `latent_checks` say teach a failure."""
    drop = f"drop these {n_rows} rows: culprits.jsonl (train.cleaned.jsonl is the dataset without them)"
    after = (f"; then look at the {latent} other training rows that teach a failure themselves (findings.json: "
             f"{', '.join(latent_checks)}): no failing answer shows them yet, but with these rows gone they can teach "
             "the next failure") if latent else ""
    settings = [f"{c.setting_fix}: {c.setting_finding.rstrip('.')}" for c in causes if c.setting_fix]
    if settings:
        return f"{'; '.join(dict.fromkeys(settings))}; or {drop}{after}"
    fixes = [c.fix for c in causes if c.fix]
    fix = f"; or fix them: {'; '.join(dict.fromkeys(fixes))}" if fixes else ""
    return f"{drop}{fix}{after}"


def diffuse(regression: dict[str, Any], top: ClusterSummary | None, causes: list[Finding],
            symptoms: Symptoms | None, outranked: bool, spread: Outliers | None = None) -> tuple[str, str]:
    """Rules 6 and 7 (and rule 5's exceptions: `outranked`, or `spread`, the rows standing out in a concentrated
    cluster without a mechanism, which hold under half the harm or do not write the failing answers' departures):
    no group of rows holds the harm."""
    where = ""
    if top is not None:
        where = (f": the most harmful, \u201c{top.name}\u201d, holds {pct(top.harm_share)} of it for "
                 f"{pct(top.size_share)} of the rows ({top.lift:.1f}x its size)")
    observed = f" {symptom_sentence(symptoms)}" if symptoms is not None and symptoms.dominant is not None else ""
    cited = "; ".join(f.title.rstrip(".") for f in causes[:2])
    if spread is not None and top is not None:
        lead = (f"The harm shows most in \u201c{top.name}\u201d ({pct(top.harm_share)} of it for "
                f"{pct(top.size_share)} of the rows, {top.lift:.1f}x its size), {_short_of(spread)}: a fine-tune on "
                "clean data that drifts in one topic looks like this, so no rows are named.")
        if not causes:
            return (f"{measured(regression)} No cause was found. {lead} Nothing run-wide is flagged (step size, eval "
                    f"loss, loss spikes).{observed}", NO_CAUSE_ACTION)
        text = f"{measured(regression)} {lead} The run shows a run-wide cause: {cited}.{observed}"
    elif not causes:
        return (f"{measured(regression)} No cause was found. No cluster of training rows holds the harm{where}, "
                "no audit finding flags rows where the failures sit, and nothing run-wide is flagged (step size, eval "
                f"loss, loss spikes).{observed}", NO_CAUSE_ACTION)
    else:
        text = (f"{measured(regression)} No cluster of training rows holds the harm{where}. The regression is spread "
                f"over the data, and the run shows a run-wide cause: {cited}.{observed}")
    if outranked and top is not None:
        text = (f"{measured(regression)} The harm shows most in \u201c{top.name}\u201d ({pct(top.harm_share)} "
                f"of it for {pct(top.size_share)} of the rows, {top.lift:.1f}x its size), but nothing in its rows is "
                "wrong and the run's step size is flagged: a learning rate far too high collapses the model toward "
                "whatever pattern some clean rows carry, and dropping them would move the collapse elsewhere. "
                "Fix the step size first; if the regression stays, attribute the new run.")
    hints = "; ".join(f.fix for f in causes[:2] if f.fix) or "lower the learning rate, and measure again"
    return text, f"look at hyperparameters: {hints} (evidence: {', '.join(f.check for f in causes[:2])})"


def _short_of(spread: Outliers) -> str:
    """Why rule 5 names none of the rows standing out in a cluster without a mechanism."""
    standing_out = f"the {spread.rows} rows that stand out in it"
    if not spread.hold_the_harm or spread.written is None:
        return f"but {standing_out} hold only {pct(spread.harm_share)} of the harm and no audit finding marks them"
    return (f"and {standing_out} hold {pct(spread.harm_share)} of it, but no audit finding marks them and only "
            + departure_sentence(spread.written).rstrip("."))


def served_measured(served: dict[str, Any]) -> str:
    """The served regression in one sentence, as `measured` words the training path's."""
    regression = served["regression"]
    base = "the base as served" if served.get("base_source") == "served" else "Gradian's own base answers"
    return (f"As served, the fine-tuned model scores {pct(regression.get('finetuned_rate'))} on "
            f"{regression.get('capability', 'the capability')} vs {pct(regression.get('base_rate'))} for {base} "
            f"(difference {pct(regression.get('delta'), signed=True)}, 95% CI "
            f"{pct(regression.get('ci_low'), signed=True)} to {pct(regression.get('ci_high'), signed=True)}, "
            f"p = {number(regression.get('p_value'))}, n = {regression.get('n', '?')}).")


def serving(regression: dict[str, Any], served: dict[str, Any], found: list[dict[str, Any]]) -> tuple[str, str]:
    """The `serving` verdict: the served drop, the training path's beside it, and `found`, the differences between
    the paths it names (`rules.named_differences`)."""
    own = ("a drop inside the noise band" if not regression.get("significant") else
           f"a drop of {pct(-float(regression.get('delta', 0.0)))}, at most {SERVING_ONLY_SHARE:.0%} of the "
           "served one")
    text = (f"{served_measured(served)} On Gradian's own path (the adapter on the base, prompts rendered as trained, "
            f"greedy decoding to the trained EOS) the fine-tune scores {pct(regression.get('finetuned_rate'))} vs "
            f"{pct(regression.get('base_rate'))} for the base (difference {pct(regression.get('delta'), signed=True)}, "
            f"p = {number(regression.get('p_value'))}): {own}. So "
            f"{'most of the drop' if regression.get('significant') else 'the drop'} happens after training, in the "
            "serving stack, and the training rows are not to blame for it.")
    if not found:
        return (f"{text} Gradian found no difference it can see between the two paths"
                f"{'' if served.get('model') else ' (pass --served-model to diff the export)'}.", SERVING_UNFOUND)
    text += " " + " ".join(difference_sentence(d) for d in found)
    return text, "; ".join(difference_fix(d) for d in found)


SERVING_UNFOUND = ("serve as trained and measure again: the chat template and tokenizer saved with the adapter, its "
                   "EOS among the stop tokens, greedy decoding, max_new_tokens above the longest answer; to have "
                   "Gradian re-generate with the merged weights in the served dtype, give --served-model the "
                   "export with its safetensors")


def difference_sentence(difference: dict[str, Any]) -> str:
    """What one `regression.serving_diff` rule found, with its numbers."""
    e, rule = difference["evidence"], difference["rule"]
    if rule == "stop_token":
        stops = "unknown (no --served-model)" if e["served_eos_ids"] is None else e["served_eos_ids"]
        return (f"{e['n_rows']} failing served answers run on past where the fine-tune's own answer ended with EOS "
                f"(first: eval row {e['example_id']}): the trained end token is id {e['trained_eos_id']}, the served "
                f"stop tokens are {stops}.")
    if rule == "chat_template":
        return (f"The served chat template renders {e['n_rows']} eval prompts differently from training: on eval row "
                f"{e['example_id']} the first differing token is at position {e['position']} (after "
                f"{e['before']!r}), trained {_token_words(e['trained_token'])}, served "
                f"{_token_words(e['served_token'])}.")
    if rule == "double_bos":
        how = ("the template writes it twice" if e["where"] == "template" else
               "the template writes it and the tokenizer adds another when a server tokenizes the rendered text with "
               "special tokens")
        return (f"The served prompt starts with BOS ({e['bos_token']!r}, id {e['bos_token_id']}) twice on "
                f"{e['n_rows']} eval rows: {how}.")
    if rule == "system_prompt":
        return (f"The system prompt training rendered is missing from the served prompt on {e['n_rows']} eval rows "
                f"(first: {e['example_id']}).")
    if rule == "merged_weights":
        return (f"The export's merged weights, loaded in {e['dtype']}, answer {e['n_changed']} eval prompts otherwise "
                f"than the adapter on the base with the same prompts and stop token; {e['n_rows']} answers the "
                f"fine-tune got right fail (first: eval row {e['example_id']}).")
    return (f"The served max_new_tokens is {e['max_new_tokens']}, shorter than the longest reference answer "
            f"({e['longest_reference']} tokens, eval row {e['example_id']}): {e['n_rows']} answers are cut.")


def _token_words(token: str | None) -> str:
    return "the end of the prompt" if token is None else repr(token)


def difference_fix(difference: dict[str, Any]) -> str:
    """The one-line fix of one `regression.serving_diff` rule."""
    e, rule = difference["evidence"], difference["rule"]
    if rule == "stop_token":
        return (f"add the trained end token {e['trained_eos_id']} to generation_config.json's eos_token_id (and the "
                "server's stop tokens)")
    if rule == "chat_template":
        return ("serve with the chat template the run trained with (save the training tokenizer's chat_template "
                "into the export), or send the prompt as trained to a completions endpoint")
    if rule == "double_bos":
        return ("remove the template's BOS or tokenize the rendered prompt without special tokens "
                "(add_special_tokens=False), so the prompt starts with one BOS as in training")
    if rule == "system_prompt":
        return "send the system prompt the run trained with, or put it in the served chat template as its default"
    if rule == "merged_weights":
        return ("merge the adapter into the base in float32 and cast once after (never merge into a quantized or "
                "bf16-rounded base), or serve the adapter unmerged on its base")
    return (f"raise max_new_tokens in generation_config.json (and the server's limit) from {e['max_new_tokens']} to at "
            f"least {e['longest_reference'] + 1}")


def served_only(served: dict[str, Any]) -> str:
    """Beside a training verdict, when both paths regress: how much of the served drop is served-only."""
    regression = served["regression"]
    return (f" As served the drop is {pct(regression.get('delta'), signed=True)} (p = "
            f"{number(regression.get('p_value'))}); {pct(served.get('served_only_delta'), signed=True)} of it is "
            "served-only (served difference minus the training path's).")
