"""State projector: folds the journal into Redis run states and execution records, exactly once in effect."""

from runjournal.consumers.projector.service import Projector, ProjectorStats, projector_group
from runjournal.consumers.projector.store import ApplyResult, ProjectionStore, partition_tag

__all__ = ["ApplyResult", "ProjectionStore", "Projector", "ProjectorStats", "partition_tag", "projector_group"]
