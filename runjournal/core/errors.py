"""The base error of every runjournal package; each package subclasses it by failure kind."""

from __future__ import annotations

__all__ = ["ConfigError", "PortInUseError", "RunjournalError", "StackUnavailableError", "bind_error"]


class RunjournalError(Exception):
    """Base of all errors raised by runjournal code (third-party errors are chained as ``__cause__``)."""


class ConfigError(RunjournalError):
    """A setting is missing or invalid; the message names the ``RUNJOURNAL_*`` variable."""


class StackUnavailableError(RunjournalError):
    """Kafka or Redis does not answer where the settings say (``RUNJOURNAL_BOOTSTRAP``, ``RUNJOURNAL_REDIS_URL``);
    the one-line message names the setting and ``runjournal stack up``, the command that starts a local stack.

    Raised within seconds by the commands' preflight and by the library's entry points (``Journal``,
    ``ApprovalInbox.from_settings``) instead of a client's own error after its long timeout.

    Attributes:
        cause: the client's error (its text is in the message). Kept here, not chained as ``__cause__``: a traceback
            shows the fix, not the client's internals.
    """

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class PortInUseError(RunjournalError):
    """A TCP port a service was told to listen on cannot be bound (taken by another process, or not allowed).

    Attributes:
        port: the TCP port.
        addr: the bind address.
        option: the command-line option that chose it (``--metrics-port``, ``--port``).
    """

    def __init__(self, port: int, addr: str, option: str, cause: str) -> None:
        self.port = port
        self.addr = addr
        self.option = option
        super().__init__(f"cannot listen on {addr}:{port} ({cause}): pass another {option}, or stop the process "
                         f"that holds it (`ss -ltnp 'sport = :{port}'` names it)")


def bind_error(exc: OSError, port: int, addr: str, option: str) -> OSError | PortInUseError:
    """:class:`PortInUseError` for an ``OSError`` raised by binding ``addr:port`` (address in use, permission
    denied, address not available); any other ``OSError`` is returned as it is."""
    import errno

    if exc.errno in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
        return PortInUseError(port, addr, option, exc.strerror or str(exc))
    return exc
