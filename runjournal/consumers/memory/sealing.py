"""The memory extractor's key grant, sealed memory items, and how readers open them (issue 33, decision 0059).

* **The grant.** By default the extractor holds no key: an encrypted message, correction or outcome makes no memory
  (no token and no plain text of it is ever stored). ``RUNJOURNAL_MEMORY_KEY_GRANT`` (a comma list of tenants, or
  ``*``) grants it the keys of those tenants' runs: it opens their content fields with the key service
  (:class:`~runjournal.producers.encryption.ContentCrypto`, each field under its own binding) and extracts from the
  plain text. Content of other tenants stays closed. A token whose key was destroyed (or retired, moved, tampered)
  opens to nothing — that field makes no memory, and the record is neither retried nor dead-lettered; the key
  service away (``KeyUnavailableError``) is transient: the extractor waits under the one failure policy.
* **Sealed items.** An item drawn from encrypted content (the event's own content, or its run's encrypted input)
  is stored sealed: its ``text`` payload is a token under the item owner's key (``KeyScope(tenant, user)`` — the
  key the content was written under) bound to ``(run id, "memory:<point id>", "text")``. Its vector is the
  embedding of the plain text (see docs/guide/encryption.md § Memory: ``erase --subject`` also deletes the user's
  points). After ``runjournal erase --tenant T --subject U`` no copy of U's items yields text.
* **Readers** (:func:`reveal_hits`: the memory reader of ``runjournal.consumers.cognition``, hence ``runjournal
  memory search``, the context manager and the console) open a token with their process's key service, or show
  ``encrypted`` with the error's name in :attr:`MemoryHit.encrypted`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING

from runjournal.core.crypto.errors import EncryptedContentError
from runjournal.core.crypto.token import decode_plain, encode_plain, is_encrypted
from runjournal.producers.encryption import CONTENT_FIELDS, ENCRYPTED, ContentCrypto
from runjournal.schemas.events import Event
from runjournal.stores import MemoryHit, MemoryItem

if TYPE_CHECKING:
    from runjournal.core.settings import Settings

__all__ = ["ITEM_FIELD", "KeyGrant", "MemoryCrypto", "item_address", "reveal_hits"]

ITEM_FIELD = "text"
"""The field name a sealed item's token is bound to."""


def item_address(point_id: str) -> str:
    """The address a memory item's token is bound to: ``memory:<point id>`` (stable across redeliveries)."""
    return f"memory:{point_id}"


@dataclasses.dataclass(frozen=True)
class KeyGrant:
    """Which tenants' content the memory extractor may open.

    Attributes:
        tenants: the granted tenants; ignored when ``every`` is set.
        every: ``*``: every tenant the key service holds keys of.
    """

    tenants: frozenset[str] = frozenset()
    every: bool = False

    @classmethod
    def parse(cls, text: str | None) -> KeyGrant:
        """``RUNJOURNAL_MEMORY_KEY_GRANT``'s value: ``""`` (none, the default), ``*``, or ``acme,globex``."""
        parts = {p.strip() for p in (text or "").split(",") if p.strip()}
        return cls(every=True) if "*" in parts else cls(tenants=frozenset(parts))

    def covers(self, tenant_id: str) -> bool:
        """Whether content of ``tenant_id``'s runs may be opened."""
        return self.every or tenant_id in self.tenants

    def __bool__(self) -> bool:
        return self.every or bool(self.tenants)


