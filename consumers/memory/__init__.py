"""Memory extraction: events -> advisory long-term memory in Qdrant, off the critical path."""
