"""The ground floor: settings, errors, structured logging, failpoints and Kafka client configuration.

Imports nothing else of runjournal (import-linter checks it); every other package builds on it.
"""
