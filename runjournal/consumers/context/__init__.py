"""The context plane's assembly: execution facts from the journal's projection first, advisory items after.

* :class:`ContextManager` — builds a model's next :class:`Context` for one run: the run's execution facts
  (:class:`ExecutionFacts`, :class:`CallFact`) from the execution stores, then memory and knowledge as
  :class:`AdvisoryItem` labelled :data:`ADVISORY_LABEL` (docs/guide/context.md).
* :mod:`runjournal.consumers.context.execution_stores` — the design's StateStore, ExecutionRecordStore and
  CheckpointStore on the projection, and the EventStore on the topic.
"""

from runjournal.consumers.context.manager import (
    ADVISORY_LABEL,
    AdvisoryItem,
    CallFact,
    Context,
    ContextManager,
    ExecutionFacts,
)

__all__ = ["ADVISORY_LABEL", "AdvisoryItem", "CallFact", "Context", "ContextManager", "ExecutionFacts"]
