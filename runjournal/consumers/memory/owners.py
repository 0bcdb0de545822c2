"""Who a memory item belongs to, taken from the journal itself — never from what one process happened to see.

An item's owner (tenant, user, agent) is its run's: RUN_STARTED's ``user_id`` and ``agent``, with the tenant
of the event's own envelope. An extractor that restarted after a run's RUN_STARTED (or another group member
that had that partition before a rebalance) never saw it; before issue 14 its items were stored with
``user_id=None`` — invisible to that user's search, visible tenant-wide. :class:`RunOwners` answers from, in
order:

1. RUN_STARTED itself, when the event is one;
2. the projection (the run's :class:`~runjournal.model.reducer.RunState` in Redis: ``user_id``, ``agent``);
3. the journal: the run's partition read from its log start up to the event, for the run's RUN_STARTED.

Answers are memoised (an LRU of immutable RUN_STARTED facts, not a source: a miss always reads 2 then 3).
Redis and broker failures propagate for the failure policy (``runjournal.consumers.runtime.failures``) to wait on.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from confluent_kafka import Message

from runjournal.consumers.memory.extract import RunContext, plain
from runjournal.consumers.projector.store import ProjectionStore
from runjournal.consumers.runtime.partitions import range_consumer, read_ranges, watermarks
from runjournal.core import redis_client
from runjournal.core.crypto.token import is_encrypted
from runjournal.core.settings import Settings
from runjournal.schemas import EventCodec
from runjournal.schemas.errors import SchemaError
from runjournal.schemas.events import Event, EventType

__all__ = ["RunOwners"]

_SUMMARY = 200


InputOpener = Callable[[str, str, str | None], str | None]
"""``(tenant id, run id, stored input_json) -> plain text or None``: the extractor's key grant
(``runjournal.consumers.memory.sealing.MemoryCrypto.open_input``)."""


def _context(tenant_id: str, user_id: str | None, agent: str | None, input_json: str | None, *,
             run_id: str = "", opener: InputOpener | None = None) -> RunContext:
    text = (opener(tenant_id, run_id, input_json) if opener is not None else plain(input_json)) or ""
    return RunContext(tenant_id, user_id or None, agent or None,
                      text if len(text) <= _SUMMARY else text[: _SUMMARY - 1] + "…", sealed=is_encrypted(input_json))


class RunOwners:
    """The :class:`RunContext` of an event's run, from the journal (see the module docstring).

    Args:
        settings: Redis URL (the projection), bootstrap and topic (the journal).
        codec: decodes RUN_STARTED read from the journal.
        max_runs: memoised runs (default 10,000).
        opener: opens an encrypted run input (the extractor's key grant); default: an encrypted input is left out
            of the context.
    """

    def __init__(self, settings: Settings, codec: EventCodec, *, max_runs: int = 10_000,
                 opener: InputOpener | None = None) -> None:
        self.opener = opener
        self.settings = settings
        self.codec = codec
        self.max_runs = max_runs
        self.store = ProjectionStore(redis_client.client(settings), settings.topic_prefix)
        self._known: OrderedDict[str, RunContext] = OrderedDict()
        self.journal_reads = 0
        """Times the journal had to be read (neither the event nor the projection knew the owner)."""

    def context(self, event: Event, msg: Message) -> RunContext | None:
        """The run's context for ``event`` (consumed as ``msg``); None when the journal holds no RUN_STARTED of it.

        Raises:
            redis.RedisError, KafkaException: the projection or the journal could not be read (transient).
            KeyUnavailableError: the key service did not answer opening a granted input (transient).
        """
        if event.type is EventType.RUN_STARTED:
            p = event.payload
            return self._remember(event.run_id, _context(event.tenant_id, p.get("user_id"), p.get("agent"),
                                                         p.get("input_json"), run_id=event.run_id,
                                                         opener=self.opener))
        known = self._known.get(event.run_id)
        if known is not None:
            self._known.move_to_end(event.run_id)
            return known
        state = self.store.get(msg.partition(), event.run_id)
        if state is not None and state.tenant_id and state.epoch > 0:
            return self._remember(event.run_id, _context(state.tenant_id, state.user_id, state.agent,
                                                         state.input_json, run_id=event.run_id, opener=self.opener))
        started = self._read_run_started(event.run_id, msg.partition(), msg.offset())
        if started is None:
            return None
        p = started.payload
        return self._remember(event.run_id, _context(started.tenant_id, p.get("user_id"), p.get("agent"),
                                                     p.get("input_json"), run_id=event.run_id, opener=self.opener))

    def _remember(self, run_id: str, ctx: RunContext) -> RunContext:
        self._known[run_id] = ctx
        self._known.move_to_end(run_id)
        while len(self._known) > self.max_runs:
            self._known.popitem(last=False)
        return ctx

    def _read_run_started(self, run_id: str, partition: int, before_offset: int) -> Event | None:
        """The run's RUN_STARTED in ``partition`` below ``before_offset``, read from the log start."""
        self.journal_reads += 1
        ((low, _high),) = watermarks(self.settings, [partition]).values()
        prefix = f"{run_id}:".encode()
        found: list[Event] = []

        def on_record(m: Message) -> bool:
            if not (m.key() or b"").startswith(prefix) or m.value() is None:
                return True
            try:
                ev = self.codec.decode(m.value(), topic=m.topic(), partition=m.partition(), offset=m.offset())
            except SchemaError:
                return True
            if ev.type is EventType.RUN_STARTED:
                found.append(ev)
                return False  # found: stop reading
            return True

        consumer = range_consumer(self.settings, "memory-owner")
        try:
            read_ranges(consumer, self.settings.events_topic, {partition: (low, before_offset)}, on_record,
                        timeout_s=60)
        finally:
            consumer.close()
        return found[0] if found else None
