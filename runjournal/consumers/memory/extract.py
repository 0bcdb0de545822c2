"""Extractors: which statements in a journal event are worth remembering.

An :class:`Extractor` turns one decoded event (plus the small :class:`RunContext` kept from its
run's RUN_STARTED) into :class:`Draft` statements — text, kind and subject. It never decides
scope or provenance: the extractor service builds those from the event envelope, so no extractor
(rules today, an LLM tomorrow) can place an item in another tenant.

:class:`RuleExtractor` is the default, deterministic and documented rule set:

* ``USER_CORRECTION`` → one :attr:`ItemKind.CORRECTION` item; text and subject as the event says
  (subject slugged: ``"Seat Preference"`` → ``seat_preference``).
* ``MESSAGE`` with ``role == "user"`` (other roles are ignored) → split into sentences; the first
  matching rule per sentence, in this order (matched case-insensitively, contractions expanded):

  1. ``I don't want …`` / ``I never want …`` / ``I do not want …`` → CONSTRAINT
  2. ``always …`` / ``never …`` (anywhere, e.g. "please always book aisle seats") → CONSTRAINT
  3. ``I can't …`` / ``I cannot …`` / ``I am unable to …`` → CONSTRAINT
  4. ``I am allergic to …`` / ``I am vegetarian|vegan|gluten-free|lactose intolerant`` → CONSTRAINT
  5. ``I [now|really|still|actually|also] prefer|like|love …``, ``I'd prefer|rather …``,
     ``I'd like <not "to">…`` → PREFERENCE ("I'd like to book…" is a request, not a preference)
  6. ``my <attribute> is|are <value>`` → FACT

  A match whose object is empty or a bare pronoun ("I like it") is dropped. At most
  :data:`MAX_ITEMS_PER_EVENT` items per message.
* ``RUN_SUCCEEDED`` / ``RUN_FAILED`` → one :attr:`ItemKind.RUN_OUTCOME` item ("A prior run of agent
  airline succeeded for input …"), subject None (outcomes never supersede each other).

Subjects (the conflict key) come from :data:`TOPICS`: the first topic with a keyword in the
sentence (``window``, ``aisle``, ``seat`` → ``seat_preference``); for a FACT the attribute is
tried first ("my seat preference is aisle" → ``seat_preference``, "my home airport is SFO" →
``home_airport``); otherwise ``<kind>:<first words of the object>``.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from runjournal.consumers.memory.items import ItemKind, slug
from runjournal.core.crypto.token import decode_plain, is_encrypted
from runjournal.schemas.events import Event, EventType

__all__ = ["MAX_ITEMS_PER_EVENT", "TOPICS", "Draft", "Extractor", "RuleExtractor", "RunContext", "RunContexts"]

#: Cap on items drawn from one event (a long pasted message yields at most this many).
MAX_ITEMS_PER_EVENT = 8
_MAX_TEXT = 500
_MAX_PART = 200

#: (subject, keywords): the first subject with a keyword (whole words) in the text wins.
TOPICS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("seat_preference", ("seat", "seats", "window", "aisle", "legroom", "exit row")),
    ("dietary_restriction", ("allergic", "allergy", "allergies", "intolerant", "lactose", "gluten", "nuts",
                             "peanuts", "dairy")),
    ("meal_preference", ("meal", "meals", "vegetarian", "vegan", "halal", "kosher", "food")),
    ("flight_time_preference", ("red-eye", "red eye", "morning", "evening", "overnight", "departure time",
                                "early flights", "late flights")),
    ("layover_preference", ("layover", "layovers", "connection", "connections", "stopover", "nonstop",
                            "non-stop", "direct flight", "direct flights")),
    ("cabin_class_preference", ("economy", "business class", "first class", "cabin")),
    ("airline_preference", ("airline", "airlines", "carrier")),
    ("hotel_preference", ("hotel", "hotels", "room", "rooms")),
    ("contact_preference", ("email", "e-mail", "phone", "sms", "text message", "call me", "contact")),
    ("language_preference", ("language", "english", "french", "german", "spanish")),
    ("payment_preference", ("credit card", "card", "invoice", "payment", "pay")),
    ("currency_preference", ("currency", "eur", "usd", "dollars", "euros")),
)
_TOPIC_RES = tuple((subject, re.compile(r"\b(?:" + "|".join(re.escape(k) for k in kws) + r")\b"))
                   for subject, kws in TOPICS)

_CONTRACTIONS = (("’", "'"), ("i'd", "i would"), ("i'm", "i am"), ("don't", "do not"), ("can't", "cannot"),
                 ("won't", "will not"), ("i've", "i have"))
_ADVERB = r"(?:(?:now|really|still|actually|also|generally|usually) )?"
_RULES: tuple[tuple[ItemKind, re.Pattern[str]], ...] = (
    (ItemKind.CONSTRAINT, re.compile(r"\bi (?:do not|never|do not ever) want (?:to )?(?P<obj>.+)")),
    (ItemKind.CONSTRAINT, re.compile(r"\b(?P<obj>(?:always|never) .+)")),
    (ItemKind.CONSTRAINT, re.compile(r"\bi (?:cannot|can not|am unable to) (?P<obj>.+)")),
    (ItemKind.CONSTRAINT, re.compile(
        r"\bi am (?P<obj>allergic to .+|vegetarian|vegan|gluten[- ]free|lactose intolerant)")),
    (ItemKind.PREFERENCE, re.compile(
        rf"\bi {_ADVERB}(?:prefer|like|love|would prefer|would rather|would like (?!to\b))(?P<obj>.*)")),
    (ItemKind.FACT, re.compile(r"\bmy (?P<attr>[a-z][a-z -]{0,40}?) (?:is|are) (?P<obj>.+)")),
)
_PRONOUNS = frozenset({"it", "that", "this", "them", "these", "those", "to", ""})
_SENTENCES = re.compile(r"(?<=[.!?;])\s+|\n+")


@dataclass(frozen=True, slots=True)
class Draft:
    """One statement an extractor found; the service adds scope and provenance."""

    text: str
    """The statement to remember (embedded as is), at most 500 characters."""
    kind: ItemKind
    """What sort of statement it is."""
    subject: str | None
    """Conflict key (``seat_preference``); None never conflicts."""


@dataclass(frozen=True, slots=True)
class RunContext:
    """What the extractor remembers of a run from its RUN_STARTED (not execution state: just who and what for)."""

    tenant_id: str
    """The run's tenant (also on every event's envelope)."""
    user_id: str | None
    """RUN_STARTED's ``user_id``."""
    agent: str | None
    """RUN_STARTED's ``agent``."""
    input_summary: str
    """RUN_STARTED's ``input_json``, cut to 200 characters."""
    sealed: bool = False
    """RUN_STARTED's ``input_json`` was encrypted: items of this run are stored sealed (decision 0059)."""