class MemoryCrypto:
    """The extractor's side: open granted content, seal items drawn from it.

    Args:
        settings: the key service (``RUNJOURNAL_KMS``, ``RUNJOURNAL_KEYS_DIR``, cache sizes).
        grant: the tenants whose content may be opened.
        content: the opener and sealer to use instead of one built from ``settings`` (tests).

    Raises:
        ConfigError: the key service is not built in this release, or ``cryptography`` is missing.
    """

    def __init__(self, settings: Settings, grant: KeyGrant, *, content: ContentCrypto | None = None) -> None:
        self.grant = grant
        if content is None:
            from runjournal.core.crypto.cache import DataKeyCache
            from runjournal.core.crypto.cipher import FieldCipher, kms_from_settings

            content = ContentCrypto(settings, cipher=FieldCipher(kms_from_settings(settings), cache=DataKeyCache(
                settings.key_cache_size, settings.key_cache_ttl_ms)), encrypt=True)
        self.content = content

    def open_event(self, event: Event) -> tuple[Event, bool]:
        """``(event with its granted content opened, whether any content field was encrypted)``.

        An opened field holds its plain text in stored form (``encode_plain``); a field of a tenant outside the
        grant keeps its token (the rules skip it); a field that cannot be opened (destroyed, retired, moved, another
        tenant's token: :meth:`ContentCrypto.belongs_to`) becomes None (no memory from it, no error).

        Raises:
            KeyUnavailableError: the key service did not answer (transient: the failure policy waits).
        """
        fields = CONTENT_FIELDS.get(event.type, ())
        sealed = [(name, address) for name, address in fields if is_encrypted(event.payload.get(name))]
        if not sealed:
            return event, False
        if not self.grant.covers(event.tenant_id):
            return event, True
        payload = dict(event.payload)
        for name, address in sealed:
            try:  # only the event's tenant's own tokens: a binding names no tenant, the grant is per tenant
                opened = (self.content.open(payload[name], event.run_id, address(event), name)
                          if self.content.belongs_to(payload[name], event.tenant_id) else None)
            except EncryptedContentError:
                opened = None
            payload[name] = None if opened is None else encode_plain(opened)
        return dataclasses.replace(event, payload=payload), True

    def open_input(self, tenant_id: str, run_id: str, value: str | None) -> str | None:
        """A run's input as plain text for the run context (None: not granted or unreadable).

        Raises:
            KeyUnavailableError: the key service did not answer (transient).
        """
        if value is None or not is_encrypted(value):
            return None if value is None else decode_plain(value)
        if not self.grant.covers(tenant_id):
            return None
        try:
            if not self.content.belongs_to(value, tenant_id):  # another tenant's token under this tenant's id
                return None
            return self.content.open(value, run_id, "run", "input_json")
        except EncryptedContentError:
            return None

    def erased(self, tenant_id: str, user_id: str | None) -> bool:
        """True when the owner's key (or its tenant's) was destroyed: ``runjournal erase --tenant/--subject`` ran.

        Raises:
            KeyUnavailableError: the key service did not answer (transient).
        """
        return self.content.key_destroyed(tenant_id, user_id)

    def seal_item(self, item: MemoryItem, point_id: str) -> MemoryItem:
        """``item`` with its text sealed under its owner's key, bound to ``(run id, memory:<point id>, text)``.

        Raises:
            KeyDestroyedError: the owner's key was destroyed meanwhile (the caller drops the item).
            KeyUnavailableError: the key service did not answer (transient).
        """
        token = self.content.seal_text(item.text, tenant_id=item.scope.tenant_id, subject=item.scope.user_id,
                                       run_id=item.provenance.run_id, address=item_address(point_id),
                                       field=ITEM_FIELD)
        return dataclasses.replace(item, text=token)


def reveal_hits(hits: Iterable[MemoryHit], content: ContentCrypto | None) -> list[MemoryHit]:
    """``hits`` with each item's stored text opened: plain text as is (an escaped one unescaped), a token opened
    with ``content`` (the reader's key service), or :data:`~runjournal.producers.encryption.ENCRYPTED` with the
    error's class name in ``encrypted`` (``KeyDestroyedError`` after ``erase --subject``, ``UnknownKeyError`` …)
    when it cannot be opened or ``content`` is None (a reader that holds no key, like the console).

    Raises:
        KeyUnavailableError: the key service did not answer.
    """
    out: list[MemoryHit] = []
    for hit in hits:
        if not is_encrypted(hit.text):
            out.append(dataclasses.replace(hit, text=decode_plain(hit.text)))
            continue
        if content is None:
            out.append(dataclasses.replace(hit, text=ENCRYPTED, encrypted="NoKeyGrant"))
            continue
        run_id = str(hit.provenance.get("run_id", ""))
        try:
            text = content.open(hit.text, run_id, item_address(hit.id), ITEM_FIELD)
        except EncryptedContentError as exc:
            out.append(dataclasses.replace(hit, text=ENCRYPTED, encrypted=type(exc).__name__))
            continue
        out.append(dataclasses.replace(hit, text=text or ""))
    return out
