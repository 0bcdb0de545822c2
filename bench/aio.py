"""Pair 8 — asyncio: 100 concurrent runs × 10 journaled calls, the event loop's lag and calls/s.

The issue's acceptance load: 100 asyncio tasks, each a run making 10 side-effecting calls of a no-op
coroutine tool (INTENDED committed, tool awaited on the loop, COMMITTED committed). Measured on the loop:
a ticker task sleeps 1 ms in a loop and records how late it wakes (the lag any other coroutine of the
application would see); calls/s = 1,000 / wall time of the load. Sides, interleaved per round:

* **AsyncJournal** (``runjournal.producers.aio``): the sync protocol's steps in a pool of producer threads
  (64), the tool on the loop — what runjournal ships.
* **AsyncJournal, 1 producer thread**: the same with a single dedicated producer thread (every durable
  publish waits for the one before it: no group commit across runs).
* **AIOProducer** (``confluent_kafka.aio``, the anchor): a transactional ``AIOProducer`` (4 workers, the
  default) with an asyncio group commit written for the bench — events encoded by the same codec on the
  loop, produced into the open transaction, one ``commit_transaction`` covering every publish before it. It
  carries no lease check, no outcome bookkeeping, no headers (``AIOProducer`` refuses ``headers=``: the
  journal's traceparent), no lost-event tracking (``on_delivery`` is dropped): a lower bound of what an
  AIOProducer-based journal would cost.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from bench._env import BenchEnv
from bench._model import Row, paired_ratios, percentile, summarise
from bench._rounds import Side, interleave
from runjournal.core import kafka
from runjournal.core.settings import Settings
from runjournal.producers import partition_for
from runjournal.producers.aio import AsyncJournal
from runjournal.schemas import Event, EventType, codec_from_settings, new_event_id, utcnow

__all__ = ["AioConfig", "run_aio"]

PAIR = "8 asyncio"
TICK_S = 0.001


@dataclass(frozen=True)
class AioConfig:
    """Sizes of pair 8."""

    runs: int
    """Concurrent runs (asyncio tasks)."""
    calls: int
    """Journaled calls per run."""
    rounds: int
    """Measured rounds (after one warm-up)."""


class NoopTool:
    """A side-effecting coroutine tool that does nothing (awaited on the loop)."""

    name = "noop"
    side_effect = True
    timeout_ms = 1000

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        return {"ok": True}

    async def acall(self, args: dict[str, Any], idempotency_key: str) -> Any:
        return {"ok": True}


@dataclass(frozen=True)
class _Round:
    """One side's round: the ticker's lag samples (ms) and the load's wall time (s)."""

    lags: list[float]
    seconds: float

    def __str__(self) -> str:
        return f"lag p99 {percentile(self.lags, 99):.2f} ms, {self.seconds:.2f} s"


async def _measure(load: Any) -> _Round:
    """Run ``load()`` with a 1 ms ticker beside it; returns (lag samples in ms, seconds of the load)."""
    lags: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        while not done.is_set():
            t0 = time.perf_counter()
            await asyncio.sleep(TICK_S)
            lags.append(max(0.0, (time.perf_counter() - t0 - TICK_S) * 1000))

    tick = asyncio.create_task(ticker())
    t0 = time.perf_counter()
    try:
        await load()
    finally:
        elapsed = time.perf_counter() - t0
        done.set()
        await tick
    return _Round(lags, elapsed)


def _journal_side(settings: Settings, cfg: AioConfig, threads: int) -> _Round:
    async def main() -> _Round:
        tool = NoopTool()
        async with await AsyncJournal.open(settings, producer_id=f"bench-aio-{uuid.uuid4().hex[:6]}",
                                           producer_threads=threads) as journal:
            async def one() -> None:
                run = await journal.start_run("acme", "bench", {"pair": 7})
                for i in range(cfg.calls):
                    await run.call(tool, {"i": i})
                await run.succeed()

            async def load() -> None:
                await asyncio.gather(*(one() for _ in range(cfg.runs)))

            return await _measure(load)

    return asyncio.run(main())


class _AioTxn:
    """A transactional AIOProducer with an asyncio group commit (the anchor; see the module docstring)."""

    def __init__(self, producer: Any, topic: str) -> None:
        self.p, self.topic = producer, topic
        self.lock = asyncio.Lock()
        self.gen, self.resolved, self.open = 1, 0, False

    async def publish(self, key: bytes, value: bytes, partition: int) -> None:
        async with self.lock:
            if not self.open:
                await self.p.begin_transaction()
                self.open = True
            await self.p.produce(self.topic, value=value, key=key, partition=partition)
            gen = self.gen
        async with self.lock:
            if self.resolved < gen:
                await self.p.commit_transaction(30)
                self.open, self.resolved, self.gen = False, self.gen, self.gen + 1


class _ThreadTxn(_AioTxn):
    """The same group commit over a sync transactional ``Producer`` driven by one dedicated thread with futures
    (the transport runjournal's AsyncJournal uses, without its publisher): isolates AIOProducer vs a thread."""

    def __init__(self, producer: Any, topic: str) -> None:
        super().__init__(self, topic)
        self.raw = producer
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="bench-producer")

    async def _in_thread(self, fn: Any, *args: Any) -> Any:
        return await asyncio.wrap_future(self.pool.submit(fn, *args))

    async def begin_transaction(self) -> None:
        await self._in_thread(self.raw.begin_transaction)

    async def produce(self, topic: str, **kwargs: Any) -> None:
        self.raw.produce(topic, **kwargs)  # enqueue only: never blocks (the loop keeps it)

    async def commit_transaction(self, timeout: float) -> None:
        await self._in_thread(self.raw.commit_transaction, timeout)

    async def close(self) -> None:
        await self._in_thread(self.raw.flush, 10)
        self.pool.shutdown()