class RunContexts:
    """An LRU of :class:`RunContext` by run id (in memory; lost on restart, then items of a run
    already started carry the envelope tenant and the event's own ``user_id`` only).

    Args:
        max_runs: runs kept (default 10,000); the least recently seen is dropped first.
    """

    def __init__(self, max_runs: int = 10_000) -> None:
        self.max_runs = max_runs
        self._runs: OrderedDict[str, RunContext] = OrderedDict()

    def observe(self, event: Event) -> RunContext | None:
        """Record RUN_STARTED's context; return the event's run context (None when unknown)."""
        if event.type is EventType.RUN_STARTED:
            p = event.payload
            self._runs[event.run_id] = RunContext(event.tenant_id, p.get("user_id") or None,
                                                  p.get("agent") or None, _cut(plain(p.get("input_json")) or "",
                                                                               _MAX_PART))
        ctx = self._runs.get(event.run_id)
        if ctx is not None:
            self._runs.move_to_end(event.run_id)
            while len(self._runs) > self.max_runs:
                self._runs.popitem(last=False)
        return ctx

    def __len__(self) -> int:
        return len(self._runs)


@runtime_checkable
class Extractor(Protocol):
    """Finds memorable statements in one event. Must be deterministic for a given event (redelivery
    re-extracts, and point ids derive from the item's index), and must not do I/O per call unless it
    is prepared to be retried."""

    version: str
    """Name and version stored in every item's provenance (``rules@1``); bump it when output changes."""

    def extract(self, event: Event, context: RunContext | None) -> list[Draft]:
        """Statements in ``event`` (empty when none), in a stable order."""
        ...


