"""Step 6 of a recovery pass: every RUN_RESUMED of the pass in one transaction of the job's own producer.

The recovery job's transactional id is ``{prefix}.recovery`` (:data:`RECOVERY_PRODUCER_ID`): two recovery jobs
fence each other, and ``init_transactions`` aborts what a killed pass left open. **Fence, then read, then
publish**: the producer's ``init_transactions`` (:meth:`ResumedPublisher.prepare`, in the background beside the
pass's fences of dead instances) completes (:meth:`ResumedPublisher.ready`) before the pass reads end offsets. So
of two actors whose read-to-commit windows overlap, the one initialised later fences the other, whose commit then
fails (:data:`SUPERSEDED`: a named refusal, not a fatal error); and an actor initialised after another's commit
reads that commit. The producer is kept for the next passes (its initialisation still precedes their reads);
after a failed or fenced transaction it is dropped and the next pass builds a new one (a new producer epoch).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import uuid
from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException, Producer

from runjournal.consumers.recovery.plan import Classified, plan_summary
from runjournal.consumers.runtime.failures import TRANSIENT, FatalDependencyError, kafka_error_verdict
from runjournal.core import kafka
from runjournal.core.settings import Settings
from runjournal.model.reducer import RunState
from runjournal.producers.control import ControlRequest
from runjournal.producers.fencing import init_transactions
from runjournal.schemas import Event, EventCodec, EventType, new_event_id, utcnow

__all__ = ["RECOVERY_PRODUCER_ID", "SUPERSEDED", "ResumedPublisher", "control_event", "resumed_event"]

log = logging.getLogger("runjournal.consumers.recovery")

RECOVERY_PRODUCER_ID = "recovery"

SUPERSEDED = "superseded"
"""The report action of runs whose RUN_RESUMED another recovery actor's producer fenced before it committed."""

_FENCED = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})  # noqa: SLF001


@functools.cache
def _recovered_by() -> str:
    """``recovery@<this host's MAC, hex>`` (the RUN_RESUMED ``recovered_by``); looked up once, when first needed."""
    return f"recovery@{uuid.getnode():x}"


def resumed_event(state: RunState, classified: Classified, target: str, offsets: dict[str, int], *,
                  requested_by: str | None = None, reason: str | None = None,
                  traceparent: str | None = None) -> Event:
    """The RUN_RESUMED of ``state``: seq = last + 1, epoch + 1, the plan summary, ``assigned_to`` = ``target``.

    Args:
        offsets: partition (as text) -> end offset the decision was made from (in the summary).
        requested_by, reason: the operator who resumed a paused run, and why (envelope v5; None: a recovery).
        traceparent: the recovery job's hand-over span of the run, when traced (``runjournal.core.otel``).
    """
    return Event(event_id=new_event_id(), run_id=state.run_id, tenant_id=state.tenant_id or "",
                 seq=state.last_seq + 1, epoch=state.epoch + 1, producer_id=RECOVERY_PRODUCER_ID,
                 type=EventType.RUN_RESUMED, occurred_at=utcnow(),
                 payload={"previous_epoch": state.epoch, "recovered_by": _recovered_by(),
                          "plan_json": plan_summary(classified, previous_epoch=state.epoch,
                                                    new_epoch=state.epoch + 1, offsets=offsets),
                          "assigned_to": target, "requested_by": requested_by, "request_reason": reason,
                          "request_id": None, "paused": None, "resume_at_ms": None, "waiting_for": None},
                 traceparent=traceparent)


