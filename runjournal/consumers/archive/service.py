"""The archiver: a consumer group of its own (``{prefix}.archiver``) that notes when runs finish and archives each
one once its retention has passed (decision 0056).

The main loop, in order:

1. Consume a batch of ``{prefix}.events`` (read_committed, offsets stored by hand).
2. For each decodable event: a terminal one (RUN_SUCCEEDED / FAILED / CANCELLED) notes its run as finished, any
   later control-flow event of the run (a RUN_RESUMED continuing a failed run) as not finished. Tombstones and
   undecodable records are passed over (the projector quarantines the latter).
3. Write the batch's notes to Redis in one MULTI on the archive unit ``{P:arc}``: a finished run goes into the due
   set ``rj:{P:arc}:due`` scored by Redis's ``TIME`` (ms) at this moment and its tenant and agent into
   ``rj:{P:arc}:runs``; a reopened run leaves both. Then commit the batch's offsets — after the durable write, so a
   crash redelivers the batch (the score moves a little later: harmless).
4. Every ``sweep_interval_s`` (and once when caught up): read Redis's ``TIME`` and the due set; each run of a
   partition this member is assigned whose ``now − score ≥ Settings.retention_for(tenant, agent)`` is archived
   (:func:`archive_runs`, which folds the run's events again and refuses an unfinished one: that one leaves the due
   set). The members of the group split the due runs by partition, as they split the topic; a sweep reads each
   partition of the three topics once for all its due runs and writes the tombstones through one long-lived
   producer, so its cost is one read of the live partitions, not one per run (decision 0056 § Cost).

One clock decides: both the score and ``now`` are Redis's. Every call to a dependency runs under the one failure
policy (``runjournal.consumers.runtime.failures``): a transient failure waits — the object store not answering
too (``ObjectStoreUnavailableError``: nothing is removed meanwhile) — and a fatal one stops the service. A failure
of one run's archive (a verify mismatch, an owner still holding its lease, a tombstone not acknowledged, a
continuation holding the run: ``RunReopeningError``) leaves that run due for the next sweep; a
run erased meanwhile (``RunErasedError``, decision 0057) leaves the due set. Each sweep also trims erase marks older
than ``ERASE_MARK_MS``.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from confluent_kafka import Message, Producer

from runjournal.consumers.archive.metrics import ArchiverMetrics
from runjournal.consumers.archive.store import (
    TERMINAL_TYPES,
    ArchiveError,
    ArchiveReport,
    RunErasedError,
    RunIdReusedError,
    RunNotFinishedError,
    archive_runs,
    redis_now_ms,
)
from runjournal.consumers.ops.erase import ERASE_MARK_MS, tombstone_producer
from runjournal.consumers.runtime.failures import FailurePolicy, stops_consumer
from runjournal.consumers.runtime.group import (
    GROUP_SESSION_TIMEOUT_MS,
    commit_pending,
    group_consumer_config,
    partition_lags,
)
from runjournal.consumers.runtime.partitions import events_partition_count
from runjournal.core import kafka, redis_client
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings
from runjournal.schemas import Event, EventType, codec_from_settings
from runjournal.schemas.errors import RegistryError, SchemaError
from runjournal.schemas.keys import partition_for

__all__ = ["Archiver", "ArchiverStats", "archiver_group"]

log = logging.getLogger("runjournal.consumers.archive")


def archiver_group(settings: Settings) -> str:
    """The archiver's consumer group id: ``{prefix}.archiver``."""
    return f"{settings.topic_prefix}.archiver"


@dataclass
class ArchiverStats:
    """What one :meth:`Archiver.run` did."""

    events: int = 0
    """Records consumed."""
    finished_noted: int = 0
    """Terminal events noted in the due set."""
    archived: list[str] = field(default_factory=list)
    """Runs archived and removed from the hot stores."""
    refused: list[str] = field(default_factory=list)
    """Runs the due set held that were not finished after all, or were erased meanwhile (they left it)."""
    retried: list[str] = field(default_factory=list)
    """Runs whose archive failed on their own (a verify mismatch, an owner's live lease, a tombstone not
    acknowledged): nothing was removed, they stay due and the next sweep tries them again."""
    elapsed_s: float = 0.0
    """Wall time of the run, seconds."""

    def as_dict(self) -> dict[str, Any]:
        """The stats as a JSON-able dict."""
        return asdict(self)


