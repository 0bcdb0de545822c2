"""Synthetic runs for consumer tests, published with the real codec to the real broker.

The producer library (``producers``) is tested on its own; consumer tests publish exactly the
bytes they want (including corrupt ones and tombstones) with a plain transactional-free producer.
"""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

from runjournal.core import kafka
from runjournal.core.settings import Settings
from runjournal.schemas import Event, EventType, codec_from_settings
from runjournal.schemas.keys import partition_for, run_id_of_key

T = EventType
_BASE = datetime(2026, 1, 1, tzinfo=UTC)


def run_events(run_id: str, *, tenant: str = "acme", calls: int = 2, rng: random.Random | None = None,
               finish: bool = True) -> list[Event]:
    """One run: RUN_STARTED, a node with ``calls`` tool calls (intent + commit), a message, RUN_SUCCEEDED."""
    rng = rng or random.Random(run_id)
    seq = 0

    def ev(etype: EventType, payload: dict, node: str | None = None) -> Event:
        nonlocal seq
        seq += 1
        return Event(event_id=str(uuid.UUID(int=rng.getrandbits(128))), run_id=run_id, tenant_id=tenant,
                     seq=seq, epoch=1, producer_id="agent-1", type=etype,
                     occurred_at=_BASE + timedelta(milliseconds=seq), payload=payload, node_id=node)

    started = {"agent": "airline", "input_json": '{"q": 1}', "user_id": "u1",  # and every v5 field: decode fills them
               "forked_from": None, "forked_at_seq": None, "fork_lineage": None, "requested_by": None,
               "request_reason": None}
    out = [ev(T.RUN_STARTED, started)]
    out.append(ev(T.NODE_STARTED, {"node_path": "main", "attempt": 1}, "main"))
    for i in range(calls):
        tool = {"call_id": f"c{i}", "tool": "book_flight", "idempotency_key": f"{run_id}-k{i}",
                "args_digest": f"a{i}"}
        out.append(ev(T.TOOL_CALL_INTENDED, {**tool, "side_effect": True, "attempt": 1, "timeout_ms": 1000,
                                             "args_json": '{"x": 1}'}, "main"))
        out.append(ev(T.TOOL_CALL_COMMITTED, {**tool, "result_json": f'{{"ok": {i}}}', "result_digest": f"r{i}"},
                      "main"))
    out.append(ev(T.MESSAGE, {"role": "user", "content": "thanks"}, "main"))
    out.append(ev(T.NODE_SUCCEEDED, {"node_path": "main"}, "main"))
    if finish:
        out.append(ev(T.RUN_SUCCEEDED, {"output_json": '"done"'}))
    return out


def interleave(runs: list[list[Event]], rng: random.Random) -> list[Event]:
    """Merge runs into one stream keeping each run's order (as concurrent agents would)."""
    queues = [list(r) for r in runs]
    out: list[Event] = []
    while queues:
        q = rng.choice(queues)
        out.append(q.pop(0))
        if not q:
            queues.remove(q)
    return out


def publish(settings: Settings, items: list[Event | tuple[str, bytes | None]]) -> None:
    """Produce events (encoded, key ``run:epoch:seq``, murmur2 partition) or raw ``(key, value)`` pairs."""
    codec = codec_from_settings(settings)
    producer = kafka.producer(settings, **{"acks": "all", "enable.idempotence": True,
                         "linger.ms": 5, "compression.type": "lz4"})
    for item in items:
        if isinstance(item, Event):
            key, value, run_id = item.key, codec.encode(item), item.run_id
        else:
            key, value = item
            run_id = run_id_of_key(key.encode()).decode()
        producer.produce(settings.events_topic, key=key.encode(), value=value,
                         partition=partition_for(run_id, settings.partitions))
        producer.poll(0)
    assert producer.flush(60) == 0