def control_event(state: RunState, classified: Classified, request: ControlRequest, offsets: dict[str, int]) -> Event:
    """The event that carries an operator's ``request`` out on a run nobody live owns (the recovery job writes it,
    in the pass's transaction: two actors fence each other as for RUN_RESUMED; docs/design/decisions/0047):

    * pause → RUN_RESUMED (seq = last + 1, epoch + 1) with ``paused``, no ``assigned_to``: held by nobody; a run's
      own wait the same, with ``resume_at_ms`` and ``waiting_for``;
    * cancel → RUN_CANCELLED (seq = last + 1, the run's epoch: the dead owner is fenced, a surrendering one gave the
      epoch up, a paused run has no owner) with the reason, who asked and the request id.
    """
    common = {"event_id": new_event_id(), "run_id": state.run_id, "tenant_id": state.tenant_id or "",
              "seq": state.last_seq + 1, "producer_id": RECOVERY_PRODUCER_ID, "occurred_at": utcnow()}
    if request.action != "cancel":  # a pause, or a run's own durable wait (with its wake-up time and signal)
        return Event(**common, epoch=state.epoch + 1, type=EventType.RUN_RESUMED, payload={
            "previous_epoch": state.epoch, "recovered_by": _recovered_by(),
            "plan_json": plan_summary(classified, previous_epoch=state.epoch, new_epoch=state.epoch + 1,
                                      offsets=offsets),
            "assigned_to": None, "requested_by": request.requested_by, "request_reason": request.reason,
            "request_id": request.request_id, "paused": True, "resume_at_ms": request.until_ms,
            "waiting_for": request.signal})
    return Event(**common, epoch=state.epoch, type=EventType.RUN_CANCELLED, payload={
        "reason": request.reason or "cancelled by an operator", "requested_by": request.requested_by,
        "request_id": request.request_id})


