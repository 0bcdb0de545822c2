"""Pair 1 — publish throughput: ``RunHandle.emit`` of non-durable events vs raw confluent-kafka.

Ours: one :class:`runjournal.producers.Journal` (transactional, acks=all, idempotent, lz4, linger 5 ms), 100
open runs, ``emit`` of MESSAGE / NODE_STARTED / MESSAGE / NODE_SUCCEEDED in turn across the runs
(Event built, Avro-encoded, murmur2 partition, produced into the open transaction; the keeper
commits every ``max_txn_age_ms`` = 1 s), then ``flush()`` (commit). Anchors, on the same topic:

* raw transactional: a ``Producer`` with the Journal's own config, producing pre-encoded values
  of the same events (same sizes, keys, partitions), committing when the transaction is 1 s old
  and at the end — the same cadence; ``poll(0)`` and a delivery callback per record, as ours.
* raw idempotent: the same without transactions (acks=all, idempotence), ``flush()`` at the end.
* before/after of the generated envelope writer (``runjournal.schemas._direct``): ours again, right after ours,
  with the codec's direct writers switched off for the round, so every event takes the checked path (record dict,
  validation, fastavro) as before issue 20 — the same Journal, handles and broker. (Only the encoder: the cheaper
  ids, clock, ``Event`` construction and publish path stay on.)

Figure: events per second from the first emit to the final commit/flush returning. Goal (issue 20): emit at
≥ 0.25 of the raw transactional producer.

The partition is ``confluent_kafka.murmur2`` (C), remembered per run by the Journal; the pure-Python murmur2 it
replaced survives only as the test oracle.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Producer

from bench._env import BenchEnv
from bench._model import Row, goal_met, paired_ratios, summarise
from bench._rounds import Side, interleave
from runjournal.core import kafka
from runjournal.producers import Journal, RunHandle, partition_for
from runjournal.schemas import Event, EventType, codec_from_settings, new_event_id, utcnow

__all__ = ["PublishConfig", "run_publish"]

PAIR = "1 publish"
BEFORE = "emit, checked encoder"
RUNS = 100
_CONTENT = "Sure — I moved you to the 07:40 flight and kept seat 14C; the fare difference is covered. " * 2
_CYCLE: list[tuple[EventType, dict[str, Any]]] = [
    (EventType.MESSAGE, {"role": "assistant", "content": _CONTENT}),
    (EventType.NODE_STARTED, {"node_path": "respond", "attempt": 1}),
    (EventType.MESSAGE, {"role": "user", "content": _CONTENT[:120], "user_id": "u1"}),
    (EventType.NODE_SUCCEEDED, {"node_path": "respond"}),
]


@dataclass(frozen=True)
class PublishConfig:
    """Sizes of pair 1."""

    events: int
    """Events per side per round."""
    rounds: int
    """Measured rounds (after one warm-up)."""


def _producer_config(journal: Journal) -> dict[str, Any]:
    return kafka.client_config(journal.settings, "producer", **{"enable.idempotence": True, "acks": "all",
            "compression.type": "lz4", "linger.ms": 5, "allow.auto.create.topics": False})


class _Raw:
    """The anchors: pre-encoded records of the same events, produced transactionally or not."""

    def __init__(self, journal: Journal, handles: list[RunHandle], events: int, *, transactional: bool) -> None:
        codec = codec_from_settings(journal.settings)
        self.topic = journal.topic
        self.records = []
        for i in range(events):
            handle, (etype, payload) = handles[i % len(handles)], _CYCLE[i % len(_CYCLE)]
            event = Event(event_id=new_event_id(), run_id=handle.run_id, tenant_id="acme", seq=10_000 + i, epoch=1,
                          producer_id=journal.producer_id, type=etype, occurred_at=utcnow(), payload=payload)
            self.records.append((event.key.encode(), codec.encode(event), partition_for(handle.run_id,
                                                                                           journal.partitions)))
        config = _producer_config(journal)
        self.transactional = transactional
        if transactional:
            config |= {"transactional.id": f"{journal.transactional_id}-raw", "transaction.timeout.ms": 15_000}
        self.producer = Producer(config)
        if transactional:
            self.producer.init_transactions(30)
        self.commits = 0

    def round(self) -> float:
        """One round: every record, committed (or flushed); returns events/s."""
        p, topic, deliver = self.producer, self.topic, _on_delivery
        opened = 0.0
        started = time.perf_counter()
        for key, value, part in self.records:
            if self.transactional and not opened:
                p.begin_transaction()
                opened = time.monotonic()
            p.produce(topic, key=key, value=value, partition=part, on_delivery=deliver)
            p.poll(0)
            if opened and time.monotonic() - opened >= 1.0:
                p.commit_transaction(30)
                self.commits += 1
                opened = 0.0
        if opened:
            p.commit_transaction(30)
            self.commits += 1
        elif not self.transactional:
            p.flush(30)
        return len(self.records) / (time.perf_counter() - started)


def _on_delivery(err: Any, msg: Any) -> None:
    if err is not None:
        raise RuntimeError(f"raw delivery failed: {err}")


def _emit_round(journal: Journal, handles: list[RunHandle], events: int) -> float:
    started = time.perf_counter()
    n = len(handles)
    for i in range(events):
        etype, payload = _CYCLE[i % 4]
        handles[i % n].emit(etype, payload)
    journal.flush()
    return events / (time.perf_counter() - started)


def _checked_encoder_round(journal: Journal, handles: list[RunHandle], events: int) -> float:
    """One round of ours with every event written by the codec's checked path (the encoder's before)."""
    codec = journal._codec
    direct, codec._direct_by_type = codec._direct_by_type, {}
    try:
        return _emit_round(journal, handles, events)
    finally:
        codec._direct_by_type = direct


def run_publish(env: BenchEnv, cfg: PublishConfig) -> list[Row]:
    """Run pair 1; returns its rows (see the module docstring)."""
    settings = env.pair_settings("publish")
    with Journal(settings, producer_id=f"bench-{uuid.uuid4().hex[:6]}") as journal:
        handles = [journal.start_run("acme", "bench", {"i": i}) for i in range(RUNS)]
        journal.flush()
        txn = _Raw(journal, handles, cfg.events, transactional=True)
        idem = _Raw(journal, handles, cfg.events, transactional=False)
        commits_before = journal.stats["commits"]
        res = interleave(PAIR, [Side("runjournal emit", lambda: _emit_round(journal, handles, cfg.events)),
                                Side(BEFORE, lambda: _checked_encoder_round(journal, handles, cfg.events)),
                                Side("raw txn", txn.round), Side("raw idempotent", idem.round)],
                         rounds=cfg.rounds)
        ours_commits = journal.stats["commits"] - commits_before
    note = (f"{cfg.events} non-durable events/round over {RUNS} runs (MESSAGE/NODE_*, {len(txn.records[0][1])}-"
            f"{len(txn.records[1][1])} B); commits over all rounds: runjournal {ours_commits}, raw txn {txn.commits}")
    ours = summarise(res["runjournal emit"])
    rows = []
    for label, goal in (("raw txn", "≥ 0.25"), ("raw idempotent", None)):
        anchor = summarise(res[label])
        ratio = ours.value / anchor.value
        rows.append(Row(PAIR, "events/s", "runjournal emit", ours,
                        "raw txn, pre-encoded, same commit cadence" if label == "raw txn"
                        else "raw idempotent acks=all, pre-encoded",
                        anchor, goal=goal, met=goal_met(ratio, goal) if goal else None,
                        note=note if goal else "", ratio_rounds=paired_ratios(res["runjournal emit"], res[label])))
    rows.append(Row(PAIR, "events/s", "raw txn", summarise(res["raw txn"]), "raw idempotent acks=all",
                    summarise(res["raw idempotent"]), note="what transactions cost raw throughput",
                    ratio_rounds=paired_ratios(res["raw txn"], res["raw idempotent"])))
    rows.append(Row(PAIR, "events/s", "runjournal emit", ours, "the same, checked encoder (before)",
                    summarise(res[BEFORE]), note="the generated envelope writer: after / before",
                    ratio_rounds=paired_ratios(res["runjournal emit"], res[BEFORE])))
    return rows
