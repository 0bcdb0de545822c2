"""Registering the published envelope versions in a schema registry — the publish tool's job, never a producer's.

The subject ``{topic}-value`` is set to the policy's level (:data:`runjournal.schemas.compat.POLICY`,
``FULL_TRANSITIVE``) and holds every published version from :data:`~runjournal.schemas.compat.FORWARD_SINCE`
on, oldest first (v1 predates the policy: its rename is not forward-compatible, and no reader needs it
from the registry — every reader ships it). Producers only look their schema's id up
(:mod:`runjournal.schemas._confluent`); one that is not registered fails with a message naming
``runjournal schemas publish --registry``.

One caveat, stated in docs/reference/event-contract.md: the registry checks with Avro's standard rules, which
close unions, so it refuses a version that adds an event type (a new payload branch) although
runjournal's readers read one as ``UNKNOWN``; the local gate allows it. Such a version can be used
with single-object framing (writer schemas from the ``{prefix}.schemas`` topic), not with a
FULL_TRANSITIVE registry subject.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient, SchemaRegistryError

from runjournal.schemas._confluent import registry_client
from runjournal.schemas.compat import FORWARD_SINCE, POLICY
from runjournal.schemas.errors import RegistryError
from runjournal.schemas.versions import SchemaVersion, load_versions

__all__ = ["Registration", "register_versions", "registry_accepts"]


@dataclass(frozen=True)
class Registration:
    """What happened to one version in the registry."""

    version: str
    """``v2``, ``candidate:v3.avsc`` …"""
    action: str
    """``registered``, ``exists`` or ``refused``."""
    schema_id: int | None
    """The registry's id for it (None when refused)."""
    detail: str = ""
    """The registry's answer when refused."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return asdict(self)


def _client(registry: str | SchemaRegistryClient) -> SchemaRegistryClient:
    return registry_client(registry) if isinstance(registry, str) else registry


def register_versions(registry: str | SchemaRegistryClient, subject: str,
                      versions: tuple[SchemaVersion, ...] | None = None) -> list[Registration]:
    """Register ``versions`` (default: every published one from FORWARD_SINCE) under ``subject`` at POLICY.

    Idempotent: a version already in the subject reports ``exists`` with its id.

    Args:
        registry: base URL (``RUNJOURNAL_SCHEMA_REGISTRY_URL``) or a client.
        subject: ``{topic}-value``.
        versions: what to register, oldest first.

    Returns:
        One :class:`Registration` per version; stops after the first ``refused``.

    Raises:
        RegistryError: the registry is unreachable or failed (5xx).
    """
    client = _client(registry)
    todo = versions if versions is not None else tuple(v for v in load_versions() if v.version >= FORWARD_SINCE)
    out: list[Registration] = []
    try:
        existing = subject in client.get_subjects()
        if existing:
            client.set_compatibility(subject, POLICY)
        for version in todo:
            out.append(_register_one(client, subject, version))
            if out[-1].action == "refused":
                break
            if not existing:
                client.set_compatibility(subject, POLICY)  # the subject exists once its first version does
                existing = True
    except SchemaRegistryError as exc:
        raise RegistryError(f"schema registry failed registering in {subject}: {exc}") from exc
    except RegistryError:
        raise
    except Exception as exc:  # transport errors of the registry's HTTP client
        raise RegistryError(f"schema registry unreachable registering in {subject}: {exc!r}") from exc
    return out


def _register_one(client: SchemaRegistryClient, subject: str, version: SchemaVersion) -> Registration:
    schema = Schema(version.text, "AVRO")
    try:
        found = client.lookup_schema(subject, schema)
        return Registration(version.label, "exists", found.schema_id)
    except SchemaRegistryError as exc:
        if exc.http_status_code != 404:
            raise
    try:
        return Registration(version.label, "registered", client.register_schema(subject, schema))
    except SchemaRegistryError as exc:
        if exc.http_status_code in (409, 422):  # incompatible / invalid: the registry's verdict
            return Registration(version.label, "refused", None, str(exc))
        raise


def registry_accepts(registry: str | SchemaRegistryClient, subject: str, candidate: SchemaVersion) -> bool | None:
    """The registry's verdict on ``candidate`` as the subject's next version (nothing is registered).

    Returns:
        True / False; None when the subject does not exist yet (nothing to be compatible with).

    Raises:
        RegistryError: the registry is unreachable or failed.
    """
    client = _client(registry)
    try:
        if subject not in client.get_subjects():
            return None
        return bool(client.test_compatibility(subject, Schema(candidate.text, "AVRO")))
    except SchemaRegistryError as exc:
        if exc.http_status_code == 422:
            return False
        raise RegistryError(f"schema registry failed testing a candidate in {subject}: {exc}") from exc
    except Exception as exc:  # transport errors of the registry's HTTP client
        raise RegistryError(f"schema registry unreachable testing a candidate in {subject}: {exc!r}") from exc
