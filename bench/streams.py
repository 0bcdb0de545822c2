"""Pair 14 — streams: ``run.stream()`` tokens to a reader, against raw produce → consume on the same topic.

Ours, per round: one run's ``run.stream()`` segment, ``N`` chunks of a 16-byte token written as fast as
``write`` returns, read by a ``StreamReader`` (the console's and ``runjournal stream``'s reader: key filter, JSON
decode, epoch fence) in a thread of the same process, started at the partition's end first — **tokens/s to the
reader** (first write to last chunk read); then ``M`` chunks paced at 200/s (a fast model's token rate) —
**producer → reader delay**, ms p50 and p99 (``perf_counter`` at ``write`` to ``perf_counter`` when the reader
returns it).

Anchor, same round, same topic and partition: a raw ``confluent_kafka.Producer`` with the stream writer's config
(idempotent, ``acks=all``, ``linger.ms=5``, lz4) producing the same bytes, and a raw consumer assigned at the end
reading them (no decode). The ratio is what the writer's validation and record building and the reader's decode and
fence cost.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench._env import BenchEnv
from bench._model import Row, paired_ratios, percentile, summarise
from bench._rounds import Side, interleave

__all__ = ["StreamsConfig", "run_streams"]

PAIR = "14 streams"
TOKEN = "tok-0123456789ab"


@dataclass(frozen=True)
class StreamsConfig:
    tokens: int = 20_000
    """Chunks per round for the throughput figure."""
    paced: int = 400
    """Chunks per round for the delay figure (at ``rate`` per second)."""
    rate: float = 200.0
    rounds: int = 3


def _measure(write: Callable[[int], None], flush: Callable[[], None], poll: Callable[[], list[int]],
             count: int, rate: float | None) -> tuple[float, list[float]]:
    """Write ``count`` chunks (``write(i)``; paced at ``rate``/s when given) while a thread polls them; returns
    (chunks/s first write → last read, delays in ms)."""
    sent: list[float] = [0.0] * count
    got: list[float] = [0.0] * count
    done = threading.Event()

    def read() -> None:
        seen = 0
        while seen < count:
            for i in poll():
                got[i] = time.perf_counter()
                seen += 1
        done.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    start = time.perf_counter()
    for i in range(count):
        if rate:
            wait = start + i / rate - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
        sent[i] = time.perf_counter()
        write(i)
    flush()
    assert done.wait(120), "the reader did not get every chunk"
    return count / (max(got) - start), [(g - s) * 1000 for s, g in zip(sent, got, strict=True)]


def run_streams(env: BenchEnv, config: StreamsConfig) -> list[Row]:
    """Run pair 14 (see the module docstring); returns its rows."""
    from confluent_kafka import TopicPartition

    from runjournal.consumers.streams import StreamReader
    from runjournal.core import kafka
    from runjournal.producers import Journal
    from runjournal.producers.streams import encode_record

    settings = env.pair_settings("streams", partitions=1)
    journal = Journal(settings, producer_id=f"bench-{uuid.uuid4().hex[:6]}")
    raw = kafka.producer(settings, **{"enable.idempotence": "true", "acks": "all", "linger.ms": "5",
                                      "compression.type": "lz4"})

    def ours(count: int, rate: float | None) -> tuple[float, list[float]]:
        run = journal.start_run("bench", "streams", {})
        reader = StreamReader(settings, run.run_id)
        reader.poll(0.5)  # assigned, at the (empty) stream's start
        try:
            with run.stream("answer") as s:
                return _measure(lambda i: s.write(TOKEN), lambda: journal.streams.flush(30),
                                lambda: [e.n - 1 for e in reader.poll(0.1) if e.kind == "chunk"], count, rate)
        finally:
            reader.close()
            run.succeed()

    def anchor(count: int, rate: float | None) -> tuple[float, list[float]]:
        run_id = f"raw-{uuid.uuid4().hex[:8]}"
        consumer = kafka.consumer(settings, **{"group.id": f"bench-{uuid.uuid4()}", "enable.auto.commit": False})
        tp = TopicPartition(settings.streams_topic, 0)
        consumer.assign([TopicPartition(settings.streams_topic, 0, consumer.get_watermark_offsets(tp)[1])])
        values = [encode_record({"run_id": run_id, "epoch": 1, "segment": "answer#1.1", "n": i + 1, "kind": "chunk",
                                 "data": TOKEN, "at_ms": 0}) for i in range(count)]
        index = {v: i for i, v in enumerate(values)}
        key = run_id.encode()

        def poll() -> list[int]:
            return [index[m.value()] for m in consumer.consume(500, timeout=0.1) if m.error() is None]

        def write(i: int) -> None:
            raw.produce(settings.streams_topic, value=values[i], key=key, partition=0)
            raw.poll(0)

        try:
            return _measure(write, lambda: raw.flush(30), poll, count, rate)
        finally:
            consumer.close()

    def sides(fn: Callable[[int, float | None], tuple[float, list[float]]]) -> Callable[[], Any]:
        return lambda: (fn(config.tokens, None)[0], fn(config.paced, config.rate)[1])

    try:
        res = interleave(PAIR, [Side("run.stream → StreamReader", sides(ours)),
                                Side("raw produce → consume", sides(anchor))], rounds=config.rounds, rotate=True)
    finally:
        journal.close()
        raw.flush(10)
    o, a = res["run.stream → StreamReader"], res["raw produce → consume"]
    rows = [Row(PAIR, "tokens/s to a reader", "run.stream → StreamReader", summarise([r[0] for r in o]),
                "raw produce → consume", summarise([r[0] for r in a]),
                note=f"{config.tokens} 16-byte chunks as fast as write returns, read in the same process",
                ratio_rounds=paired_ratios([r[0] for r in o], [r[0] for r in a]))]
    for q in (50, 99):
        per_o, per_a = [percentile(r[1], q) for r in o], [percentile(r[1], q) for r in a]
        pooled_o = percentile([x for r in o for x in r[1]], q)
        pooled_a = percentile([x for r in a for x in r[1]], q)
        rows.append(Row(PAIR, f"ms p{q} producer → reader", "run.stream → StreamReader",
                        summarise(per_o, pooled_o), "raw produce → consume", summarise(per_a, pooled_a),
                        note=f"{config.paced} chunks paced at {config.rate:.0f}/s" if q == 50 else "",
                        ratio_rounds=paired_ratios(per_o, per_a)))
    return rows
