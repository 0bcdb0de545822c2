"""One-off maintenance scripts for the schema contract (publish, fixture generation)."""
