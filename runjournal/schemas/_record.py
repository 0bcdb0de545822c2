"""The payload half of the converter: an event's payload dict checked against the contract (``PAYLOAD_FIELDS``).

Private: used by :class:`~runjournal.schemas.codec.EventCodec` when it builds the envelope record.
"""

from __future__ import annotations

from typing import Any

from runjournal.schemas.errors import InvalidEventError
from runjournal.schemas.events import PAYLOAD_FIELDS, EventType

__all__ = ["payload_body"]

_FIELDS: dict[EventType, tuple[tuple[str, type, bool], ...]] = {
    t: tuple((name, py, required) for name, (py, required) in fields.items())
    for t, fields in PAYLOAD_FIELDS.items()
}
_FIELD_NAMES: dict[EventType, frozenset[str]] = {t: frozenset(f) for t, f in PAYLOAD_FIELDS.items()}


def payload_body(etype: EventType, payload: dict[str, Any]) -> dict[str, Any]:
    """``payload`` checked against PAYLOAD_FIELDS and completed with None for absent optional fields.

    Returns:
        The payload record: every field of ``etype``, in contract order.

    Raises:
        InvalidEventError: an unknown field, a required field missing or None, a value of the wrong Python type
            (``.field`` is ``payload.<name>``).
    """
    unknown = payload.keys() - _FIELD_NAMES[etype]
    if unknown:
        name = sorted(unknown)[0]
        raise InvalidEventError(f"{etype} has no payload field {name!r}", field=f"payload.{name}")
    body: dict[str, Any] = {}
    for name, py, required in _FIELDS[etype]:
        value = payload.get(name)
        if value is None:
            if required:
                raise InvalidEventError(f"{etype} payload needs {name!r}", field=f"payload.{name}")
        elif not _fits(value, py):
            raise InvalidEventError(
                f"{etype} payload {name!r} must be {py.__name__}, got {type(value).__name__}",
                field=f"payload.{name}",
            )
        body[name] = value
    return body


def _fits(value: Any, py: type) -> bool:
    if py is bool:
        return type(value) is bool
    if py is int:
        return isinstance(value, int) and type(value) is not bool
    if py is list:
        return isinstance(value, list) and all(isinstance(item, str) for item in value)
    return isinstance(value, py)
