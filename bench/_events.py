"""Synthetic agent runs for the bench, and a fast raw publisher of pre-encoded events.

A run is what an agent with tools does (``shape``): RUN_STARTED, PLAN_COMPILED, then node blocks
of NODE_STARTED, a user MESSAGE (~240 chars), two tool calls (INTENDED + COMMITTED), an assistant
MESSAGE and NODE_SUCCEEDED, and RUN_SUCCEEDED when the run is complete. Events are real
:class:`runjournal.schemas.Event` objects encoded with the real codec; ``occurred_at`` is fixed so that the
bytes of two runs differ only in the run id and event ids (:class:`Templates` relies on it to build
a million events in about a second).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from runjournal.core import kafka
from runjournal.schemas import Event, EventCodec, EventType
from runjournal.schemas.keys import partition_for

__all__ = ["RawRecord", "Templates", "interleave", "json_value", "publish_raw", "run_events"]

T = EventType
_BASE = datetime(2026, 1, 1, tzinfo=UTC)
_TEXT = ("I need to change my flight to the morning one on the same day, and keep the aisle seat; "
         "please also check whether the fare difference can go on the travel voucher from last month "
         "and tell me before you book anything. ")
RUN_T = "RRRRRRRR-RRRR-4RRR-8RRR-RRRRRRRRRRRR"
"""Placeholder run id (36 chars, as a uuid) in template events."""
EVT_T = "EEEEEEEE-EEEE-4EEE-8EEE-EEEEEEEE"
"""Placeholder of an event id's first 32 chars (the last 4 are the seq in hex)."""

RawRecord = tuple[bytes, bytes, int]
"""``(key, value, partition)`` ready for ``Producer.produce``."""


def _body(run_id: str, nodes: int) -> Iterator[tuple[EventType, dict[str, Any], str | None]]:
    yield T.RUN_STARTED, {"agent": "airline", "input_json": '{"ask":"change flight","pnr":"HAT123"}',
                          "user_id": "u1"}, None
    yield T.PLAN_COMPILED, {"plan_hash": "9f" * 16, "code_version": "bench-1",
                            "nodes": [f"step{i}" for i in range(nodes)]}, None
    for i in range(nodes):
        node = f"step{i}"
        yield T.NODE_STARTED, {"node_path": node, "attempt": 1}, node
        yield T.MESSAGE, {"role": "user", "content": _TEXT, "user_id": "u1"}, node
        for c in range(2):
            tool = {"call_id": f"{run_id}-{node}-{c}", "tool": "book_flight",
                    "idempotency_key": f"{run_id}-{node}-{c}", "args_digest": "ad" * 32}
            yield T.TOOL_CALL_INTENDED, {**tool, "side_effect": True, "attempt": 1, "timeout_ms": 1000,
                                         "args_json": '{"flight":"HAT123","seat":"14C"}'}, node
            yield T.TOOL_CALL_COMMITTED, {**tool, "result_json": '{"ok":true,"booking":"BK-0042","fare":129.5}',
                                          "result_digest": "rd" * 32}, node
        yield T.MESSAGE, {"role": "assistant", "content": _TEXT[:160]}, node
        yield T.NODE_SUCCEEDED, {"node_path": node}, node


