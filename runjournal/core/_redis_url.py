"""The forms ``RUNJOURNAL_REDIS_URL`` takes, parsed once (for :mod:`runjournal.core.settings` and
:mod:`runjournal.core.redis_client`).

* ``redis://[user[:password]@]host:port[/db]`` — one Redis server; ``rediss://`` — the same over TLS;
  ``unix:///path/to/redis.sock`` — a local socket. These go to redis-py's own ``from_url``.
* ``redis+cluster://[user[:password]@]host1:port1,host2:port2,…`` — a Redis Cluster, by one or more seed
  nodes (the client discovers the rest with ``CLUSTER SLOTS``); ``rediss+cluster://`` — over TLS. No
  ``/db``: a cluster has database 0 only. Any one reachable seed is enough; give several so a client can
  start while one node is down.

User and password may be percent-encoded in the URL; ``RUNJOURNAL_REDIS_USERNAME`` /
``RUNJOURNAL_REDIS_PASSWORD`` win over them (so a secret need not sit in a URL).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

__all__ = ["CLUSTER_SCHEMES", "RedisTarget", "parse_redis_url"]

CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
_SINGLE_SCHEMES = ("redis", "rediss", "unix")


@dataclass(frozen=True)
class RedisTarget:
    """What a Redis URL names."""

    cluster: bool
    """A Redis Cluster (``redis+cluster://``) rather than one server."""
    tls: bool
    """TLS (``rediss://`` or ``rediss+cluster://``)."""
    nodes: tuple[tuple[str, int], ...]
    """``(host, port)`` seed nodes of a cluster; empty for one server (its URL goes to redis-py as is)."""
    username: str | None
    """The URL's user, decoded (None when absent)."""
    password: str | None
    """The URL's password, decoded (None when absent)."""


def parse_redis_url(url: str) -> RedisTarget:
    """Parse a ``RUNJOURNAL_REDIS_URL`` (see the module docstring for the forms).

    Raises:
        ValueError: an unknown scheme, a cluster URL without seed nodes, a seed without a numeric port,
            or a cluster URL naming a database — the message shows the accepted forms.
    """
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in (*_SINGLE_SCHEMES, *CLUSTER_SCHEMES):
        raise ValueError(f"{url!r} is not a Redis URL: use redis://host:port/db, rediss://… (TLS), "
                         "redis+cluster://host1:port1,host2:port2 or rediss+cluster://… (a Redis Cluster)")
    userinfo, at, hosts = rest.rpartition("@") if "@" in rest.split("/", 1)[0] else ("", "", rest)
    username, password = _userinfo(userinfo) if at else (None, None)
    tls = scheme.startswith("rediss")
    if scheme not in CLUSTER_SCHEMES:
        return RedisTarget(False, tls, (), username, password)
    hosts, _slash, path = hosts.partition("/")
    if path.strip("0"):
        raise ValueError(f"{scheme}:// takes no database ({path!r}): a Redis Cluster has database 0 only")
    nodes = tuple(_host_port(h, scheme) for h in hosts.split(",") if h.strip())
    if not nodes:
        raise ValueError(f"{scheme}:// needs at least one seed node: {scheme}://host1:port1,host2:port2")
    return RedisTarget(True, tls, nodes, username, password)


def _userinfo(text: str) -> tuple[str | None, str | None]:
    user, colon, password = text.partition(":")
    return (unquote(user) or None), (unquote(password) if colon else None)


def _host_port(text: str, scheme: str) -> tuple[str, int]:
    host, colon, port = text.strip().rpartition(":")
    if not colon or not host or not port.isdigit():
        raise ValueError(f"{scheme}:// seed {text.strip()!r} needs host:port")
    return host.strip("[]"), int(port)