class ResumedPublisher:
    """The recovery job's transactional producer (module docstring).

    Args:
        settings: bootstrap and topic prefix (transactional id ``{prefix}.recovery``).
        codec: encodes the events.
        partition: run_id -> its partition of the events topic.
    """

    def __init__(self, settings: Settings, codec: EventCodec, partition: Callable[[str], int]) -> None:
        self.settings = settings
        self.codec = codec
        self.partition = partition
        self._producer: Producer | None = None
        self._init: threading.Thread | None = None
        self._init_error: BaseException | None = None
        self._fatal_code: int | None = None
        """The code of the fatal error librdkafka reported (``error_cb``): a later ``_FATAL`` names it (a fence)."""

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            self._fatal_code = err.code()

    def prepare(self) -> None:
        """Start ``init_transactions`` in the background (no-op when it is started or done): it waits on the
        broker, not on this process, so it overlaps the pass's reads. :meth:`publish` waits for it."""
        if self._producer is not None or (self._init is not None and self._init_error is None):
            return  # ready, or being initialised (a failed attempt is started again)
        self._init_error = None
        self._init = threading.Thread(target=self._initialise, name="recovery-init-transactions", daemon=True)
        self._init.start()

    def _initialise(self) -> None:
        try:
            self._fatal_code = None
            producer = kafka.producer(self.settings, **{"acks": "all", "enable.idempotence": True,
                                                        "error_cb": self._on_error,
                                                        "transactional.id": f"{self.settings.topic_prefix}."
                                                                            f"{RECOVERY_PRODUCER_ID}",
                                                        "linger.ms": 5})
            init_transactions(producer, 30)
            self._producer = producer
        except BaseException as exc:  # noqa: BLE001 - handed to the thread that publishes
            self._init_error = exc

    def ready(self) -> None:
        """Wait until ``init_transactions`` completed (starting it when :meth:`prepare` was not called): the fence
        of every earlier recovery producer. Call it before reading end offsets.

        Raises:
            KafkaException: ``init_transactions`` failed (as the producer raised it); the next call starts it again.
        """
        self._ready()

    def _ready(self) -> Producer:
        """The initialised producer (started now when :meth:`prepare` was not called).

        Raises:
            KafkaException: ``init_transactions`` failed (as the producer raised it).
        """
        self.prepare()
        if self._init is not None:
            self._init.join()
            self._init = None
        if self._init_error is not None:
            exc, self._init_error = self._init_error, None
            raise exc
        assert self._producer is not None
        return self._producer

    def publish(self, events: list[Event]) -> str | None:
        """Every event in one transaction. Returns None when committed, or why it was not (a text starting with
        :data:`SUPERSEDED` when another recovery actor fenced this producer: it read later and decides).

        An abortable failure aborts the transaction, drops the producer (the next pass builds one: a new
        producer epoch) and leaves the job usable; so does a fence by another recovery actor, and a transient
        failure (a broker or coordinator away or moving, a timeout: ``kafka_error_verdict``; the next pass tries
        again); a fatal one (unauthorised, …) drops the producer and raises.

        Raises:
            FatalDependencyError: the transactional producer is fenced or failed fatally.
            KafkaException: ``init_transactions`` failed.
        """
        producer = self._ready()
        try:
            producer.begin_transaction()
            for event in events:
                producer.produce(self.settings.events_topic, key=event.key.encode(), value=self.codec.encode(event),
                                 partition=self.partition(event.run_id))
            producer.commit_transaction(30)
            return None
        except KafkaException as exc:
            err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            code = err.code() if err is not None else None
            if code == KafkaError._FATAL:  # noqa: SLF001 - a producer in its fatal state: the cause, from error_cb
                for _ in range(10):  # error_cb is served from poll, once librdkafka queued it (up to ~1 s)
                    with contextlib.suppress(KafkaException):
                        producer.poll(0.1)
                    if self._fatal_code is not None:
                        break
                code = self._fatal_code if self._fatal_code is not None else code
            if code == KafkaError._FATAL:  # noqa: SLF001 - the cause never came: this producer is done, not the job
                self.drop()  # the next pass's init_transactions decides (a fence: it fences back; an ACL: it fails)
                log.warning("RUN_RESUMED producer failed fatally with no cause reported; the next pass retries",
                            extra={"error": str(err)})
                return f"RUN_RESUMED not committed: the recovery producer failed ({err}); the next pass retries"
            if code in _FENCED:
                self.drop()
                log.warning("RUN_RESUMED transaction fenced by another recovery actor; it decides these runs",
                            extra={"error": str(err)})
                return f"{SUPERSEDED}: another recovery actor fenced {self.settings.topic_prefix}." \
                       f"{RECOVERY_PRODUCER_ID} after this pass initialised it; it read the journal later"
            if err is not None and err.txn_requires_abort():
                try:
                    producer.abort_transaction(30)
                except KafkaException as abort_exc:
                    log.warning("abort failed", extra={"error": str(abort_exc)})
                # A fresh producer for the next pass: after a refused record the idempotent sequence may need an
                # epoch bump; init_transactions on the same transactional.id gives one (and fences this one).
                self.drop()
                log.warning("RUN_RESUMED transaction aborted; the next pass retries", extra={"error": str(err)})
                return f"RUN_RESUMED transaction aborted: {err.str()}"
            self.drop()
            verdict = kafka_error_verdict(err) if err is not None else None
            cause = verdict.cause if verdict is not None else str(exc)
            # by what the error means, not its retriable() flag (set only on the transactional calls' errors: a
            # produce() refused for a broker away or a coordinator moving carries none): the next pass retries
            if verdict is not None and verdict.kind == TRANSIENT:
                return f"RUN_RESUMED not committed: {cause}"
            raise FatalDependencyError("kafka", f"recovery producer {self.settings.topic_prefix}."
                                       f"{RECOVERY_PRODUCER_ID}: {cause}") from exc

    def drop(self) -> None:
        """Forget the producer; the next pass builds one (``init_transactions`` aborts leftovers). Never raises: a
        fenced or failed producer's ``flush`` raises its fatal error (``KafkaException``), which would escape the very
        handler that reports the fence (two recovery actors at once: the CI failure of 2026-12-03)."""
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                producer.purge()  # its records are the aborted transaction's: nothing of them may be sent
                producer.flush(0)
            except (KafkaException, RuntimeError) as exc:
                log.debug("dropping the recovery producer: %s", exc)

    def close(self) -> None:
        """Wait for a background initialisation, flush and drop the producer."""
        if self._init is not None:
            self._init.join()
            self._init = None
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                producer.flush(10)
            except KafkaException as exc:  # fenced or failed after its last transaction: nothing left to send
                log.warning("closing the recovery producer: %s", exc)