def _aio_side(settings: Settings, cfg: AioConfig, transport: str) -> _Round:
    from confluent_kafka import Producer
    from confluent_kafka.aio import AIOProducer

    codec = codec_from_settings(settings)
    topic = settings.events_topic

    async def main() -> _Round:
        config = kafka.client_config(settings, "producer", **{
            "transactional.id": f"{settings.topic_prefix}.bench-aio-{uuid.uuid4().hex[:6]}", "acks": "all",
            "enable.idempotence": True, "compression.type": "lz4", "linger.ms": 5})
        if transport == "aio":
            producer: Any = AIOProducer(config)
            await producer.init_transactions(30)
            txn = _AioTxn(producer, topic)
        else:
            raw = Producer(config)
            txn = producer = _ThreadTxn(raw, topic)
            await txn._in_thread(raw.init_transactions, 30)

        def event(run_id: str, seq: int, etype: EventType, payload: dict[str, Any]) -> Event:
            return Event(event_id=new_event_id(), run_id=run_id, tenant_id="acme", seq=seq, epoch=1,
                         producer_id="bench-aio", type=etype, occurred_at=utcnow(), payload=payload)

        async def one() -> None:
            run_id, tool = str(uuid.uuid4()), NoopTool()
            part = partition_for(run_id, settings.partitions)
            for i in range(cfg.calls):
                common = {"call_id": f"{i:064}", "tool": "noop", "idempotency_key": f"{i:064}", "args_digest": "a" * 64}
                intent = event(run_id, 2 * i + 1, EventType.TOOL_CALL_INTENDED, {
                    **common, "side_effect": True, "attempt": 1, "timeout_ms": 1000, "args_json": f'{{"i":{i}}}'})
                await txn.publish(intent.key.encode(), codec.encode(intent), part)
                await tool.acall({"i": i}, common["idempotency_key"])
                done = event(run_id, 2 * i + 2, EventType.TOOL_CALL_COMMITTED,
                             {**common, "result_json": '{"ok":true}', "result_digest": "r" * 64})
                await txn.publish(done.key.encode(), codec.encode(done), part)

        async def load() -> None:
            await asyncio.gather(*(one() for _ in range(cfg.runs)))

        try:
            return await _measure(load)
        finally:
            await producer.close()

    return asyncio.run(main())


def run_aio(env: BenchEnv, cfg: AioConfig) -> list[Row]:
    """Run pair 8; returns its rows (see the module docstring)."""
    settings = env.pair_settings("aio")
    sides = {"AsyncJournal": lambda: _journal_side(settings, cfg, 64),
             "AsyncJournal, 1 thread": lambda: _journal_side(settings, cfg, 1),
             "AIOProducer": lambda: _aio_side(settings, cfg, "aio"),
             "thread + futures": lambda: _aio_side(settings, cfg, "thread")}
    res = interleave(PAIR, [Side(k, v) for k, v in sides.items()], rounds=cfg.rounds)
    n = cfg.runs * cfg.calls
    rows = []
    for q in (50, 99):
        per = {k: [percentile(r.lags, q) for r in res[k]] for k in sides}
        pooled = {k: percentile([x for r in res[k] for x in r.lags], q) for k in sides}
        ours, anchor = summarise(per["AsyncJournal"], pooled["AsyncJournal"]), \
            summarise(per["AIOProducer"], pooled["AIOProducer"])
        rows.append(Row(PAIR, f"loop lag ms p{q}", "AsyncJournal (64 producer threads)", ours,
                        "AIOProducer txn + group commit", anchor, goal="≤ 10 ms" if q == 99 else None,
                        met=(ours.value <= 10) if q == 99 else None,
                        note=f"{cfg.runs} runs × {cfg.calls} calls, 1 ms ticker; p pooled over rounds" if q == 50
                        else "goal on ours (absolute): the issue's acceptance",
                        ratio_rounds=paired_ratios(per["AsyncJournal"], per["AIOProducer"])))
        rows.append(_pair_row(f"transport: loop lag ms p{q}", per, pooled, "thread + futures", "AIOProducer"))
    rate = {k: [n / r.seconds for r in res[k]] for k in sides}
    for ours, anchor_key in (("AsyncJournal", "AIOProducer"), ("AsyncJournal", "AsyncJournal, 1 thread"),
                             ("thread + futures", "AIOProducer")):
        rows.append(Row(PAIR, "calls/s" if ours == "AsyncJournal" else "transport: calls/s", LABELS[ours],
                        summarise(rate[ours]), LABELS[anchor_key], summarise(rate[anchor_key]),
                        ratio_rounds=paired_ratios(rate[ours], rate[anchor_key])))
    return rows


LABELS = {"AsyncJournal": "AsyncJournal (64 producer threads)", "AsyncJournal, 1 thread": "AsyncJournal, 1 thread",
          "AIOProducer": "AIOProducer txn + group commit",
          "thread + futures": "1 dedicated thread + futures, same group commit"}


def _pair_row(metric: str, per: dict[str, list[float]], pooled: dict[str, float], ours: str, anchor: str) -> Row:
    return Row(PAIR, metric, LABELS[ours], summarise(per[ours], pooled[ours]), LABELS[anchor],
               summarise(per[anchor], pooled[anchor]), ratio_rounds=paired_ratios(per[ours], per[anchor]))
