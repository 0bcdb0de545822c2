"""The journal's content fields, encrypted on the way out and read back (decision 0059; issue 33).

:data:`CONTENT_FIELDS` names, per event type, the payload fields that carry content and the **address** each is bound
to (the middle part of its :class:`~runjournal.core.crypto.Binding`): the event id for content only ever read from its
own event (a message, a correction), and a stable address for content the projection and the recovery plan copy out
of their event without its id — ``run`` (the run's input, output and error), ``call:<call id>`` (a call's arguments,
result and error), ``node:<node path>`` (a node's error). So a token moved to another run, call, node or field does
not decrypt, and every copy a reader holds names where it belongs. Ids, seq, epoch, type, status, digests and timings
stay in clear.

:class:`ContentCrypto` is what a :class:`~runjournal.producers.journal.Journal` uses: :meth:`~ContentCrypto.seal` on
every event it publishes (encrypting with ``RUNJOURNAL_ENCRYPTION=on``; escaping plain text that starts with
``rjenc:`` either way) and :meth:`~ContentCrypto.open` on what it reads back. Digests are computed over the plain
text before sealing: idempotency and recovery never need a key.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from runjournal.core.crypto.errors import EncryptedContentError
from runjournal.core.crypto.keys import KeyScope, kek_id_for
from runjournal.core.crypto.token import Binding, decode_plain, encode_plain, is_encrypted, parse_token
from runjournal.core.errors import ConfigError
from runjournal.producers.spend import RESERVE_TOOL, SETTLE_TOOL
from runjournal.schemas import Event, EventType

if TYPE_CHECKING:
    from runjournal.core.crypto.cipher import FieldCipher
    from runjournal.core.settings import Settings
    from runjournal.producers.plan import RecoveryPlan

__all__ = ["CLEAR_TOOLS", "CONTENT_FIELDS", "ENCRYPTED", "ContentCrypto", "address_of", "call_address",
           "approval_address", "payload_address", "signal_address"]

ENCRYPTED = "encrypted"
"""What a reader without the key shows for encrypted content."""


def call_address(call_id: str) -> str:
    """The address of a tool call's arguments, result and error."""
    return f"call:{call_id}"


def payload_address(call_id: str) -> str:
    """The address of a call's large result stored by reference (``{prefix}.payloads``, or Redis)."""
    return f"call:{call_id}:ref"


def approval_address(call_id: str) -> str:
    """The address of a result settled by hand while it waits in the run's approval inbox (``runjournal settle``)."""
    return f"approval:{call_id}"


def signal_address(name: str) -> str:
    """The address of signal ``name``'s payload in the run's signal inbox (``runjournal signal``; decision 0050)."""
    return f"signal:{name}"


_RUN: Callable[[Event], str] = lambda e: "run"  # noqa: E731
_CALL: Callable[[Event], str] = lambda e: call_address(str(e.payload["call_id"]))  # noqa: E731
_NODE: Callable[[Event], str] = lambda e: f"node:{e.payload['node_path']}"  # noqa: E731
_EVENT: Callable[[Event], str] = lambda e: f"event:{e.event_id}"  # noqa: E731

CONTENT_FIELDS: Mapping[EventType, tuple[tuple[str, Callable[[Event], str]], ...]] = {
    EventType.RUN_STARTED: (("input_json", _RUN),),
    EventType.NODE_FAILED: (("error", _NODE),),
    EventType.TOOL_CALL_INTENDED: (("args_json", _CALL),),
    EventType.TOOL_CALL_COMMITTED: (("result_json", _CALL),),
    EventType.TOOL_CALL_FAILED: (("error", _CALL),),
    EventType.TOOL_CALL_RECONCILED: (("result_json", _CALL),),
    EventType.APPROVAL_REQUESTED: (("args_json", _CALL),),
    EventType.RUN_SUCCEEDED: (("output_json", _RUN),),
    EventType.RUN_FAILED: (("error", _RUN),),
    EventType.USER_CORRECTION: (("subject", _EVENT), ("text", _EVENT)),
    EventType.MESSAGE: (("content", _EVENT),),
}
"""Event type → its content fields and each one's address. Not encrypted: operators' texts (approval comments and
reasons, cancel reasons), the recovery job's ``plan_json`` (counts and positions), the spend steps' arguments and
results (:data:`CLEAR_TOOLS`), and everything that is not a payload field."""

CLEAR_TOOLS = frozenset({RESERVE_TOOL, SETTLE_TOOL})
"""Tools whose calls are the library's accounting, not content: the spend ledger's reserve and settle steps (model
name, token counts, cost). Their arguments and results stay in clear so the ledger's checks, the console's spend and
``runjournal spend`` fold them without a key (docs/guide/spend.md)."""


def address_of(event: Event, name: str) -> str | None:
    """The address field ``name`` of ``event`` is bound to, or None when it is not a content field."""
    for field_name, address in CONTENT_FIELDS.get(event.type, ()):
        if field_name == name:
            return address(event)
    return None


