"""What every long-lived consumer shares: the events topic's partitions, the consumer group, the topic's identity,
dead letters and the one failure policy (docs/design/protocol.md § One failure policy).

* :mod:`~runjournal.consumers.runtime.partitions` — the partition count, a run's partition, reading to end offsets.
* :mod:`~runjournal.consumers.runtime.group` — offset commits and lag of a consumer group.
* :mod:`~runjournal.consumers.runtime.topic_identity` — a stored offset is used only against the topic it was read
  from (:func:`preflight`, :class:`TopicMismatchError`).
* :mod:`~runjournal.consumers.runtime.dlq` — :class:`DeadLetters`: a record quarantined with its offset.
* :mod:`~runjournal.consumers.runtime.failures` — :class:`FailurePolicy`: transient failures wait, a bad record is
  quarantined, a fatal one stops the process loudly.
"""

from runjournal.core.lazy import lazy_exports

_HOMES = {
    **dict.fromkeys(["DeadLetterError", "DeadLetters"], "runjournal.consumers.runtime.dlq"),
    **dict.fromkeys(["DependencyUnavailableError", "FailurePolicy", "FatalDependencyError", "Verdict", "classify",
                     "stops_consumer"], "runjournal.consumers.runtime.failures"),
    **dict.fromkeys(["commit_pending", "partition_lags"], "runjournal.consumers.runtime.group"),
    **dict.fromkeys(["events_partition_count", "read_ranges", "run_partition", "watermarks"],
                    "runjournal.consumers.runtime.partitions"),
    **dict.fromkeys(["StackUnavailableError", "TopicMismatchError", "TopicShape", "preflight"],
                    "runjournal.consumers.runtime.topic_identity"),
}
__all__ = sorted(_HOMES)
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