class RuleExtractor:
    """The documented rule set of this module's docstring (no model, no I/O)."""

    version = "rules@1"

    def extract(self, event: Event, context: RunContext | None) -> list[Draft]:
        """See the module docstring for the rules. Returns at most :data:`MAX_ITEMS_PER_EVENT` drafts."""
        p = event.payload
        if event.type is EventType.USER_CORRECTION:
            text = _cut(plain(p.get("text")) or "", _MAX_TEXT)
            return [Draft(text, ItemKind.CORRECTION, slug(plain(p.get("subject")) or "", max_words=6) or None)] \
                if text else []
        if event.type is EventType.MESSAGE:
            return self._message(p.get("role") or "", plain(p.get("content")) or "")
        if event.type in (EventType.RUN_SUCCEEDED, EventType.RUN_FAILED):
            return [Draft(_outcome_text(event, context), ItemKind.RUN_OUTCOME, None)]
        return []

    def _message(self, role: str, content: str) -> list[Draft]:
        if role.lower() != "user":
            return []
        out: list[Draft] = []
        for sentence in _SENTENCES.split(content):
            draft = _match(sentence.strip())
            if draft is not None:
                out.append(draft)
                if len(out) == MAX_ITEMS_PER_EVENT:
                    break
        return out


def _match(sentence: str) -> Draft | None:
    norm = _normalise(sentence)
    for kind, rule in _RULES:
        m = rule.search(norm)
        if m is None:
            continue
        obj = m["obj"].strip(" .!?;,")
        if obj in _PRONOUNS:
            return None
        attr = m.groupdict().get("attr")
        return Draft(_cut(sentence.strip(), _MAX_TEXT), kind, _subject(kind, obj, attr, norm))
    return None


def _subject(kind: ItemKind, obj: str, attr: str | None, sentence: str) -> str:
    if attr is not None:
        return _topic(attr) or slug(attr)
    return _topic(sentence) or f"{kind.value}:{slug(obj, max_words=3)}"


def _topic(text: str) -> str | None:
    return next((subject for subject, rx in _TOPIC_RES if rx.search(text)), None)


def _normalise(sentence: str) -> str:
    s = sentence.lower()
    for a, b in _CONTRACTIONS:
        s = s.replace(a, b)
    return re.sub(r"\s+", " ", s)


def _outcome_text(event: Event, context: RunContext | None) -> str:
    agent = context.agent if context and context.agent else "unknown"
    head = f"A prior run of agent {agent}"
    if context and context.input_summary:
        head += f" for input {context.input_summary}"
    if event.type is EventType.RUN_SUCCEEDED:
        out = plain(event.payload.get("output_json"))
        return _cut(head + " succeeded" + (f"; output: {_cut(out, _MAX_PART)}" if out else ""), _MAX_TEXT)
    return _cut(f"{head} failed: {_cut(plain(event.payload.get('error')) or '', _MAX_PART)}", _MAX_TEXT)


def plain(value: str | None) -> str | None:
    """A content field's plain text; None for an encrypted one (decision 0059: the rules never see a key; the
    memory extractor opens the content of the tenants of its key grant before the rules run, see
    ``runjournal.consumers.memory.sealing``; any other token yields no memory and never becomes a memory item)."""
    if value is None or is_encrypted(value):
        return None
    return decode_plain(value)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
