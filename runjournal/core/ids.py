"""Identifiers at the API boundary: one rule set, checked before anything is published or stored.

docs/design/protocol.md § Identifiers and keys; the rules for users: docs/reference/identifiers.md.
Every id a caller hands runjournal — run id, tenant id, agent name, user id, node name, call step, producer id,
approval call id, a framework thread id or checkpoint key part — is checked here by its :class:`IdRule`, and a
refusal is an :class:`InvalidIdError` naming the id's kind, the rule it breaks and the fix. The rules, in the order
they are checked:

1. **text**: a ``str``;
2. **empty**: at least one character (a node path may be empty: the run's top level);
3. **lone surrogate**: valid Unicode, so its UTF-8 bytes exist (one string, one byte sequence: Kafka keys, Redis
   keys and hashes all see bytes);
4. **too long**: at most :attr:`IdRule.max_bytes` UTF-8 bytes (per kind, below);
5. **control character**: no character of Unicode category ``Cc`` (C0 and C1 controls: U+0000, U+001F, tab,
   newline, DEL …), ``Cf`` (format: zero-width spaces and joiners, bidi overrides, the BOM, soft hyphen), ``Zl``
   or ``Zp`` (line and paragraph separators). U+001F joins the idempotency key's parts and the framework record
   keys' parts, so refusing ``Cc`` makes those joins injective; the others are refused because they are invisible
   or rewrite lines (an id read in a log, a terminal or the console must be the id);
6. **reserved character**: characters the stores the id reaches give a meaning (:attr:`IdRule.reserved`): ``{ }``
   in an id inside a Redis hash tag (``rj:{P:r:<run_id>}:plan`` — a ``}`` would end the tag early, so the slot
   would depend on a prefix of the id), ``/`` and ``#`` in node names (they build node paths), ``#`` in a producer
   id (it marks the incarnation), ``|`` and ``/`` in an approval call id (``run_id|call_id`` in the pending set; one
   segment of the console's decide route).

A ``:`` is allowed in a run id: the record key ``{run_id}:{epoch}:{seq}`` parses from the right
(``runjournal.schemas.keys``). Spaces and any other printable character are allowed.

Ids that name existing data (the commands that inspect, replay, approve or erase a run; the console's routes)
are checked with :meth:`IdRule.check_lookup` only — text, non-empty, valid Unicode — so data written before these
rules stays reachable; code that builds a URL, a glob or a file name from such an id escapes it where it does.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from runjournal.core.errors import RunjournalError

__all__ = [
    "AGENT",
    "CALL_ID",
    "KEY_PART",
    "NODE_NAME",
    "NODE_PATH",
    "PRODUCER_ID",
    "RULES",
    "RUN_ID",
    "STEP",
    "TENANT_ID",
    "THREAD_ID",
    "USER_ID",
    "IdRule",
    "InvalidIdError",
]

_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})
_ASCII_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class InvalidIdError(RunjournalError, ValueError):
    """An identifier breaks a rule of :mod:`runjournal.core.ids`; nothing was published or stored.

    A ``ValueError`` too (what the checks raised before). The message names the kind, the rule and the fix.

    Attributes:
        kind: what the id is (``run id``, ``node name`` …).
        value: the refused value (as given).
        rule: the broken rule: ``text``, ``empty``, ``lone surrogate``, ``too long``, ``control character`` or
            ``reserved character``.
    """

    def __init__(self, kind: str, value: object, rule: str, detail: str, fix: str) -> None:
        self.kind = kind
        self.value = value
        self.rule = rule
        shown = value if not isinstance(value, str) or len(value) <= 80 else value[:77] + "..."
        super().__init__(f"{kind} {shown!r} is refused ({rule}: {detail}); {fix} (docs/reference/identifiers.md)")


@dataclass(frozen=True, slots=True)
class IdRule:
    """The rules of one kind of id (module docstring)."""

    kind: str
    """What the id is, as messages name it."""
    max_bytes: int
    """Longest UTF-8 encoding accepted."""
    reserved: str = ""
    """Characters refused in this kind (besides the control characters every kind refuses)."""
    why_reserved: str = ""
    """Why :attr:`reserved` are refused (for the message)."""
    empty_ok: bool = False
    """True when ``""`` is a value (a node path at the run's top level)."""

    def problem(self, value: object) -> tuple[str, str, str] | None:
        """``(rule, detail, fix)`` of the first rule ``value`` breaks, or None when it is a valid id of this kind."""
        if not isinstance(value, str):
            return "text", f"a {type(value).__name__}", f"pass the {self.kind} as a str"
        if not value:
            return (None if self.empty_ok else
                    ("empty", "no characters", f"give a non-empty {self.kind}"))
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError as exc:
            return ("lone surrogate", f"U+{ord(value[exc.start]):04X} at index {exc.start} is not Unicode text",
                    "pass valid text (decode bytes as UTF-8 with errors='strict')")
        if size > self.max_bytes:
            return ("too long", f"{size} UTF-8 bytes, at most {self.max_bytes}",
                    f"use a shorter {self.kind} (a digest of a long name, for example)")
        bad = _first_control(value)
        if bad is not None:
            return ("control character",
                    f"U+{ord(value[bad]):04X} ({unicodedata.category(value[bad])}) at index {bad}",
                    f"remove control, format and line-separator characters from the {self.kind}")
        for i, ch in enumerate(value):
            if ch in self.reserved:
                return ("reserved character", f"{ch!r} at index {i}: {self.why_reserved}",
                        f"use a {self.kind} without {' '.join(repr(c) for c in self.reserved)}")
        return None

    def check(self, value: object) -> str:
        """``value`` when it is a valid id of this kind.

        Raises:
            InvalidIdError: the first rule it breaks (module docstring), named with the fix.
        """
        found = self.problem(value)
        if found is not None:
            raise InvalidIdError(self.kind, value, *found)
        return value  # type: ignore[return-value]  # problem() returned None: a str

    def check_optional(self, value: object) -> str | None:
        """None, or ``value`` checked by :meth:`check` (an optional id: ``user_id``)."""
        return None if value is None else self.check(value)

    def check_lookup(self, value: object) -> str:
        """``value`` when it can name existing data: a non-empty ``str`` of valid Unicode (the commands and routes
        that read, replay, approve or erase what was written before these rules existed).

        Raises:
            InvalidIdError: not text, empty, or a lone surrogate.
        """
        found = self.problem(value)
        if found is not None and found[0] in ("text", "empty", "lone surrogate"):
            raise InvalidIdError(self.kind, value, *found)
        return value  # type: ignore[return-value]


def _first_control(value: str) -> int | None:
    """The index of the first character of category Cc, Cf, Zl or Zp in ``value``, or None."""
    if value.isascii():
        m = _ASCII_CONTROL.search(value)
        return None if m is None else m.start()
    for i, ch in enumerate(value):
        if unicodedata.category(ch) in _REFUSED_CATEGORIES:
            return i
    return None


_HASH_TAG = "inside a Redis hash tag {…} a '}' ends the tag early and moves the key's cluster slot"

RUN_ID = IdRule("run id", 256, "{}", _HASH_TAG)
"""A run's id (``start_run``, ``resume``, ``continue_run``): 256 bytes; no ``{ }`` (``rj:{P:r:<run_id>}:…``)."""
THREAD_ID = IdRule("thread id", 256, "{}", _HASH_TAG)
"""A framework thread id (LangGraph ``thread_id``, Agents SDK session): it *is* the run id, same rules."""
TENANT_ID = IdRule("tenant id", 128)
"""The owning tenant: 128 bytes."""
AGENT = IdRule("agent", 128)
"""The agent's name: 128 bytes."""
USER_ID = IdRule("user id", 256)
"""A user's id (an e-mail address fits: 254): 256 bytes."""
NODE_NAME = IdRule("node name", 128, "/#", "'/' separates a node path's names and '#' marks the n-th entry")
"""A node's name (``RunHandle.node``): 128 bytes; no ``/`` or ``#`` (they build node paths)."""
NODE_PATH = IdRule("node path", 2048, empty_ok=True)
"""A node path (``outer/inner#2``, or ``#<step>``) as the idempotency key and ``emit(node_id=…)`` take it: 2048
bytes; ``""`` is the top level."""
STEP = IdRule("call step", 256)
"""A call's stable name (``call(step=…)``, a model's tool_call_id): 256 bytes; ``/`` and ``#`` allowed (its key path
``#<step>`` never equals a node path, which cannot start with ``#``)."""
PRODUCER_ID = IdRule("producer id", 128, "#{}",
                     "'#' marks the incarnation (name#n) and braces would break the Redis hash tag {P:i:<instance>}")
"""An instance's name (``Journal(producer_id=…)``): 128 bytes; no ``#`` (incarnations are ``name#n``), no ``{ }``."""
CALL_ID = IdRule("approval call id", 256, "|/",
                 "the pending-approvals set holds 'run_id|call_id' and the console's decide route takes it as one "
                 "path segment")
"""The ``call_id`` of an approval (``request_approval``, ``await_approval``): 256 bytes; no ``|`` or ``/``."""
KEY_PART = IdRule("checkpoint key part", 1024)
"""A part of a framework record's key (a LangGraph checkpoint namespace, checkpoint id, channel, task id): 1024
bytes; the control-character rule keeps U+001F, the parts' separator, out of it."""

RULES: tuple[IdRule, ...] = (RUN_ID, THREAD_ID, TENANT_ID, AGENT, USER_ID, NODE_NAME, NODE_PATH, STEP, PRODUCER_ID,
                             CALL_ID, KEY_PART)
"""Every kind, for documentation and tests."""