class ContentCrypto:
    """Seals an agent's events and opens what it reads back.

    Args:
        settings: where the key service is (``RUNJOURNAL_KMS``, ``RUNJOURNAL_KEYS_DIR``) and whether to encrypt
            (``RUNJOURNAL_ENCRYPTION``). A reader builds its cipher the first time it meets a token, so a journal that
            does not encrypt still reads runs written by one that did, given the keys.
        cipher: the cipher to use instead of the settings' (tests, an application with its own key service).
        encrypt: encrypt on :meth:`seal` (default: ``settings.encryption == "on"``, or True with ``cipher``).

    Raises:
        ConfigError: ``RUNJOURNAL_KMS`` names a key service not built in this release, or ``cryptography`` is not
            installed (with ``encryption=on``).
    """

    def __init__(self, settings: Settings | None = None, *, cipher: FieldCipher | None = None,
                 encrypt: bool | None = None) -> None:
        self._settings = settings
        if cipher is None and settings is not None and settings.encryption == "on":
            try:
                from runjournal.core.crypto.cipher import cipher_from_settings
            except ImportError as exc:  # the core install without the extra
                raise ConfigError("RUNJOURNAL_ENCRYPTION=on needs the `cryptography` package: "
                                  "pip install 'runjournal[encryption]'") from exc
            cipher = cipher_from_settings(settings)
        self._cipher = cipher
        self.encrypting = (cipher is not None) if encrypt is None else (encrypt and cipher is not None)
        self._lock = threading.Lock()
        self._parents: dict[str, str] = {}
        """KEK id → its parent's (``""``: none), as the key service said: a KEK's parent never changes."""

    # -- writing ------------------------------------------------------------------------------------------------
    def seal(self, event: Event, subject: str | None) -> Event:
        """``event`` with its content fields encrypted under the scope's key (the tenant's, or ``subject``'s: the run's
        user; a MESSAGE or USER_CORRECTION with a ``user_id`` of its own is that user's) — or, when not encrypting,
        with plain text that starts with ``rjenc:`` escaped. The same object when nothing changes.

        Raises:
            KeyDestroyedError: the scope's key was destroyed (an erased subject or tenant); nothing is produced.
            KeyUnavailableError: the key service did not answer (transient).
        """
        fields = CONTENT_FIELDS.get(event.type)
        if not fields:
            return event
        payload = event.payload
        encrypting = self.encrypting and self._cipher is not None and payload.get("tool") not in CLEAR_TOOLS
        changed: dict[str, Any] | None = None
        for name, address in fields:
            value = payload.get(name)
            if value is None:
                continue
            if encrypting and self._cipher is not None:
                own = payload.get("user_id") if event.type in (EventType.MESSAGE, EventType.USER_CORRECTION,
                                                               EventType.RUN_STARTED) else None
                scope = KeyScope(event.tenant_id, own or subject)
                stored = self._cipher.encrypt(value, scope, Binding(event.run_id, address(event), name))
            else:
                stored = encode_plain(value)
                if stored is value:
                    continue
            if changed is None:
                changed = dict(payload)
            changed[name] = stored
        return event if changed is None else dataclasses.replace(event, payload=changed)

    def seal_text(self, text: str, *, tenant_id: str, subject: str | None, run_id: str, address: str,
                  field: str) -> str:
        """One value's stored form (a large result before it is written by reference); see :meth:`seal`."""
        if self.encrypting and self._cipher is not None:
            return self._cipher.encrypt(text, KeyScope(tenant_id, subject), Binding(run_id, address, field))
        return encode_plain(text)

    # -- reading ------------------------------------------------------------------------------------------------
    def key_destroyed(self, tenant_id: str, subject: str | None) -> bool:
        """True when the key of ``subject`` of ``tenant_id`` (the tenant's with None), or its tenant's, was destroyed
        (``runjournal erase --tenant/--subject``; decision 0059). Asks the key service each time (no cache).

        Raises:
            KeyUnavailableError: the key service did not answer (transient).
            EncryptedContentError: this reader has no key service (no settings, or ``cryptography`` missing).
        """
        scope = KeyScope(tenant_id, subject)
        kms = self._reader().kms
        return any(kms.state(kek).status == "destroyed" for kek in (scope.kek_id, scope.parent_kek_id) if kek)

    def has_key(self, tenant_id: str, subject: str | None) -> bool:
        """Whether this process's key service holds the live key of ``subject`` of ``tenant_id`` (the tenant's with
        None). A process that seals for a run it did not start (an operator's signal or settlement) checks first: a
        key directory that is not the agents' would make a key of its own, and the run could never open the value.

        Raises:
            KeyUnavailableError: the key service did not answer (transient).
            EncryptedContentError: this reader has no key service.
        """
        return self._reader().kms.state(KeyScope(tenant_id, subject).kek_id).status == "active"

    def belongs_to(self, value: str, tenant_id: str) -> bool:
        """Whether the token ``value`` is sealed under ``tenant_id``'s key or one of its subjects' (whose parent it is).

        A token's binding names its run, address and field, not its tenant: a reader that opens content only for some
        tenants (the memory extractor's grant) checks this first, so an event that names a granted tenant but
        carries another tenant's token is not opened on the granted tenant's behalf.

        Raises:
            TokenFormatError: ``value`` is not a token this version reads.
            KeyUnavailableError: the key service did not answer (transient).
            EncryptedContentError: this reader has no key service.
        """
        kek = parse_token(value).kek_id
        tenant = kek_id_for(tenant_id)
        if kek == tenant:
            return True
        with self._lock:
            parent = self._parents.get(kek)
        if parent is None:
            state = self._reader().kms.state(kek)
            parent = state.parent or ""
            if state.status == "active":  # a destroyed or unknown key says no parent: asked again next time
                with self._lock:
                    if len(self._parents) >= 65_536:
                        self._parents.clear()
                    self._parents[kek] = parent
        return parent == tenant

    def open(self, value: str | None, run_ids: str | Sequence[str], address: str, field: str) -> str | None:
        """The plain text of a stored value (None stays None).

        Args:
            run_ids: the run the value was read from, then its fork lineage (a fork copies its source's tokens,
                which stay bound to the source: the one whose binding the token names is used).
            address, field: where the value belongs (:data:`CONTENT_FIELDS`).

        Raises:
            EncryptedContentError (and its subclasses): the value is a token this reader cannot read.
            KeyUnavailableError: the key service did not answer (transient).
        """
        if value is None:
            return None
        if not is_encrypted(value):
            return decode_plain(value)
        runs = [run_ids] if isinstance(run_ids, str) else list(run_ids)
        token = parse_token(value)
        binding = next((b for b in (Binding(r, address, field) for r in runs) if b.hint() == token.hint),
                       Binding(runs[0], address, field))
        return self._reader().decrypt(value, binding)

    def reveal(self, value: str | None, run_ids: str | Sequence[str], address: str, field: str) -> str | None:
        """:meth:`open`, or :data:`ENCRYPTED` when this reader cannot read the value (no key, a destroyed one …)."""
        try:
            return self.open(value, run_ids, address, field)
        except EncryptedContentError:
            return ENCRYPTED

    def reveal_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """A run state's JSON form (``RunState.to_json`` parsed) with its content fields opened — or
        :data:`ENCRYPTED` where this reader cannot read them: the run's input, output and error, each node's error,
        each call's result and error, each pending approval's arguments. The structure is left as it is."""
        runs = [str(state.get("run_id")), *(state.get("fork_lineage") or ())]
        out = dict(state)
        for name in ("input_json", "output_json", "error"):
            if isinstance(out.get(name), str):
                out[name] = self.reveal(out[name], runs, "run", name)
        for group, address, names in (("records", call_address, ("result_json", "error")),
                                      ("pending_approvals", call_address, ("args_json",)),
                                      ("nodes", lambda key: f"node:{key}", ("error",))):
            items = out.get(group)
            if not isinstance(items, dict):
                continue
            opened = {}
            for key, item in items.items():
                if isinstance(item, dict):
                    item = dict(item)
                    where = address(str(item.get("call_id", key)) if group == "records" else str(key))
                    for name in names:
                        if isinstance(item.get(name), str):
                            item[name] = self.reveal(item[name], runs, where, name)
                opened[key] = item
            out[group] = opened
        return out

    def open_plan(self, plan: RecoveryPlan) -> RecoveryPlan:
        """``plan`` with its content (the run's input, each call's result and error) in plain text: the handle that
        resumes a run works with plain text only.

        Raises:
            EncryptedContentError (and its subclasses): a value cannot be read (a note names the run).
        """
        runs = [plan.run_id, *plan.fork_lineage]
        try:
            calls = {key: dataclasses.replace(
                call, result_json=self.open(call.result_json, runs, call_address(call.call_id), "result_json"),
                error=self.open(call.error, runs, call_address(call.call_id), "error"))
                for key, call in plan.calls.items()}
            return dataclasses.replace(plan, calls=calls, input_json=self.open(plan.input_json, runs, "run",
                                                                               "input_json"))
        except EncryptedContentError as exc:
            exc.add_note(f"run {plan.run_id}: its recorded content cannot be read; the journal that resumes it needs "
                         "its keys (docs/guide/encryption.md)")
            raise

    def _reader(self) -> FieldCipher:
        with self._lock:
            if self._cipher is None:
                try:
                    from runjournal.core.crypto.cache import DataKeyCache
                    from runjournal.core.crypto.cipher import FieldCipher, kms_from_settings
                except ImportError as exc:
                    raise EncryptedContentError("the value is encrypted and the `cryptography` package is missing: "
                                                "pip install 'runjournal[encryption]'") from exc
                if self._settings is None:
                    raise EncryptedContentError("the value is encrypted and this reader has no key service")
                s = self._settings
                self._cipher = FieldCipher(kms_from_settings(s), cache=DataKeyCache(s.key_cache_size,
                                                                                    s.key_cache_ttl_ms))
            return self._cipher
