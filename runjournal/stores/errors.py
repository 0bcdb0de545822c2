"""Named errors of the store contracts (:mod:`runjournal.stores`).

A caller that breaks a store's contract gets one of these, never a silent fallback:

* :class:`ScopeError` — a memory scope without its tenant (owner), or an identity key smuggled in a filter.
* :class:`PlaneError` — a cross-use: an object of one plane used where another is required (a memory
  store handed to a ContextManager as its state store, a memory search that returned knowledge).
* :class:`ProvenanceError` — knowledge evidence without its provenance (path, section, sha256, version).
* :class:`ReadOnlyError` — a write attempted through a read-only store (the knowledge corpus at query time).

And :class:`ObjectStoreError` (a :class:`~runjournal.core.errors.ConfigError`): the archive's object store cannot
be used as configured (an unknown URL scheme, ``s3://`` without the ``archive`` extra installed), and
:class:`ObjectStoreUnavailableError`: it is configured right but does not answer now (the one failure policy waits).
"""

from __future__ import annotations

from runjournal.core.errors import ConfigError, RunjournalError

__all__ = ["ObjectStoreError", "ObjectStoreUnavailableError", "PlaneError",
           "ProvenanceError", "ReadOnlyError", "ScopeError", "StoreContractError"]


class StoreContractError(RunjournalError):
    """Base: a store's contract (scope, plane, provenance, mutability) was broken by a caller or a backend."""

    retryable: bool = False
    """Never: the same call breaks the same contract again."""


class ScopeError(StoreContractError, ValueError):
    """A memory scope is missing its tenant (empty or not a string), or a caller tried to filter on an
    identity key (``tenant_id``, ``user_id``, ``agent_id``) instead of passing a :class:`~runjournal.stores.Scope`."""


class PlaneError(StoreContractError, TypeError):
    """An object of one plane was used where another is required: execution facts from a cognition store,
    a memory search that returned a knowledge point, knowledge evidence carrying a tenant."""


class ProvenanceError(StoreContractError, ValueError):
    """Knowledge evidence without its provenance (document path, section heading, content sha256,
    ingested-at, document version): refused at ingest, and at query time if a stored point lacks it."""


class ReadOnlyError(StoreContractError):
    """A write was attempted through a read-only store (the knowledge corpus at query time, a remote reader)."""


class ObjectStoreError(ConfigError):
    """The archive's object store cannot be used as configured: ``RUNJOURNAL_ARCHIVE_URL`` has a scheme other than
    ``file`` or ``s3``, or ``s3://`` is asked without s3fs (``pip install 'runjournal[archive]'``)."""


class ObjectStoreUnavailableError(RunjournalError):
    """The archive's object store did not answer (refused, reset, timed out, a 5xx, a full disk): waiting can fix
    it. The one failure policy (``runjournal.consumers.runtime.failures``) classifies it ``transient`` with the
    dependency ``object_store``: the archiver waits and removes nothing from the hot stores meanwhile
    (docs/design/decisions/0057-erase-while-archiving.md)."""
