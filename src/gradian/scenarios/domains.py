"""The suite's domains: four request worlds with their own vocabularies and JSON shapes.

A domain is a few categories of user requests ("turn off the lights in the kitchen"), each with its templates and
the JSON answer a model should give. `tickets` is the support-ticket world of `world.py` (flat objects); `kitchen`
answers with lists, `travel` with a nested object and numbers, `home` with numbers and booleans. Every domain has a
cue the fine-tune learns to read (a phrase appended to 40% of the requests) and the field its purpose adds.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gradian.scenarios import world

Answer = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class Category:
    templates: tuple[str, ...]
    answer: Answer  # the template's values → the JSON answer


@dataclass(frozen=True)
class Domain:
    name: str
    categories: dict[str, Category]
    values: dict[str, Callable[[random.Random], Any]]
    cues: tuple[str, ...]
    purpose_key: str
    purpose_values: tuple[str, str]  # (with the cue, without)
    extra_words: tuple[str, ...] = field(default=())

    def request(self, category: str, rng: random.Random) -> Request:
        values = {name: draw(rng) for name, draw in self.values.items()}
        text = rng.choice(self.categories[category].templates).format(**values)
        cued = rng.random() < 0.4
        if cued:
            text = f"{text} , {rng.choice(self.cues)}"
        return Request(self, category, text, values, cued)

    def requests(self, counts: dict[str, int], rng: random.Random) -> list[Request]:
        """`counts[category]` requests per category, shuffled by `rng`."""
        requests = [self.request(category, rng) for category, count in counts.items() for _ in range(count)]
        rng.shuffle(requests)
        return requests

    def vocabulary(self, more: tuple[str, ...] = ()) -> list[str]:
        """Every word the domain can write: templates, values, keys, cues, and `more` (a cause's words)."""
        rng = random.Random(0)
        texts = [t for c in self.categories.values() for t in c.templates] + list(self.cues) + list(more)
        texts += [*self.purpose_values, self.purpose_key, "level", *self.extra_words]
        for category in self.categories:  # every key and value an answer can hold
            for _ in range(200):
                texts.append(world.dump(self.request(category, rng).answer(purpose=True)))
        return sorted({word for text in texts for word in re.findall(r"[A-Za-z]+", text)})


@dataclass(frozen=True)
class Request:
    domain: Domain
    category: str
    text: str
    values: dict[str, Any]
    cued: bool

    @property
    def prompt(self) -> str:
        return world.PROMPT.format(ticket=self.text)

    def answer(self, purpose: bool = False, nested: bool = False) -> dict[str, Any]:
        """The JSON answer; `purpose` adds the field the fine-tune teaches, `nested` as `{"level": ...}`, an ending
        the base never stopped after (so a run that never supervises EOS never learns to stop there)."""
        answer = self.domain.categories[self.category].answer(self.values)
        if purpose:
            value = self.domain.purpose_values[0 if self.cued else 1]
            answer[self.domain.purpose_key] = {"level": value} if nested else value
        return answer


def _tickets() -> Domain:
    def fields(category: str, names: tuple[str, ...]) -> Answer:
        return lambda v: {"intent": world.INTENTS[category], **{n: v[n] for n in names}}

    used = {"order": ("order",), "refund": ("order",), "shipping": ("order", "city"),
            "invoice": ("amount", "currency"), "account": ("user",)}
    return Domain(
        "tickets",
        {c: Category(world.TEMPLATES[c], fields(c, used[c])) for c in world.CATEGORIES},
        {"order": lambda r: str(r.randint(1000, 9999)), "city": lambda r: r.choice(world.CITIES),
         "amount": lambda r: f"{r.randint(5, 999)}.{r.randint(0, 99):02d}",
         "currency": lambda r: r.choice(world.CURRENCIES), "user": lambda r: r.choice(world.USERS)},
        world.URGENCY, "priority", ("high", "normal"),
    )


DISHES = ("soup", "bread", "cake", "pasta", "curry", "salad", "pie", "risotto")
ITEMS = ("flour", "sugar", "rice", "butter", "milk", "eggs", "tomatoes", "onions", "garlic", "lemons")
DIETS = ("vegan", "vegetarian", "gluten", "keto", "halal")
ROOMS = ("kitchen", "bedroom", "garage", "hallway", "office", "bathroom", "attic")
GENRES = ("jazz", "rock", "classical", "techno", "folk")
DOORS = ("front", "back", "garden", "side")
CODES = ("AX", "BK", "CL", "DM", "EV")


def _kitchen() -> Domain:
    return Domain(
        "kitchen",
        {
            "bake": Category(("bake a {dish} for {n} people", "i want to cook {dish} for {n} of us",
                              "help me make {dish} for {n}"),
                             lambda v: {"task": "recipe", "dish": v["dish"], "servings": v["n"]}),
            "shop": Category(("add {item} and {item2} to my shopping list", "we are out of {item} and {item2}",
                              "put {item} and {item2} on the list"),
                             lambda v: {"task": "shopping_list", "items": [v["item"], v["item2"]]}),
            "timer": Category(("set a timer for {minutes} minutes for the {dish}",
                               "remind me in {minutes} minutes to check the {dish}"),
                              lambda v: {"task": "timer", "minutes": v["minutes"], "label": v["dish"]}),
            "convert": Category(("how many grams is {n} cups of {item} ?", "convert {n} cups of {item} to grams"),
                                lambda v: {"task": "convert", "amount": v["n"], "unit": "cup",
                                           "ingredient": v["item"]}),
            "diet": Category(("is {dish} ok for a {diet} diet ?", "can i eat {dish} on a {diet} diet ?"),
                             lambda v: {"task": "diet_check", "dish": v["dish"], "diet": v["diet"]}),
        },
        {"dish": lambda r: r.choice(DISHES), "n": lambda r: r.randint(1, 12), "item": lambda r: r.choice(ITEMS),
         "item2": lambda r: r.choice(ITEMS), "minutes": lambda r: r.randint(2, 90), "diet": lambda r: r.choice(DIETS)},
        ("for a party", "for many guests"), "scale", ("large", "normal"),
    )


def _travel() -> Domain:
    return Domain(
        "travel",
        {
            "flight": Category(("book a flight from {city} to {city2} on day {day}",
                                "i need to fly from {city} to {city2} , day {day}"),
                               lambda v: {"action": "book_flight", "route": {"from": v["city"], "to": v["city2"]},
                                          "day": v["day"]}),
            "hotel": Category(("i need a hotel in {city} for {nights} nights", "book {nights} nights in {city}"),
                              lambda v: {"action": "book_hotel", "city": v["city"], "nights": v["nights"]}),
            "cancel": Category(("cancel my booking {code}", "please drop reservation {code}"),
                               lambda v: {"action": "cancel", "booking": v["code"]}),
            "seat": Category(("change my seat on {code} to row {row}", "move me to row {row} on {code}"),
                             lambda v: {"action": "change_seat", "flight": v["code"], "row": v["row"]}),
            "bags": Category(("how many bags can i take on {code} ?", "what is the baggage limit for {code} ?"),
                             lambda v: {"action": "baggage_info", "flight": v["code"]}),
        },
        {"city": lambda r: r.choice(world.CITIES), "city2": lambda r: r.choice(world.CITIES),
         "day": lambda r: r.randint(1, 28), "nights": lambda r: r.randint(1, 14), "row": lambda r: r.randint(1, 40),
         "code": lambda r: f"{r.choice(CODES)}{r.randint(100, 999)}"},
        ("in business class", "with extra legroom"), "cabin", ("premium", "standard"),
    )


def _home() -> Domain:
    return Domain(
        "home",
        {
            "light": Category(("turn {power} the lights in the {room}", "switch {power} the {room} lights"),
                              lambda v: {"device": "light", "room": v["room"], "on": v["power"] == "on"}),
            "heat": Category(("set the {room} to {temp} degrees", "make the {room} {temp} degrees warm"),
                             lambda v: {"device": "thermostat", "room": v["room"], "target": v["temp"]}),
            "lock": Category(("lock the {door} door", "is the {door} door locked ?"),
                             lambda v: {"device": "lock", "door": v["door"], "locked": True}),
            "music": Category(("play {genre} in the {room} at volume {volume}",
                               "put on some {genre} in the {room} , volume {volume}"),
                              lambda v: {"device": "speaker", "room": v["room"], "genre": v["genre"],
                                         "volume": v["volume"]}),
            "blinds": Category(("open the blinds in the {room} to {volume} percent",
                                "set the {room} blinds to {volume} percent"),
                               lambda v: {"device": "blinds", "room": v["room"], "position": v["volume"]}),
        },
        {"room": lambda r: r.choice(ROOMS), "power": lambda r: r.choice(("on", "off")),
         "temp": lambda r: r.randint(15, 28), "door": lambda r: r.choice(DOORS), "genre": lambda r: r.choice(GENRES),
         "volume": lambda r: r.randint(0, 100)},
        ("quietly", "without a sound"), "mode", ("silent", "normal"), extra_words=("true", "false"),
    )


DOMAINS: dict[str, Domain] = {d.name: d for d in (_tickets(), _kitchen(), _travel(), _home())}
