"""Versioned Avro event contract: the .avsc files of every published version, the codec and upcasters.

Public API (see docs/reference/event-contract.md): the :class:`Event` shape, :class:`EventCodec` and
:func:`codec_from_settings`, the schema versions, and the named errors.
"""

from runjournal.schemas.codec import DEFAULT_MAX_EVENT_BYTES, EventCodec, codec_from_settings, is_tombstone
from runjournal.schemas.errors import (
    CorruptEventError,
    DecodeError,
    EventTooLargeError,
    InvalidEventError,
    RegistryError,
    SchemaError,
    TombstoneError,
    UnregisteredSchemaError,
    UnsupportedSchemaError,
)
from runjournal.schemas.events import (
    CONTROL_FLOW_TYPES,
    DURABLE_TYPES,
    KNOWN_TYPES,
    PAYLOAD_FIELDS,
    Event,
    EventType,
    NaiveDatetimeError,
    new_event_id,
    utcnow,
)
from runjournal.schemas.versions import SchemaVersion, current_version, load_versions

__all__ = [
    "CONTROL_FLOW_TYPES",
    "DEFAULT_MAX_EVENT_BYTES",
    "DURABLE_TYPES",
    "KNOWN_TYPES",
    "PAYLOAD_FIELDS",
    "CorruptEventError",
    "DecodeError",
    "Event",
    "EventCodec",
    "EventTooLargeError",
    "EventType",
    "InvalidEventError",
    "NaiveDatetimeError",
    "RegistryError",
    "SchemaError",
    "SchemaVersion",
    "TombstoneError",
    "UnregisteredSchemaError",
    "UnsupportedSchemaError",
    "codec_from_settings",
    "current_version",
    "is_tombstone",
    "load_versions",
    "new_event_id",
    "utcnow",
]
