"""A testing kit for whoever writes a store backend or tests code on the journal: the in-memory fakes and the
execution stores' contract suites the project's own backends pass (as eventsourcing ships its persistence tests
and LangGraph its checkpointer conformance).

* :class:`InMemoryEventStore` — a fake :class:`~runjournal.stores.EventStore` (one list per partition, murmur2
  partitioning, as the topic); :class:`FoldingRunStore` — StateStore + ExecutionRecordStore + CheckpointStore
  folded from any EventStore on every read: the reference every projection must agree with.
* :class:`EventStoreContract`, :class:`RunStoreContract` — pytest suites: subclass one in a ``Test…`` class and give
  it the fixtures its docstring names. :func:`contract_runs` — the runs the suites store and ask about.
* :class:`HashingEmbedder` — a test double :class:`~runjournal.consumers.vectors.Embedder` (word overlap, no
  model), for tests of the memory plane's plumbing.

Needs pytest (``pip install 'runjournal[testing]'``); nothing in the product imports this package.
"""

from runjournal.core.lazy import lazy_exports

_HOMES = {
    **dict.fromkeys(["FoldingRunStore", "HashingEmbedder", "InMemoryEventStore"], "runjournal.testing.fakes"),
    **dict.fromkeys(["EventStoreContract", "RunStoreContract", "contract_runs"], "runjournal.testing.contracts"),
}
__all__ = sorted(_HOMES)
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
