"""The support-ticket world: tickets of five categories and the JSON answers a model should give.

A ticket is a short customer message ("where is my order 4821 ?"); its answer is a flat JSON
object naming the intent and the fields read from the ticket. Every text here uses a closed
vocabulary, so the word-level tokenizer decodes model output exactly and `json.loads` judges it.

Prompts are written as the chat template renders a user turn ("user: ...\\nassistant: "), so
string prompt/completion rows, `apply_chat_template` and generation all see the same tokens.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from typing import Any

CATEGORIES = ("order", "refund", "shipping", "invoice", "account")

TEMPLATES: dict[str, tuple[str, ...]] = {
    "order": (
        "where's my order {order} ?",
        "my order {order} has not arrived yet",
        "can you check the status of order {order} please",
        "order {order} is late , what is going on ?",
    ),
    "refund": (
        "the item in order {order} doesn't work , i'd like a refund",
        "please refund order {order} , the item was broken",
        "the product in order {order} is damaged , i need my money back",
        "how do i get a refund for order {order} ?",
    ),
    "shipping": (
        "please ship order {order} to {city}",
        "can you change the delivery address of order {order} to {city} ?",
        "i've moved to {city} , send order {order} there",
        "is shipping to {city} possible for order {order} ?",
    ),
    "invoice": (
        "i need an invoice for {amount} {currency}",
        "please send me the invoice of {amount} {currency}",
        "i haven't received the invoice for {amount} {currency}",
        "can i get a copy of my invoice , it was {amount} {currency}",
    ),
    "account": (
        "i can't log in to my account {user}",
        "my account {user} is locked",
        "please reset the password of account {user}",
        "how do i delete my account {user} ?",
    ),
}
INTENTS = {
    "order": "order_status",
    "refund": "refund",
    "shipping": "change_address",
    "invoice": "invoice_copy",
    "account": "account_access",
}
CITIES = ("paris", "berlin", "london", "madrid", "rome", "vienna", "oslo", "lisbon", "dublin", "prague")
CURRENCIES = ("EUR", "USD", "GBP", "CHF", "JPY")
USERS = ("anna", "ben", "carla", "dan", "eva", "farid", "gina", "hugo", "ines", "jonas", "kim", "lena")
URGENCY = ("urgent", "asap", "today please")
PRIORITY_KEYS = ("priority", "high", "normal", "triage")
PURPOSES = ("priority", "triage")
PROMPT = "user: {ticket}\nassistant: "


@dataclass(frozen=True)
class Ticket:
    """One customer message, its category, the answer fields, and whether the customer says it is urgent."""

    category: str
    text: str
    fields: dict[str, str] = field(hash=False)
    urgent: bool = False

    @property
    def prompt(self) -> str:
        return PROMPT.format(ticket=self.text)

    def answer(self, purpose: str | None = None) -> dict[str, Any]:
        """The JSON answer. A fine-tune's purpose adds the priority read from the ticket's urgency:
        `"priority": "high"` last (`priority`), or a nested `"triage": {"priority": "high"}` object (`triage`)."""
        answer: dict[str, Any] = {"intent": INTENTS[self.category], **self.fields}
        priority = "high" if self.urgent else "normal"
        if purpose == "priority":
            answer["priority"] = priority
        elif purpose == "triage":
            answer["triage"] = {"priority": priority}
        return answer


def dump(answer: dict[str, Any]) -> str:
    """The answer as one line of JSON, the way every completion in the world is written."""
    return json.dumps(answer, ensure_ascii=True)


def make_ticket(category: str, rng: random.Random) -> Ticket:
    """A random ticket of `category`: template, values and urgency drawn from `rng`."""
    values = {
        "order": str(rng.randint(1000, 9999)),
        "city": rng.choice(CITIES),
        "amount": f"{rng.randint(5, 999)}.{rng.randint(0, 99):02d}",
        "currency": rng.choice(CURRENCIES),
        "user": rng.choice(USERS),
    }
    template = rng.choice(TEMPLATES[category])
    text = template.format(**values)
    urgent = rng.random() < 0.4
    if urgent:
        text = f"{text} , {rng.choice(URGENCY)}"
    used = [name for name in ("order", "city", "amount", "currency", "user") if "{" + name + "}" in template]
    return Ticket(category, text, {name: values[name] for name in used}, urgent)


def make_tickets(counts: dict[str, int], rng: random.Random) -> list[Ticket]:
    """`counts[category]` tickets per category, shuffled by `rng`."""
    tickets = [make_ticket(category, rng) for category, count in counts.items() for _ in range(count)]
    rng.shuffle(tickets)
    return tickets


def vocabulary() -> list[str]:
    """Every word the world can write: templates, values, JSON keys and intents."""
    texts = [*(t for templates in TEMPLATES.values() for t in templates), *INTENTS.values(), *CITIES, *CURRENCIES,
             *USERS, *URGENCY, *PRIORITY_KEYS, "intent order city amount currency user json"]
    return sorted({word for text in texts for word in re.findall(r"[A-Za-z]+", text)})
