"""Pair 12 — large results: a 100 MB tool result journaled and read back, against a raw produce + consume.

Ours, per round: one ``run.call`` of a tool returning a 100 MB string (``{"blob": "…"}``): canonical JSON, digest,
cut into ``payload_chunk_bytes`` records (512 KiB), produced into the agent's transaction on ``{prefix}.payloads``,
delivery reports awaited, committed, then TOOL_CALL_COMMITTED with the ``kafka:`` reference (strict commit) —
**write MB/s** = result bytes / wall time of the call (the tool returns a prepared value: ~0 ms). Then
``ResultStore.read_payload`` of that reference (Redis not asked): group-less ``read_committed`` consumer assigned at
the first offset, records matched by key, reassembled, digest checked — **read MB/s**.

Anchor, same broker, same round: a plain idempotent ``acks=all`` producer (``runjournal.core.kafka.producer``)
producing the same bytes as 512 KiB records to a topic of its own, ``flush()`` — write MB/s; a plain consumer
assigned at the first offset reading them back to the last — read MB/s. No transaction, no digest, no JSON.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from bench._env import BenchEnv
from bench._model import Row, paired_ratios, summarise
from bench._rounds import Side, interleave
from runjournal.core import kafka

__all__ = ["PayloadsConfig", "run_payloads"]

PAIR = "12 payloads"


@dataclass(frozen=True)
class PayloadsConfig:
    size_bytes: int = 100_000_000
    rounds: int = 3


def run_payloads(env: BenchEnv, config: PayloadsConfig) -> list[Row]:
    """Run pair 12 (see the module docstring); returns its rows."""
    from confluent_kafka import TopicPartition

    from runjournal.producers import Journal
    from runjournal.producers.results import PayloadRef, ResultStore
    from runjournal.schemas import EventType

    settings = env.pair_settings("payloads", partitions=1)
    chunk = settings.payload_chunk_bytes
    size = config.size_bytes - len('{"blob":""}')
    value = {"blob": ("0123456789abcdef" * (size // 16 + 1))[:size]}
    raw_bytes = ("0123456789abcdef" * (config.size_bytes // 16 + 1))[:config.size_bytes].encode()
    raw_topic = env.topic("payloads-raw", partitions=1, config={"cleanup.policy": "compact"})
    journal = Journal(settings, producer_id=f"bench-{uuid.uuid4().hex[:6]}", outcome_commit="strict")
    store = ResultStore(None, settings.topic_prefix, settings, read_timeout_s=300)
    refs: list[str] = []

    class Big:
        name, side_effect, timeout_ms = "big", True, 60_000

        def __call__(self, args: dict[str, Any], key: str) -> Any:
            return value

    def ours_write() -> float:
        run = journal.start_run("bench", "payloads", {})
        started = time.perf_counter()
        run.call(Big(), {})
        elapsed = time.perf_counter() - started
        run.succeed()
        refs.append(_last_ref(settings, run.run_id, EventType))
        return config.size_bytes / elapsed / 1e6

    def ours_read() -> float:
        where = PayloadRef.parse(refs[-1])
        started = time.perf_counter()
        text = store.read_payload(where)
        elapsed = time.perf_counter() - started
        assert len(text) >= config.size_bytes - 16
        return config.size_bytes / elapsed / 1e6

    offsets: list[tuple[int, int]] = []

    def raw_write() -> float:
        producer = kafka.producer(settings, **{"acks": "all", "enable.idempotence": True, "linger.ms": 5,
                                               "compression.type": "lz4"})
        got: list[int] = []

        def delivered(err: Any, msg: Any) -> None:
            if err is None:
                got.append(msg.offset())

        started = time.perf_counter()
        prefix = uuid.uuid4().hex
        for i in range(0, len(raw_bytes), chunk):
            while True:
                try:
                    producer.produce(raw_topic, key=f"{prefix}-{i}".encode(), value=raw_bytes[i:i + chunk],
                                     partition=0, on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
        producer.flush(120)
        elapsed = time.perf_counter() - started
        offsets.append((min(got), max(got)))
        return config.size_bytes / elapsed / 1e6

    def raw_read() -> float:
        first, last = offsets[-1]
        consumer = kafka.consumer(settings, **{"group.id": f"bench-{uuid.uuid4()}", "enable.auto.commit": False})
        started = time.perf_counter()
        parts = []
        consumer.assign([TopicPartition(raw_topic, 0, first)])
        done = False
        while not done:
            for msg in consumer.consume(64, 1.0):
                if msg.error() is None:
                    parts.append(msg.value())
                    done = msg.offset() >= last
                    if done:
                        break
        data = b"".join(parts)
        elapsed = time.perf_counter() - started
        consumer.close()
        assert len(data) == config.size_bytes
        return config.size_bytes / elapsed / 1e6

    try:
        res = interleave(PAIR, [Side("journal write", ours_write), Side("raw write", raw_write),
                                Side("journal read", ours_read), Side("raw read", raw_read)],
                         rounds=config.rounds)
    finally:
        journal.close()
    mb = config.size_bytes / 1e6

    def row(ours: str, anchor: str, note: str) -> Row:
        return Row(PAIR, "MB/s", ours, summarise(res[ours]), anchor, summarise(res[anchor]), note=note,
                   ratio_rounds=paired_ratios(res[ours], res[anchor]))

    return [row("journal write", "raw write",
                f"one {mb:.0f} MB result: run.call (canonical JSON, digest, {chunk // 1024} KiB records in a "
                "transaction, delivery awaited, commit, then the COMMITTED event, strict) vs a plain idempotent "
                "producer + flush of the same bytes"),
            row("journal read", "raw read",
                "ResultStore.read_payload (read_committed, by offset, keys matched, digest checked; Redis not "
                "asked) vs a plain consumer reading the same records by offset")]


def _last_ref(settings: Any, run_id: str, event_type: Any) -> str:
    """The ``result_ref`` of the run's TOOL_CALL_COMMITTED (read from its partition)."""
    from runjournal.consumers.ops.inspect import read_run_events

    rows = read_run_events(settings, run_id)
    for row in reversed(rows):
        if row["type"] == event_type.TOOL_CALL_COMMITTED.value:
            return str(row["event"].payload["result_ref"])
    raise RuntimeError(f"run {run_id}: no TOOL_CALL_COMMITTED")
