"""``python -m bench`` (from the repository root; ``make bench`` runs it): see bench/README.md."""

from bench.cli import app

app()
