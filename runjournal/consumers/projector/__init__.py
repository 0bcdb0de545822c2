"""State projector: folds the journal into Redis run states and execution records, exactly once in effect.

Exports load on first use (``runjournal.core.lazy``): a reader of projected state (``inspect``, the console, the
approval commands) imports ``store`` without the projector service's consumer machinery."""

from runjournal.core.lazy import lazy_exports

_HOMES = {
    **dict.fromkeys(["Projector", "ProjectorStats", "projector_group"], "runjournal.consumers.projector.service"),
    **dict.fromkeys(["ApplyResult", "ProjectionStore", "partition_tag"], "runjournal.consumers.projector.store"),
}
__all__ = sorted(_HOMES)
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
