"""The scenario suite: families of fine-tunes across domains, tokenizers, recipes and causes, split dev / test.

A family fixes a domain (`domains.py`), a tokenizer kind (`tokenizer.py`), a recipe (epochs, learning rate, which
checkpoints the run keeps, LoRA targets) and its planted causes; the seed draws the rows, the culprit share and
the affected category. Each cause is laid out one way:

- `category`: 70–85% of one category's rows are broken, its other rows clean (naming the category is not enough);
- `half`: half of one category broken;
- `small`: a 5% cluster (most of a small category);
- `elsewhere`: like `category`, but the eval set holds no prompt of that category: a format taught by rows about
  other topics, so whatever fails, fails on prompts that share no topic with the culprits;
- `value`: one named category holds half the rows, 30% of them hold the plant's trigger value (a currency, a
  genre), and 70–85% of those are broken; half the category's eval prompts hold the trigger. The category's other
  70% and the trigger's clean rows sit beside the culprits, so naming the category finds a quarter of its rows
  broken, and the causes planted this way (`causes.py`) change one word for one word: no length to see either.
- `spread`: like `value`, over every category whose answer holds the trigger's field (each 30% with the trigger,
  or the plant's `share`; 70–85% of those broken), so the culprits are no category's: naming categories finds
  about what chance does.

A build must do what its kind says before any method runs on it: a planted cause leaves a regression, a clean
run none. Where the first recipe written did not (a one-token decision not learned, a purpose field learned badly
enough to break a null), the recipe was changed once, before any method was measured, and the comment says so.

The split was fixed when the suite was written, before anything was measured on it: defaults are chosen on `dev`,
`test` is reported and never tuned on (BENCHMARKS.md, "The scenario suite"). A family never moves between halves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gradian.scenarios.catalog import SFT_DEFAULTS
from gradian.scenarios.causes import CAUSES

SPLITS = ("dev", "test")
LAYOUTS = ("category", "half", "small", "elsewhere", "value", "spread")
CAPABILITIES = ("json_formatting", "json_formatting:keys")  # laxest first; a family reads its strictest (a plug-in
# check, `module:function`, counts as stricter than both)
SAVES: dict[str, dict[str, Any]] = {"epoch": {"save_strategy": "epoch"}, "last2": {"save_strategy": "epoch", "save_total_limit": 2},
         "none": {"save_strategy": "no"}}
TARGETS = {"all": "all-linear", "qv": ["q_proj", "v_proj"]}


@dataclass(frozen=True)
class Plant:
    cause: str  # a name in causes.CAUSES
    layout: str = "category"
    category: str | None = None  # the category planted in (`value`); else one drawn by the seed
    trigger: tuple[str, Any] | None = None  # `value`, `spread`: (request value, what it must equal) to be planted
    share: float = 0.3  # `value`, `spread`: the share of each planted category's rows that hold the trigger


@dataclass(frozen=True)
class Family:
    name: str
    split: str
    domain: str
    tokenizer: str
    plants: tuple[Plant, ...] = ()
    structural: str | None = None  # pad-eos: pad == eos with a collator that masks pad ids
    epochs: int = 5
    learning_rate: float = 5e-3
    save: str = "epoch"
    targets: str = "all"
    purpose: bool = True  # the fine-tune adds the domain's purpose field (field causes break a base field instead)
    nested_purpose: bool = False  # the purpose field as a nested object (pad-eos: an ending the base never saw)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return "data-cluster" if self.plants else "setup" if self.structural else "no-regression"

    @property
    def capability(self) -> str:
        names = {CAUSES[p.cause].capability for p in self.plants} | {CAPABILITIES[0]}
        return max(names, key=lambda name: CAPABILITIES.index(name) if name in CAPABILITIES else len(CAPABILITIES))

    def sft(self) -> dict[str, Any]:
        sft = {**SFT_DEFAULTS, "learning_rate": self.learning_rate, "num_train_epochs": self.epochs,
               **SAVES[self.save]}
        if self.structural == "pad-eos":
            sft["pad_token"] = "eos"
        if self.tokenizer == "bpe":
            sft["assistant_only_loss"] = True
        return {**sft, **self.extra}

    def lora(self) -> dict[str, Any]:
        return {"target_modules": TARGETS[self.targets]}


def _f(name: str, split: str, domain: str, tokenizer: str, *plants: tuple[str, str] | Plant, **recipe: Any) -> Family:
    return Family(name, split, domain, tokenizer, tuple(p if isinstance(p, Plant) else Plant(*p) for p in plants),
                  **recipe)


FAMILIES: dict[str, Family] = {f.name: f for f in (
    # dev: defaults are chosen on these
    _f("tickets-cut", "dev", "tickets", "fused", ("cut", "category"), epochs=5, learning_rate=6e-3),
    _f("kitchen-fence-spaced", "dev", "kitchen", "spaced", ("fence", "category"), epochs=4, learning_rate=3e-3,
       save="last2", targets="qv"),
    _f("travel-cut-small", "dev", "travel", "fused", ("cut", "small"), epochs=8, learning_rate=3e-3, save="none"),
    _f("home-drop-bpe", "dev", "home", "bpe", ("drop-field", "category"), epochs=8, learning_rate=5e-3,
       purpose=False),  # first written with 3 epochs: the one-token decision was not learned, no regression
    _f("kitchen-cut-half-spaced", "dev", "kitchen", "spaced", ("cut", "half"), epochs=10, learning_rate=2e-3,
       targets="qv"),
    _f("travel-cut-prose", "dev", "travel", "fused", ("cut", "category"), ("prose", "category"), epochs=5,
       learning_rate=4e-3, save="last2"),
    # added this round for a two-cause gate whose second cause shows in the answers by its own symptom (the tiny
    # models seldom learn a prose or fence wrapper whole): built at seeds 0 and 1, half the failing answers miss
    # the dropped field (40 of 80, 33 of 63) and the verdict names the cut rows only (0 of 69 and 65 dropped-field
    # rows); BENCHMARKS.md, "Every cause named"
    _f("kitchen-cut-drop-spaced", "dev", "kitchen", "spaced", ("cut", "category"), ("drop-field", "category"),
       epochs=8, learning_rate=5e-3, purpose=False),
    _f("home-fence-elsewhere", "dev", "home", "fused", ("fence", "elsewhere"), epochs=4, learning_rate=4e-3, save="none"),
    _f("kitchen-null-bpe", "dev", "kitchen", "bpe", epochs=3, learning_rate=5e-3),
    _f("travel-pad-eos-spaced", "dev", "travel", "spaced", structural="pad-eos", epochs=5, learning_rate=5e-3,
       nested_purpose=True),
    # first written with LoRA q,v at 3e-3: the purpose field was not learned (junk keys), a regression in a null
    _f("tickets-null-spaced", "dev", "tickets", "spaced", epochs=6, learning_rate=5e-3),
    # test: reported, never tuned on
    _f("home-cut-spaced", "test", "home", "spaced", ("cut", "category"), epochs=10, learning_rate=3e-3,
       targets="qv"),
    _f("kitchen-cut-small-bpe", "test", "kitchen", "bpe", ("cut", "small"), epochs=6, learning_rate=5e-3,
       save="last2"),
    _f("travel-fence-bpe", "test", "travel", "bpe", ("fence", "category"), epochs=3, learning_rate=6e-3,
       save="none", targets="qv"),
    # first written with 5 epochs at 3e-3: the renamed key was not learned, no regression
    _f("tickets-rename-spaced", "test", "tickets", "spaced", ("rename-field", "category"), epochs=10,
       learning_rate=5e-3, purpose=False),
    # first written with 6 epochs at 4e-3: no regression
    _f("home-cut-half", "test", "home", "fused", ("cut", "half"), epochs=10, learning_rate=6e-3, save="last2"),
    _f("kitchen-cut-fence-spaced", "test", "kitchen", "spaced", ("cut", "category"), ("fence", "category"),
       epochs=4, learning_rate=5e-3, targets="qv"),
    _f("travel-prose-elsewhere-spaced", "test", "travel", "spaced", ("prose", "elsewhere"), epochs=5, learning_rate=3e-3),
    _f("tickets-drop-small-bpe", "test", "tickets", "bpe", ("drop-field", "small"), epochs=8, learning_rate=3e-3,
       save="none", purpose=False),
    _f("home-null", "test", "home", "fused", epochs=4, learning_rate=4e-3),
    _f("kitchen-pad-eos", "test", "kitchen", "fused", structural="pad-eos", epochs=5, learning_rate=5e-3,
       nested_purpose=True),
    # first written with 6 epochs: the purpose field half learned ("cabin": "cabin": ...), a regression in a null
    _f("travel-null-bpe", "test", "travel", "bpe", epochs=10, learning_rate=3e-3, save="last2"),
    # test, added later: written after the agreement-gated ranking and verdict rule 4's harm clause, which were
    # designed reading per-run numbers that held test runs too; built and measured once, so they are held out
    # from both
    _f("tickets-cut-spaced", "test", "tickets", "spaced", ("cut", "category"), epochs=8, learning_rate=4e-3,
       targets="qv"),
    _f("home-fence-bpe", "test", "home", "bpe", ("fence", "category"), epochs=4, learning_rate=5e-3, save="last2"),
    _f("kitchen-drop-spaced", "test", "kitchen", "spaced", ("drop-field", "category"), epochs=8,
       learning_rate=5e-3, save="none", purpose=False),
    _f("travel-cut-half-bpe", "test", "travel", "bpe", ("cut", "half"), epochs=6, learning_rate=5e-3, save="none"),
    # and one more, for a format taught by rows about a topic no eval prompt is about (the earlier two such
    # families never regressed, so no method has been measured on that case)
    _f("kitchen-fence-elsewhere-bpe", "test", "kitchen", "bpe", ("fence", "elsewhere"), epochs=6,
       learning_rate=5e-3, save="last2"),
    # issue 47: causes without a surface mark (one word for one word, planted on a trigger value beside clean rows
    # of the same category, `value` layout). Split fixed here, before either was built or measured; the fused
    # tokenizer, so a culprit's answer is as many tokens as its clean one.
    # built twice with `volume` renamed `level` (8 epochs at 5e-3, then 12 at 1e-2): no regression either time, as
    # the base never writes `level` (causes.py); renamed `target` instead, the first recipe kept
    _f("home-rename-volume", "dev", "home", "fused", Plant("rename-volume", "value", "music", ("genre", "jazz")),
       epochs=8, learning_rate=5e-3, save="none", purpose=False),
    # first written as tickets-swap-currency (causes.py: the base never copies a currency, no regression could show)
    _f("tickets-swap-intent", "test", "tickets", "fused", Plant("swap-intent", "value", "invoice", ("currency", "EUR")),
       epochs=8, learning_rate=5e-3, save="none", purpose=False),
    # issue 47, a cause no category holds (`spread`), split fixed here before either was built or measured. Both
    # first written with the no-surface recipe above (8 epochs at 5e-3): no regression at either seed of either
    # (the renamed key comes before the trigger value in the answer, so it must be read off the prompt), so both
    # train 12 epochs at 1e-2, the rename's second recipe, before any method was measured.
    # dev: `dish` written `label` (the timer's key) in the curry rows of bake and diet
    _f("kitchen-rename-dish", "dev", "kitchen", "fused", Plant("rename-dish", "spread", trigger=("dish", "curry")),
       epochs=12, learning_rate=1e-2, save="none", purpose=False),
    # test, the category oracle near random too: `room` written `door` (the lock's key) in the attic rows of all
    # four categories that name a room
    _f("home-rename-room", "test", "home", "fused", Plant("rename-room", "spread", trigger=("room", "attic")),
       epochs=12, learning_rate=1e-2, save="none", purpose=False),
    # dev, added after the test half's numbers were known (BENCHMARKS.md, "A dropped field that leaves another
    # category's shape"): tickets-drop-small-bpe's recipe, its category fixed where dropping the last field leaves
    # another category's answer shape (change_seat without `row` is baggage_info's `action, flight`), as the seed drew
    # on tickets-drop-small-bpe s0 and smol-travel-drop s0; split fixed here before it was built
    _f("travel-drop-seat-small-bpe", "dev", "travel", "bpe", Plant("drop-field", "small", "seat"), epochs=8,
       learning_rate=3e-3, save="none", purpose=False),
)}


def families(split: str | None = None) -> list[Family]:
    return [f for f in FAMILIES.values() if split is None or f.split == split]
