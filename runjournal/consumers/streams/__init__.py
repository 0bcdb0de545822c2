"""Readers of runs' durable streams (``{prefix}.streams``, decision 0055): :func:`read_stream` and
:class:`StreamReader` resume by offset and fence a zombie's late tokens (``reader``)."""

from runjournal.consumers.streams.reader import StreamEvent, StreamReader, read_stream

__all__ = ["StreamEvent", "StreamReader", "read_stream"]
