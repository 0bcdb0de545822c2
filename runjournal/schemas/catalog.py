"""The writer-schema catalog: the compacted ``{prefix}.schemas`` topic.

Every writer publishes the schema it writes with to this topic **before its first event** (the
codec does it on its first ``encode``; acked by the broker before the event is even built), so a
reader that meets a fingerprint it does not ship finds the schema here. It is the same idea as a
schema registry's own storage topic (Confluent's ``_schemas``), without the service.

Records (JSON values, UTF-8):

| key | value | written by |
|---|---|---|
| ``<fingerprint, 16 hex digits>`` | ``{"fingerprint": "<hex>", "schema": "<Avro JSON text>"}`` | every writer |
| ``id:<registry schema id>`` | ``{"fingerprint": "<hex>", "id": <int>}`` | writers in Confluent framing |

The ``id:`` records let a reader with no registry configured read Confluent-framed records
(switching the wire format back to single-object keeps old records readable). Keys are
content-derived, so compaction keeps one record per schema and re-announcing is harmless.
The topic has one partition, ``cleanup.policy=compact``; a writer creates it when missing.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

from runjournal.core import dependency_errors, kafka
from runjournal.schemas.errors import RegistryError

if TYPE_CHECKING:
    from runjournal.core.settings import Settings
    from runjournal.schemas.versions import SchemaVersion

__all__ = ["SCHEMAS_TOPIC_CONFIG", "SchemaCatalog"]

#: Topic configuration of ``{prefix}.schemas`` (also used by ``runjournal topics create``).
SCHEMAS_TOPIC_CONFIG: dict[str, str] = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0"}


def _raise_unless_transient(exc: BaseException) -> None:
    """Re-raise ``exc`` as it is unless waiting can fix it (a broker away, a timeout): a :class:`RegistryError`
    says "the schemas' source is away, wait", which a refused ACL or a deleted topic is not
    (runjournal.core.dependency_errors)."""
    found = dependency_errors.meaning(exc)
    if found is not None and found.kind != dependency_errors.TRANSIENT:
        raise exc


def _fp_key(fingerprint: int) -> str:
    return f"{fingerprint:016x}"


class SchemaCatalog:
    """Reads and writes ``{prefix}.schemas``; thread-safe.

    Args:
        settings: bootstrap servers and ``topic_prefix`` (topic ``settings.schemas_topic``).
        timeout_s: bound on one broker round trip (announce, read to the end), seconds; default 15.

    Errors: every method raises :class:`~runjournal.schemas.errors.RegistryError` when the topic
    cannot be written or read for a while (broker unreachable, timeout): a transient, not a bad record; a refusal
    no waiting fixes (unauthorised, the topic deleted: runjournal.core.dependency_errors) is the client's
    ``KafkaException``, raised as it is.
    """

    def __init__(self, settings: Settings, *, timeout_s: float = 15.0) -> None:
        self._settings = settings
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._schemas: dict[int, str] = {}
        self._ids: dict[int, int] = {}
        self._announced: set[str] = set()

    @property
    def topic(self) -> str:
        """``{prefix}.schemas``."""
        return self._settings.schemas_topic

    # -- writer side ------------------------------------------------------------------
    def announce(self, version: SchemaVersion, *, registry_id: int | None = None) -> None:
        """Publish ``version``'s schema (and its registry id) and wait for the broker's ack.

        Once per process and key: later calls return at once. Creates the topic when missing.

        Raises:
            RegistryError: not acked within ``timeout_s`` (the caller must not write events yet).
            KafkaException: refused for good (unauthorised, …: waiting does not fix it,
                runjournal.core.dependency_errors); nothing was announced.
        """
        records: list[tuple[str, dict[str, Any]]] = [(_fp_key(version.fingerprint),
                    {"fingerprint": _fp_key(version.fingerprint), "schema": version.text})]
        if registry_id is not None:
            records.append((f"id:{registry_id}", {"fingerprint": _fp_key(version.fingerprint), "id": registry_id}))
        with self._lock:
            todo = [(k, v) for k, v in records if k not in self._announced]
            if not todo:
                return
            errors = self._send(todo)
            if errors and "UNKNOWN_TOPIC" in str(errors[0]):  # first writer ever: create the topic, send again
                self._ensure_topic()
                errors = self._send(todo)
            if errors:
                # a refusal for good is raised as it is; a topic just created may be missing from the producer's
                # metadata for a moment (UNKNOWN_TOPIC): that one waits, like a broker away
                if not isinstance(errors[0], str) and "UNKNOWN_TOPIC" not in str(errors[0]):
                    from confluent_kafka import KafkaException

                    _raise_unless_transient(KafkaException(errors[0]))
                raise RegistryError(f"could not publish writer schema {version.label} to {self.topic}: {errors[0]}")
            self._announced.update(k for k, _ in todo)
            self._schemas[version.fingerprint] = version.text
            if registry_id is not None:
                self._ids[registry_id] = version.fingerprint

    def _send(self, records: list[tuple[str, dict[str, Any]]]) -> list[Any]:
        """Produce and wait for the acks; the delivery errors (``KafkaError``, or a text for records left
        unacknowledged; empty: all acked)."""
        errors: list[Any] = []
        producer = self._producer()  # short-lived: a process announces once per schema
        for key, value in records:
            producer.produce(self.topic, key=key.encode(), value=json.dumps(value).encode(),
                             on_delivery=lambda err, _msg: errors.append(err) if err else None)
        left = producer.flush(self._timeout_s)
        if left and not errors:
            errors.append(f"{left} record(s) not acked in {self._timeout_s} s")
        return errors

    def _producer(self) -> Any:
        # acks=all for durability; no idempotence (its PID round trip costs ~0.3 s and a duplicate of a
        # content-keyed record is harmless); a missing topic fails fast instead of waiting for metadata.
        props: dict[str, Any] = {"acks": "all", "linger.ms": 0, "topic.metadata.propagation.max.ms": 1000,
                                 "message.timeout.ms": int(self._timeout_s * 1000)}
        return kafka.producer(self._settings, client_id="runjournal-schemas", **props)

    def _ensure_topic(self) -> None:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

        admin = kafka.admin_client(self._settings)
        try:
            meta = admin.list_topics(timeout=self._timeout_s)
            if self.topic in meta.topics:
                return
            rf = min(3, max(1, len(meta.brokers)))  # as `runjournal topics create` does
            futures = admin.create_topics([NewTopic(self.topic, 1, rf, config=SCHEMAS_TOPIC_CONFIG)],
                                          request_timeout=self._timeout_s)
            for future in futures.values():
                try:
                    future.result()
                except KafkaException as exc:
                    if "TOPIC_ALREADY_EXISTS" not in str(exc):
                        raise
        except KafkaException as exc:
            _raise_unless_transient(exc)
            raise RegistryError(f"cannot create the writer-schema topic {self.topic}: {exc}") from exc

    # -- reader side ------------------------------------------------------------------
    def schema_text(self, fingerprint: int) -> str | None:
        """The schema JSON text published under ``fingerprint``; None when the topic has none.

        A miss re-reads the topic to its end (it is small and written before any event that needs it).

        Raises:
            RegistryError: the topic could not be read (a broker away, a timeout).
            KafkaException: reading it was refused for good (unauthorised, …).
        """
        with self._lock:
            if fingerprint not in self._schemas:
                self._refresh_locked()
            return self._schemas.get(fingerprint)

    def fingerprint_of_id(self, schema_id: int) -> int | None:
        """The fingerprint a writer recorded for registry schema id ``schema_id``; None when unknown.

        Raises:
            RegistryError: the topic could not be read (a broker away, a timeout).
            KafkaException: reading it was refused for good (unauthorised, …).
        """
        with self._lock:
            if schema_id not in self._ids:
                self._refresh_locked()
            return self._ids.get(schema_id)

    def _refresh_locked(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition

        props: dict[str, Any] = {"group.id": f"schemas-{uuid.uuid4()}", "enable.auto.commit": False,
                                 "isolation.level": "read_uncommitted", "fetch.wait.max.ms": 10}
        consumer = kafka.consumer(self._settings, client_id="runjournal-schemas-reader", **props)
        try:
            if self.topic not in consumer.list_topics(timeout=self._timeout_s).topics:
                return
            tp = TopicPartition(self.topic, 0)
            _low, high = consumer.get_watermark_offsets(tp, timeout=self._timeout_s, cached=False)
            if high <= 0:
                return
            consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
            self._read_to(consumer, high)
        except KafkaException as exc:
            _raise_unless_transient(exc)
            raise RegistryError(f"cannot read the writer-schema topic {self.topic}: {exc}") from exc
        finally:
            consumer.close()

    def _read_to(self, consumer: Any, high: int) -> None:
        deadline = time.monotonic() + self._timeout_s
        while time.monotonic() < deadline:
            for msg in consumer.consume(500, timeout=0.5):
                if msg.error():
                    continue
                self._absorb(msg.key(), msg.value())
                if msg.offset() + 1 >= high:
                    return
        raise RegistryError(f"reading {self.topic} to offset {high} took over {self._timeout_s} s")

    def _absorb(self, key: bytes | None, value: bytes | None) -> None:
        if not key or not value:
            return
        try:
            data = json.loads(value)
            fingerprint = int(data["fingerprint"], 16)
            if key.startswith(b"id:"):
                self._ids[int(data["id"])] = fingerprint
            else:
                self._schemas[fingerprint] = str(data["schema"])
        except (ValueError, KeyError, TypeError):
            return  # not one of ours: ignored (the reader then reports the fingerprint as unknown)
