"""Pair 2 — the side-effect boundary: one ``RunHandle.call`` with a no-op tool, in milliseconds.

Ours, in both outcome modes (``Journal(outcome_commit=…)``, docs/guide/side-effect-boundary.md):

* ``group`` (the default): TOOL_CALL_INTENDED produced and committed (``commit_transaction`` returning is
  the broker's ack), the tool, TOOL_CALL_COMMITTED produced into the open transaction — acknowledged by the
  next commit (here: the next call's intent). The tool has ``reconcile()`` (what makes it eligible).
* ``strict``: the same, and the COMMITTED committed before ``call`` returns: two round trips.

Anchors, measured interleaved on the same topic:

* raw txn ×1: a transactional ``Producer`` (the Journal's config) doing ``begin_transaction``, ``produce``
  of a pre-encoded INTENDED-sized value, ``commit_transaction`` — one round trip, nothing else: the floor
  of a fenced, acknowledged write and the anchor of the group mode's goals.
* raw txn ×2: the same twice (the strict mode's two round trips, with nothing else).
* raw plain ×2: an idempotent acks=all producer doing ``produce`` + ``flush()`` twice: the same two
  acked writes without transactions — the difference is what fencing (transactions) costs.
* LangGraph ``SqliteSaver.put``: one checkpoint write to a local SQLite file, the durability
  point LangGraph users know (a reference, not an equivalent: no broker, no fencing, no replication).

Latency figures: p50 and p99 over every sample of every round (the headline), and the per-round
p50/p99 min–max.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from bench._env import BenchEnv
from bench._model import Row, goal_met, paired_ratios, percentile, summarise
from bench._rounds import Side, interleave
from runjournal.core import kafka
from runjournal.producers import Journal, partition_for
from runjournal.producers.tools import Outcome
from runjournal.schemas import Event, EventType, codec_from_settings, new_event_id, utcnow

__all__ = ["BoundaryConfig", "run_boundary"]

PAIR = "2 side-effect boundary"


@dataclass(frozen=True)
class BoundaryConfig:
    """Sizes of pair 2."""

    calls: int
    """Samples per side per round."""
    rounds: int
    """Measured rounds (after one warm-up)."""


@dataclass(frozen=True)
class NoopTool:
    """A side-effecting tool that does nothing (the protocol's own cost is what is measured); its provider
    "remembers" every call, so it can reconcile — which makes its outcome eligible for group commit."""

    name: str = "noop"
    side_effect: bool = True
    timeout_ms: int = 1000

    def __call__(self, args: dict[str, Any], idempotency_key: str) -> Any:
        return {"ok": True}

    def reconcile(self, idempotency_key: str) -> Outcome | None:
        """Every call of this tool executed and returned ``{"ok": true}``."""
        return Outcome(executed=True, result={"ok": True})


def _ms(t0: int) -> float:
    return (time.perf_counter_ns() - t0) / 1e6


class _RawPair:
    """Two raw acked writes per sample, transactional or plain."""

    def __init__(self, journal: Journal, *, transactional: bool, writes: int = 2) -> None:
        codec = codec_from_settings(journal.settings)
        run_id = str(uuid.uuid4())
        event = Event(event_id=new_event_id(), run_id=run_id, tenant_id="acme", seq=2, epoch=1,
                      producer_id=journal.producer_id, type=EventType.TOOL_CALL_INTENDED, occurred_at=utcnow(),
                      payload={"call_id": "c" * 64, "tool": "noop", "idempotency_key": "c" * 64,
                               "args_digest": "a" * 64, "side_effect": True, "attempt": 1, "timeout_ms": 1000,
                               "args_json": '{"x":1}'})
        self.value, self.key = codec.encode(event), event.key.encode()
        self.part, self.topic = partition_for(run_id, journal.partitions), journal.topic
        self.transactional, self.writes = transactional, writes
        config = kafka.client_config(journal.settings, "producer", **{"enable.idempotence": True, "acks": "all",
                                     "compression.type": "lz4", "linger.ms": 5})
        if transactional:
            config |= {"transactional.id": f"{journal.transactional_id}-raw{writes}",
                       "transaction.timeout.ms": 15_000}
        self.producer = Producer(config)
        if transactional:
            self.producer.init_transactions(30)

    def _write(self) -> None:
        p = self.producer
        if self.transactional:
            p.begin_transaction()
            p.produce(self.topic, key=self.key, value=self.value, partition=self.part)
            p.commit_transaction(30)
        else:
            p.produce(self.topic, key=self.key, value=self.value, partition=self.part)
            if p.flush(30):
                raise RuntimeError("raw plain write not acknowledged")

    def samples(self, n: int) -> list[float]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            for _ in range(self.writes):
                self._write()
            out.append(_ms(t0))
        return out


class _Sqlite:
    """LangGraph's SqliteSaver on a file in the bench's scratch directory."""

    def __init__(self, path: Path) -> None:
        from langgraph.checkpoint.base import empty_checkpoint
        from langgraph.checkpoint.sqlite import SqliteSaver

        self.saver = SqliteSaver(sqlite3.connect(str(path), check_same_thread=False))
        self.saver.setup()
        self.empty = empty_checkpoint
        self.thread = str(uuid.uuid4())

    def samples(self, n: int) -> list[float]:
        out = []
        config: Any = {"configurable": {"thread_id": self.thread, "checkpoint_ns": ""}}
        for i in range(n):
            cp = self.empty()
            cp["channel_values"] = {"messages": [{"role": "assistant", "content": "booked", "i": i}],
                                    "result": {"ok": True}}
            cp["channel_versions"] = {"messages": i + 1, "result": i + 1}
            t0 = time.perf_counter_ns()
            config = self.saver.put(config, cp, {"source": "loop", "step": i, "parents": {}},
                                    {"messages": i + 1, "result": i + 1})
            out.append(_ms(t0))
        return out


def _calls(journal: Journal, n: int) -> list[float]:
    tool, out = NoopTool(), []
    run = journal.start_run("acme", "bench", {"pair": 2})
    with run.node("work"):
        for i in range(n):
            t0 = time.perf_counter_ns()
            run.call(tool, {"i": i})
            out.append(_ms(t0))
    run.succeed()
    return out


def _latency_rows(res: dict[str, list[list[float]]], ours: str, anchor: str, anchor_label: str,
                  goals: dict[int, str], note: str = "") -> list[Row]:
    rows = []
    for q in (50, 99):
        per = {side: [percentile(r, q) for r in res[side]] for side in (ours, anchor)}
        pooled = {side: percentile([x for r in res[side] for x in r], q) for side in (ours, anchor)}
        o, a = summarise(per[ours], pooled[ours]), summarise(per[anchor], pooled[anchor])
        goal = goals.get(q)
        rows.append(Row(PAIR, f"ms p{q}", ours, o, anchor_label, a, goal=goal,
                        met=goal_met(o.value / a.value, goal) if goal else None, note=note if q == 50 else "",
                        ratio_rounds=paired_ratios(per[ours], per[anchor])))
    return rows


def run_boundary(env: BenchEnv, cfg: BoundaryConfig) -> list[Row]:
    """Run pair 2; returns its rows (see the module docstring)."""
    settings = env.pair_settings("boundary")
    tag = uuid.uuid4().hex[:6]
    with Journal(settings, producer_id=f"bench-{tag}") as group, \
            Journal(settings, producer_id=f"bench-{tag}-strict", outcome_commit="strict") as strict:
        assert group.outcome_commit == "group", "the default outcome mode is group commit"
        one, txn = _RawPair(group, transactional=True, writes=1), _RawPair(group, transactional=True)
        plain = _RawPair(group, transactional=False)
        sqlite = _Sqlite(env.work_dir / f"{settings.topic_prefix}.sqlite")
        res = interleave(PAIR, [Side("runjournal call", lambda: _calls(group, cfg.calls)),
                                Side("raw txn ×1", lambda: one.samples(cfg.calls)),
                                Side("runjournal call, strict", lambda: _calls(strict, cfg.calls)),
                                Side("raw txn ×2", lambda: txn.samples(cfg.calls)),
                                Side("raw plain ×2", lambda: plain.samples(cfg.calls)),
                                Side("SqliteSaver.put", lambda: sqlite.samples(cfg.calls))], rounds=cfg.rounds)
    n = cfg.calls * cfg.rounds
    rows = _latency_rows(res, "runjournal call", "raw txn ×1",
                         "raw txn ×1 (begin, produce, commit_transaction)", {50: "≤ 1.2", 99: "≤ 1.5"},
                         note=f"group commit (the default): the outcome rides the next commit; {n} samples per "
                              "side; p-values pooled over rounds, range = per-round values")
    rows += _latency_rows(res, "runjournal call, strict", "raw txn ×2",
                          "raw txn ×2 (begin, produce, commit_transaction) ×2", {99: "≤ 1.3"},
                          note="strict: the outcome committed before call returns (two round trips)")
    rows += _latency_rows(res, "runjournal call, strict", "runjournal call", "runjournal call (group)", {},
                          note="what group commit saves per call")
    rows += _latency_rows(res, "raw txn ×2", "raw plain ×2", "raw plain ×2 (produce + flush, acks=all) ×2", {},
                          note="the cost of fencing: transactional vs plain acked round trips")
    rows += _latency_rows(res, "runjournal call", "SqliteSaver.put",
                          "LangGraph SqliteSaver.put (local file, reference)", {})
    return rows