class Archiver:
    """Notes finished runs and archives those past their retention; one instance per process, many per group.

    Args:
        settings: the stack, prefix, archive URL and retention (``RUNJOURNAL_RETENTION_S``,
            ``RUNJOURNAL_RETENTION_OVERRIDES``).
        batch_size: records per consume call (default 1,000).
        sweep_interval_s: seconds between two sweeps of the due set (default 10).
        max_outage_s: longest one dependency outage is waited out before the archiver stops, seconds (240).
        metrics: its Prometheus families (default: a new registry; ``runjournal archiver --metrics-port`` serves
            it).
        sweep_budget_s: longest one sweep archives before the consumer is polled again, seconds (30); the due runs
            left are swept right after.
        session_timeout_ms: how long a dead member holds its partitions before the group moves them (ms, 10 s).
    """

    def __init__(self, settings: Settings, *, batch_size: int = 1000, sweep_interval_s: float = 10.0,
                 max_outage_s: float = 240.0, metrics: ArchiverMetrics | None = None,
                 sweep_budget_s: float = 30.0, session_timeout_ms: int = GROUP_SESSION_TIMEOUT_MS) -> None:
        self.settings = settings
        self.topic = settings.events_topic
        self.batch_size = batch_size
        self.sweep_interval_s = sweep_interval_s
        self.sweep_budget_s = sweep_budget_s
        self._more = False
        self.codec = codec_from_settings(settings)
        self.redis = redis_client.client(settings)
        self.keys = RedisKeys(settings.topic_prefix)
        self._stop = threading.Event()
        self.metrics = metrics if metrics is not None else ArchiverMetrics()
        self.policy = FailurePolicy("archiver", log, max_wait_s=max_outage_s, stop=self._stop,
                                    registry=self.metrics.registry)
        self._fatal: str | None = None
        self.stats = ArchiverStats()
        # 10 s sessions, as the projector's: a SIGKILLed archiver's partitions move after that, not Kafka's 45 s
        config = group_consumer_config(archiver_group(settings), session_timeout_ms=session_timeout_ms)
        self.consumer = kafka.consumer(settings, **config, error_cb=self._on_error)
        self._subscribed = False
        self._producer: Producer | None = None

    def _on_error(self, err: Any) -> None:
        if stops_consumer(err):
            self._fatal = str(err)
            log.error("fatal consumer error", extra={"error": str(err)})

    def run(self, *, until_caught_up: bool = False, stop: threading.Event | None = None,
            idle_timeout_s: float = 60.0) -> ArchiverStats:
        """Consume and sweep until ``stop`` is set, or (``until_caught_up``) until every partition is read to its
        end and one sweep is done.

        Raises:
            FatalDependencyError / DependencyUnavailableError: the failure policy's verdicts.
            TimeoutError: ``until_caught_up`` and nothing was read for ``idle_timeout_s`` seconds without being caught
                up.
        """
        started = time.monotonic()
        stop = stop or self._stop
        done: dict[int, int] = {}
        next_sweep = 0.0
        last_data = time.monotonic()

        def on_assign(consumer: Any, partitions: list[Any]) -> None:
            # a partition resumed at its committed offset has no position until a record arrives: its lag counts
            # from the committed offset (without this, a quiet partition would never look caught up)
            for tp in consumer.committed(partitions, timeout=10):
                if tp.offset >= 0:
                    done.setdefault(tp.partition, tp.offset - 1)

        self.consumer.subscribe([self.topic], on_assign=on_assign)
        self._subscribed = True
        try:
            while not stop.is_set():
                if self._fatal:
                    raise ArchiveError(f"the archiver's consumer failed: {self._fatal}")
                batch = self.consumer.consume(self.batch_size, timeout=0.5)  # 1
                if batch:
                    last_data = time.monotonic()
                self._note(batch, done)  # 2, 3
                if time.monotonic() >= next_sweep:
                    self.sweep()  # 4
                    next_sweep = time.monotonic() + (0 if self._more else self.sweep_interval_s)
                    last_data = time.monotonic()  # a sweep is progress: the idle timeout counts from its end
                if until_caught_up and self._caught_up(done, last_data, idle_timeout_s):
                    self.sweep()
                    while self._more and not stop.is_set():  # every due run, a sweep budget at a time
                        self.sweep()
                    break
        finally:
            self.consumer.close()
            if self._producer is not None:
                self._producer.flush(10)
            self.stats.elapsed_s = round(time.monotonic() - started, 3)
        return self.stats

    def _caught_up(self, done: dict[int, int], last_data: float, idle_timeout_s: float) -> bool:
        if time.monotonic() - last_data > idle_timeout_s:
            raise TimeoutError(f"the archiver read nothing for {idle_timeout_s} s and is not caught up with "
                               f"{self.topic} (assigned: {[tp.partition for tp in self.consumer.assignment()]})")
        if not self.consumer.assignment():
            return False
        lags = self.policy.call("kafka offsets", lambda: partition_lags(self.consumer, done))
        return bool(lags) and not any(lags.values())

    def _note(self, batch: list[Message], done: dict[int, int]) -> None:
        notes: list[tuple[str, str, Any]] = []  # (kind, run_id, scope): started / finished / reopened
        pending: dict[int, int] = {}
        for msg in batch:
            if msg.error() is not None:
                continue
            self.stats.events += 1
            self.metrics.events.inc()
            partition, offset = int(msg.partition() or 0), int(msg.offset() or 0)
            pending[partition] = offset + 1
            done[partition] = offset
            if msg.value() is None:
                continue
            try:
                event = self.policy.call("decode", functools.partial(self._decode, msg))
            except SchemaError as exc:
                if isinstance(exc, RegistryError):
                    raise
                continue
            if event.type is EventType.RUN_STARTED:
                notes.append(("started", event.run_id, {"tenant_id": event.tenant_id,
                                                        "agent": event.payload.get("agent")}))
            elif event.type in TERMINAL_TYPES:
                notes.append(("finished", event.run_id, None))
            elif event.type is EventType.RUN_RESUMED:  # continuing a failed run reopens it (reducer rule 8)
                notes.append(("reopened", event.run_id, None))
        if notes:
            self.policy.call("redis", lambda: self._write(notes))
        if pending:
            commit_pending(self.consumer, self.topic, pending, set(pending), asynchronous=False, log=log)

    def _decode(self, msg: Message) -> Event:
        return self.codec.decode(msg.value(), topic=msg.topic(), partition=msg.partition(), offset=msg.offset())

    def _write(self, notes: list[tuple[str, str, Any]]) -> None:
        now = redis_now_ms(self.redis)
        pipe = self.redis.pipeline(transaction=True)  # one unit {P:arc}, in the batch's order
        for kind, run_id, scope in notes:
            if kind == "started":
                pipe.hset(self.keys.archive_runs(), run_id, json.dumps(scope))
            elif kind == "finished":
                pipe.zadd(self.keys.archive_due(), {run_id: now})
            else:
                pipe.zrem(self.keys.archive_due(), run_id)
        pipe.execute()
        noted = sum(1 for kind, _r, _s in notes if kind == "finished")
        self.stats.finished_noted += noted
        self.metrics.noted.inc(noted)

    def sweep(self) -> list[str]:
        """Archive the runs of the due set past their retention (step 4), for at most ``sweep_budget_s`` seconds
        (the rest at the next sweep, at once: the consumer is polled in between, so a long backlog never outlasts
        its ``max.poll.interval.ms``); the runs archived."""
        with self.metrics.sweep_seconds.time():
            return self._sweep()

    def _sweep(self) -> list[str]:
        now = self.policy.call("redis", lambda: redis_now_ms(self.redis))
        self.policy.call("redis", lambda: self.redis.zremrangebyscore(self.keys.archive_erased(), "-inf",
                                                                      now - ERASE_MARK_MS))  # old erase marks
        due = self.policy.call("redis", lambda: self.redis.zrange(self.keys.archive_due(), 0, -1, withscores=True))
        scopes = self.policy.call("redis", lambda: self.redis.hgetall(self.keys.archive_runs()))
        mine = self._assigned()
        count = self.policy.call("kafka metadata", lambda: events_partition_count(self.settings)) if due else 0
        eligible: list[str] = []
        for member, score in due:
            run_id = member.decode() if isinstance(member, bytes) else member
            if mine is not None and partition_for(run_id, count) not in mine:
                continue  # another member of the group sweeps the runs of the partitions it was assigned
            scope = json.loads(scopes.get(member) or scopes.get(run_id) or "{}")
            if not scope:
                scope = self._scope(run_id, count)
            retention = self.settings.retention_for(scope.get("tenant_id"), scope.get("agent"))
            if retention is None or now - score < retention * 1000:
                continue
            eligible.append(run_id)
        deadline = time.monotonic() + self.sweep_budget_s
        outcomes: dict[str, ArchiveReport | Exception] = {}

        def attempt() -> None:  # again after an outage, with the runs not done yet
            left = [r for r in eligible if r not in outcomes]
            if left:
                archive_runs(self.settings, left, redis_client=self.redis, producer=self._tombstones(),
                             on_result=outcomes.__setitem__, deadline=deadline)

        self.policy.call("archive", attempt)
        self._more = len(outcomes) < len(eligible)  # the rest at the next sweep, right after a poll
        archived: list[str] = []
        overdue = 0
        for run_id, outcome in outcomes.items():
            if isinstance(outcome, RunNotFinishedError | RunErasedError | RunIdReusedError):
                reason = ("erased" if isinstance(outcome, RunErasedError) else
                          "id_reused" if isinstance(outcome, RunIdReusedError) else "not_finished")
                (log.error if reason == "id_reused" else log.warning)(
                    "not archived: not finished, erased or an id used twice",
                    extra={"run_id": run_id, "reason": reason, "error": str(outcome)})
                self.metrics.refused.labels(reason).inc()
                pipe = self.redis.pipeline(transaction=True)  # an erased or reopened run: it leaves the queue
                pipe.zrem(self.keys.archive_due(), run_id)
                pipe.hdel(self.keys.archive_runs(), run_id)
                self.policy.call("redis", pipe.execute)
                self.stats.refused.append(run_id)
            elif isinstance(outcome, Exception):
                # this run only, and nothing was removed that is not archived: it stays due and the next sweep tries
                # it again (a verify mismatch, an owner still holding its lease, a tombstone not acknowledged)
                log.warning("not archived yet: tried again at the next sweep",
                            extra={"run_id": run_id, "error": f"{type(outcome).__name__}: {outcome}"})
                self.stats.retried.append(run_id)
                self.metrics.retried.labels(type(outcome).__name__).inc()
                overdue += 1
            else:
                log.info("archived", extra={"run_id": run_id, "object": outcome.object_url, "rows": outcome.rows})
                archived.append(run_id)
                self.metrics.archived.inc()
                self.metrics.rows.inc(0 if outcome.already_archived else outcome.rows)
        self.stats.archived.extend(archived)
        self.metrics.due.set(self.policy.call("redis", lambda: self.redis.zcard(self.keys.archive_due())))
        self.metrics.overdue.set(overdue)
        return archived

    def _assigned(self) -> set[int] | None:
        """The partitions this member was assigned (it sweeps only their runs); None before it subscribed (a
        sweep called on its own, by a test or a tool, sweeps every due run)."""
        if not self._subscribed:
            return None
        return {tp.partition for tp in self.consumer.assignment()}

    def _tombstones(self) -> Producer:
        """The archiver's one producer of tombstones, made at its first use and flushed by each run's removal."""
        if self._producer is None:
            self._producer = tombstone_producer(self.settings)
        return self._producer

    def _scope(self, run_id: str, count: int) -> dict[str, Any]:
        """The run's tenant and agent from its projected state, when the archiver never saw its RUN_STARTED (a
        group started after the run began and its records were compacted): ``{}`` when unknown too."""
        from runjournal.consumers.projector.store import ProjectionStore

        state = ProjectionStore(self.redis, self.settings.topic_prefix).get(partition_for(run_id, count),
                                                                            run_id)
        return {} if state is None else {"tenant_id": state.tenant_id, "agent": state.agent}
