"""Consumers of the journal: the state projector, the recovery job, memory extraction, replay, inspect, erase."""