def run_events(run_id: str, n: int, *, finish: bool = True, event_ids: Iterable[str] | None = None) -> list[Event]:
    """The first ``n`` events of a run (the last one RUN_SUCCEEDED when ``finish``).

    Args:
        run_id: the run.
        n: number of events (>= 2 when ``finish``).
        finish: end with RUN_SUCCEEDED (a completed run) instead of stopping mid-way (in flight: a
            truncated run may end on an INTENDED without outcome, as after a crash).
        event_ids: ids to use in order (default ``{run_id[:32]}{seq:04x}``).
    """
    ids = iter(event_ids) if event_ids is not None else (f"{run_id[:32]}{s:04x}" for s in range(1, n + 1))
    body = list(_body(run_id, nodes=(n // 8) + 1))[: n - 1 if finish else n]
    if finish:
        body.append((T.RUN_SUCCEEDED, {"output_json": '"done"'}, None))
    return [Event(event_id=next(ids), run_id=run_id, tenant_id="acme", seq=seq, epoch=1, producer_id="bench-agent-1",
                  type=etype, occurred_at=_BASE + timedelta(milliseconds=seq), payload=payload, node_id=node)
            for seq, (etype, payload, node) in enumerate(body, start=1)]


def interleave(runs: Iterable[list[Any]], rng: random.Random, *, concurrent: int = 500) -> Iterator[Any]:
    """Merge runs as concurrent agents would: ``concurrent`` runs active at once, each in its own order."""
    pending = iter(runs)
    active: list[Iterator[Any]] = [iter(r) for r in (next(pending, None) for _ in range(concurrent)) if r]
    while active:
        i = rng.randrange(len(active))
        item = next(active[i], None)
        if item is None:
            nxt = next(pending, None)
            if nxt is None:
                active[i] = active[-1]
                active.pop()
            else:
                active[i] = iter(nxt)
            continue
        yield item


def json_value(event: Event) -> bytes:
    """The event as JSON (the Quix anchor's input): envelope fields, ``occurred_at_ms``, payload."""
    return json.dumps({"event_id": event.event_id, "run_id": event.run_id, "tenant_id": event.tenant_id,
                       "seq": event.seq, "epoch": event.epoch, "producer_id": event.producer_id,
                       "type": event.type.value, "occurred_at_ms": int(event.occurred_at.timestamp() * 1000),
                       "node_id": event.node_id, "traceparent": event.traceparent, "payload": event.payload},
                      separators=(",", ":")).encode()


@dataclass
class Templates:
    """Encoded events of one template run; :meth:`records` stamps a real run id into them.

    The bytes of a run differ from the template's only in the run id (36 chars) and the first 32
    chars of each event id (Avro strings are length-prefixed, and both have fixed lengths).
    """

    codec: EventCodec
    events: int
    """Events in the template run."""
    finish: bool = True

    def __post_init__(self) -> None:
        self._values = [self.codec.encode(e) for e in run_events(RUN_T, self.events, finish=self.finish,
                                                                 event_ids=(f"{EVT_T}{s:04x}"
                                                                            for s in range(1, self.events + 1)))]

    def records(self, run_id: str, partitions: int, *, first: int = 0, last: int | None = None) -> list[RawRecord]:
        """Records ``first..last`` (0-based, ``last`` exclusive) of run ``run_id``."""
        assert len(run_id) == len(RUN_T)
        rid, eid = run_id.encode(), run_id[:32].encode()
        part = partition_for(run_id, partitions)
        out = []
        for i, tmpl in enumerate(self._values[first:last], start=first):
            out.append((b"%s:1:%d" % (rid, i + 1), tmpl.replace(RUN_T.encode(), rid).replace(EVT_T.encode(), eid),
                        part))
        return out


def publish_raw(bootstrap: str, topic: str, records: Iterable[RawRecord]) -> tuple[int, float]:
    """Produce pre-encoded records fast (idempotent, acks=all, lz4, large batches); wait for every ack.

    Returns:
        ``(count, seconds)``.

    Raises:
        RuntimeError: a delivery failed.
    """
    errors: list[Any] = []
    producer = kafka.producer(None, bootstrap=bootstrap, **{"acks": "all", "enable.idempotence": True,
                         "compression.type": "lz4", "linger.ms": 50, "batch.size": 1_000_000,
                         "queue.buffering.max.messages": 500_000, "queue.buffering.max.kbytes": 1_048_576})

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(err)

    started, count = time.monotonic(), 0
    for key, value, part in records:
        while True:
            try:
                producer.produce(topic, value, key, partition=part, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        count += 1
        if count % 10_000 == 0:
            producer.poll(0)
    if producer.flush(120) != 0 or errors:
        raise RuntimeError(f"raw publish to {topic} failed: {errors[:3]}")
    return count, time.monotonic() - started
