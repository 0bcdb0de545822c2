"""Whether a tool's exception leaves its call's outcome unknown (the request may have left and acted).

docs/design/protocol.md "Decisions after the first build", after the effect: a failure raised after the request may
have left is *unknown* unless the tool says otherwise — recording it as a definite failure would let a
retry (or a resume) run the effect a second time. Decided in this order, along the exception and its
``__cause__`` / ``__context__`` chain (innermost last, at most 8 links):

1. an ``outcome_unknown`` attribute (True / False) set by the tool decides;
2. :class:`~runjournal.producers.tools.ToolOutcomeUnknownError` → unknown;
3. a transport failure *after* the request was sent → unknown: ``TimeoutError`` (``socket.timeout``,
   ``asyncio.TimeoutError``), ``ConnectionResetError``, ``ConnectionAbortedError``, ``BrokenPipeError``,
   ``http.client.BadStatusLine`` / ``IncompleteRead`` (``RemoteDisconnected``), and by class name
   httpx / httpcore ``ReadTimeout``, ``WriteTimeout``, ``ReadError``, ``WriteError``,
   ``RemoteProtocolError``; requests ``ReadTimeout``, ``ChunkedEncodingError``; urllib3
   ``ReadTimeoutError``, ``ProtocolError``; aiohttp ``ServerDisconnectedError``.
   Failures before the request left (``ConnectionRefusedError``, httpx ``ConnectTimeout`` /
   ``ConnectError`` / ``PoolTimeout``) are definite.
4. anything else is a definite failure (TOOL_CALL_FAILED, with the exception's ``retryable``).
"""

from __future__ import annotations

import http.client

from runjournal.producers.tools import ToolOutcomeUnknownError

__all__ = ["outcome_unknown"]

_MAX_CHAIN = 8
_MAYBE_SENT = (TimeoutError, ConnectionResetError, ConnectionAbortedError, BrokenPipeError,
               http.client.BadStatusLine, http.client.IncompleteRead)
#: (top-level module, class name) of third-party transport errors raised after a request was sent.
_MAYBE_SENT_NAMES = frozenset({
    *(("httpx", n) for n in ("ReadTimeout", "WriteTimeout", "ReadError", "WriteError", "RemoteProtocolError")),
    *(("httpcore", n) for n in ("ReadTimeout", "WriteTimeout", "ReadError", "WriteError", "RemoteProtocolError")),
    ("requests", "ReadTimeout"), ("requests", "ChunkedEncodingError"),
    ("urllib3", "ReadTimeoutError"), ("urllib3", "ProtocolError"),
    ("aiohttp", "ServerDisconnectedError"),
})
#: Classes that are definite even though a parent class above would say "maybe sent".
_DEFINITE_NAMES = frozenset({("httpx", "ConnectTimeout"), ("httpcore", "ConnectTimeout"),
                             ("httpx", "PoolTimeout"), ("httpcore", "PoolTimeout"),
                             ("requests", "ConnectTimeout"), ("urllib3", "ConnectTimeoutError")})


def _named(exc: BaseException, names: frozenset[tuple[str, str]]) -> bool:
    for cls in type(exc).__mro__:
        if (cls.__module__.partition(".")[0], cls.__name__) in names:
            return True
    return False


def outcome_unknown(exc: BaseException) -> bool:
    """True when ``exc``, raised by a side-effecting tool, leaves the effect's outcome unknown (module rules)."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and len(seen) < _MAX_CHAIN and id(link) not in seen:
        seen.add(id(link))
        said = getattr(link, "outcome_unknown", None)
        if isinstance(said, bool):
            return said
        if isinstance(link, ToolOutcomeUnknownError):
            return True
        if _named(link, _DEFINITE_NAMES) or isinstance(link, ConnectionRefusedError):
            return False
        if isinstance(link, _MAYBE_SENT) or _named(link, _MAYBE_SENT_NAMES):
            return True
        link = link.__cause__ or link.__context__
    return False
