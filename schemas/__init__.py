"""Versioned Avro event contract: the .avsc files of every published version, the codec and upcasters."""

from schemas.events import (
    CONTROL_FLOW_TYPES,
    DURABLE_TYPES,
    PAYLOAD_FIELDS,
    Event,
    EventType,
    NaiveDatetimeError,
    new_event_id,
    utcnow,
)

__all__ = [
    "CONTROL_FLOW_TYPES",
    "DURABLE_TYPES",
    "PAYLOAD_FIELDS",
    "Event",
    "EventType",
    "NaiveDatetimeError",
    "new_event_id",
    "utcnow",
]
