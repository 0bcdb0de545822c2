"""``Event``'s hand-written ``__init__`` behaves as the generated frozen-dataclass one it replaced.

The reference below is the class as it was (``@dataclass(frozen=True, slots=True)`` + ``__post_init__``).
"""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from runjournal.schemas import Event, EventType, NaiveDatetimeError


@dataclass(frozen=True, slots=True)
class Reference:
    event_id: str
    run_id: str
    tenant_id: str
    seq: int
    epoch: int
    producer_id: str
    type: EventType
    occurred_at: datetime
    payload: dict[str, Any] = field(default_factory=dict)
    node_id: str | None = None
    traceparent: str | None = None

    def __post_init__(self) -> None:
        if self.occurred_at.tzinfo is None or self.occurred_at.utcoffset() is None:
            raise NaiveDatetimeError(
                f"occurred_at must be timezone-aware (got naive {self.occurred_at!r}) "
                f"for event {self.event_id}"
            )
        if not isinstance(self.type, EventType):
            object.__setattr__(self, "type", EventType(self.type))


AT = datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=UTC)
ARGS = ("e1", "r1", "t1", 3, 1, "p1")


def _values(obj: Any) -> tuple[Any, ...]:
    return tuple(getattr(obj, f.name) for f in dataclasses.fields(Reference))


@pytest.mark.parametrize(("args", "kwargs"), [
    ((*ARGS, EventType.MESSAGE, AT), {}),
    ((*ARGS, "MESSAGE", AT), {"payload": {"role": "user", "content": "hi"}}),
    ((), {"event_id": "e", "run_id": "r", "tenant_id": "t", "seq": 1, "epoch": 2, "producer_id": "p",
          "type": EventType.NODE_STARTED, "occurred_at": AT, "node_id": "n", "traceparent": "tp"}),
    ((*ARGS, EventType.MESSAGE, AT.astimezone(timezone(timedelta(hours=-3))), None, "n", None), {}),
    ((*ARGS, EventType.MESSAGE, AT, {"a": 1}, None, "tp"), {}),
], ids=["defaults", "str-type", "keywords", "explicit-none-payload-other-zone", "positional-all"])
def test_construction_matches_the_generated_init(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    ours, ref = Event(*args, **kwargs), Reference(*args, **kwargs)
    assert _values(ours) == _values(ref)
    assert repr(ours) == repr(ref).replace("Reference(", "Event(", 1)
    assert type(ours.type) is EventType


def test_equality_hash_replace_match_args_and_pickle() -> None:
    a = Event(*ARGS, EventType.MESSAGE, AT, {"role": "user"})
    b = Event(*ARGS, EventType.MESSAGE, AT, {"role": "user"})
    assert a == b and a is not b and a != dataclasses.replace(a, seq=4)
    with pytest.raises(TypeError):
        hash(a)  # a dict field: unhashable, as before
    assert hash(dataclasses.replace(a, payload=None)) == hash(Reference(*ARGS, EventType.MESSAGE, AT, None))  # type: ignore[arg-type]
    moved = dataclasses.replace(a, type="NODE_STARTED", node_id="n")  # type: ignore[arg-type]
    assert moved.type is EventType.NODE_STARTED and moved.node_id == "n" and moved.seq == 3
    assert Event.__match_args__ == Reference.__match_args__
    assert pickle.loads(pickle.dumps(a)) == a
    assert Event.__slots__ == Reference.__slots__


def test_frozen_and_the_default_payload_is_fresh() -> None:
    a, b = Event(*ARGS, EventType.MESSAGE, AT), Event(*ARGS, EventType.MESSAGE, AT)
    assert a.payload == {} and a.payload is not b.payload
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.seq = 9  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del a.seq  # type: ignore[misc]


@pytest.mark.parametrize(("args", "error"), [
    ((*ARGS, EventType.MESSAGE, datetime(2026, 1, 1)), NaiveDatetimeError),
    ((*ARGS, "NOT_A_TYPE", AT), ValueError),
    ((*ARGS, "NOT_A_TYPE", datetime(2026, 1, 1)), NaiveDatetimeError),
    ((*ARGS, EventType.MESSAGE, "2026-01-01"), AttributeError),
    (ARGS, TypeError),
])
def test_refusals_match(args: tuple[Any, ...], error: type[Exception]) -> None:
    with pytest.raises(error) as ours:
        Event(*args)
    with pytest.raises(error) as ref:
        Reference(*args)
    if error is not TypeError:  # (the missing-argument message names the class)
        assert str(ours.value) == str(ref.value)
