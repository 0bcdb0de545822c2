"""The one place Redis clients are built: one server or a Redis Cluster, ACL user, TLS — from settings.

Every Redis client runjournal creates — journal, projector, recovery job, memory extractor, erase,
inspect, approvals, the demo, the bench and the stack launcher's probes — comes from :func:`client`
(a test greps the tree for any other ``Redis(`` / ``from_url`` / ``RedisCluster(``). What it adds:

* the target from ``RUNJOURNAL_REDIS_URL`` (``runjournal.core._redis_url``): ``redis://`` / ``rediss://`` →
  ``redis.Redis``; ``redis+cluster://h1:p1,h2:p2`` / ``rediss+cluster://…`` → ``redis.cluster.RedisCluster``
  seeded with every listed node;
* the ACL user: ``RUNJOURNAL_REDIS_USERNAME`` / ``RUNJOURNAL_REDIS_PASSWORD`` (they win over the URL's);
* TLS for ``rediss``: ``RUNJOURNAL_REDIS_SSL_CA_LOCATION`` (server verification, hostname checked),
  ``…_CERTIFICATE_LOCATION`` / ``…_KEY_LOCATION`` (a client certificate, when the server asks for one).

A cluster client connects lazily, like ``redis.Redis`` does: it is built on its first command (a service
started while Redis is down meets a ``redis.ConnectionError`` there, inside its failure policy, rather than
in its constructor). Keys one script or MULTI touches must share a hash tag (``runjournal.core.redis_keys``);
redis-py refuses cross-slot scripts and transactions on a cluster before sending them.

Scans go node by node: :func:`nodes` lists the primaries (the one server otherwise), :func:`scan_keys` and
:func:`delete_matching` walk each primary's keyspace (a cluster's SCAN is per node).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from runjournal.core._redis_url import RedisTarget, parse_redis_url
from runjournal.core.errors import ConfigError, StackUnavailableError

if TYPE_CHECKING:  # pragma: no cover
    from runjournal.core.settings import Settings

__all__ = ["ACCESS_HINTS", "access_problem", "check_access", "client", "delete_matching", "is_cluster", "nodes",
           "probe", "scan_keys"]

#: What a refused connection means → the settings that fix it (waiting never heals these).
ACCESS_HINTS = {
    "auth": "Redis refused the login: check RUNJOURNAL_REDIS_USERNAME and RUNJOURNAL_REDIS_PASSWORD (or the "
            "user:password in RUNJOURNAL_REDIS_URL)",
    "permission": "the Redis user may not run this command on these keys: check the user's ACL (docs/operations/"
                  "cluster-and-least-privilege.md, `runjournal acls show --redis`) and RUNJOURNAL_TOPIC_PREFIX",
    "tls": "the TLS handshake with Redis failed: check the rediss:// scheme and RUNJOURNAL_REDIS_SSL_CA_LOCATION "
           "(the CA that signed the Redis servers' certificates)",
}


def client(settings: Settings | None, *, url: str | None = None, username: str | None = None,
           password: str | None = None, **options: Any) -> Any:
    """A redis-py client for ``settings`` (one server: ``redis.Redis``; a cluster: a lazily built ``RedisCluster``).

    Args:
        settings: the URL, ACL user and TLS files; None only with ``url`` (the stack launcher's probes).
        url: overrides ``settings.redis_url``.
        username, password: override the settings' user (the stack launcher's administrator).
        **options: redis-py connection options (``socket_timeout``, ``socket_connect_timeout``, ``retry``,
            ``retry_on_error``, ``decode_responses`` …), passed to every connection.

    Returns:
        ``redis.Redis`` or a cluster client with the same command methods (``register_script``, ``pipeline``,
        ``scan_iter`` …); keys of one script or transaction must share a hash tag on a cluster.

    Raises:
        ValueError: neither ``settings`` nor ``url``, or a malformed URL.
    """
    target_url = url or (settings.redis_url if settings is not None else None)
    if not target_url:
        raise ValueError("redis_client.client needs settings or an explicit url")
    target = parse_redis_url(target_url)
    kwargs = {**_security(settings, target, username, password), **options}
    if not target.cluster:
        import redis

        # redis-py lets a URL's user:password win over keyword arguments: strip them (they are in ``kwargs``)
        return redis.Redis.from_url(_without_userinfo(target_url), **kwargs)
    return _LazyCluster(lambda: _cluster(target, kwargs), decode=bool(options.get("decode_responses")))


def _without_userinfo(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    head, slash, tail = rest.partition("/")
    return f"{scheme}{sep}{head.rpartition('@')[2]}{slash}{tail}"


def _security(settings: Settings | None, target: RedisTarget, username: str | None,
              password: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    user = username or (settings.redis_username if settings is not None else None) or target.username
    secret = password or (settings.redis_password.get_secret_value()
                          if settings is not None and settings.redis_password is not None else None) or target.password
    if user:
        out["username"] = user
    if secret:
        out["password"] = secret
    if target.tls and settings is not None:
        for name, option in (("redis_ssl_ca_location", "ssl_ca_certs"),
                             ("redis_ssl_certificate_location", "ssl_certfile"),
                             ("redis_ssl_key_location", "ssl_keyfile")):
            if getattr(settings, name) is not None:
                out[option] = str(getattr(settings, name))
    return out


def _cluster(target: RedisTarget, kwargs: dict[str, Any]) -> Any:
    import redis
    from redis.cluster import ClusterNode, RedisCluster
    from redis.exceptions import RedisClusterException

    seeds = [ClusterNode(host, port) for host, port in target.nodes]  # type: ignore[no-untyped-call, unused-ignore]
    try:
        return RedisCluster(startup_nodes=seeds, ssl=target.tls, **kwargs)
    except RedisClusterException as exc:  # no seed answered: the same kind as a refused single server
        raise redis.ConnectionError(f"no Redis Cluster node answers at {', '.join(f'{h}:{p}' for h, p in target.nodes)}"
                                    f": {exc}") from exc


class _Utf8:
    """What ``redis.commands.core.Script`` needs of an encoder to hash a script (no connection)."""

    def encode(self, value: str | bytes) -> bytes:
        return value.encode("utf-8") if isinstance(value, str) else value


class _LazyCluster:
    """A ``RedisCluster`` built on first use (thread-safe); every attribute is the real client's.

    ``register_script`` works before the first connection (the script is hashed locally), so stores can be
    constructed while Redis is away. A failed build raises ``redis.ConnectionError`` and is tried again on
    the next command.
    """

    def __init__(self, factory: Callable[[], Any], *, decode: bool) -> None:
        self._factory = factory
        self._decode = decode
        self._client: Any = None
        self._lock = threading.Lock()

    def real(self) -> Any:
        """The ``RedisCluster`` (built now if it was not yet)."""
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._factory()
        return self._client

    def get_encoder(self) -> _Utf8:
        """Scripts are hashed as UTF-8 (redis-py's default encoding)."""
        return _Utf8()

    def register_script(self, script: str) -> Any:
        """A ``Script`` bound to this client (EVALSHA; on NOSCRIPT it loads the script and retries)."""
        from redis.commands.core import Script

        return Script(self, script)  # type: ignore[arg-type, unused-ignore]  # duck-typed: evalsha, script_load, get_encoder

    def close(self) -> None:
        """Close the connections, if any were opened."""
        if self._client is not None:
            self._client.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real(), name)


def is_cluster(redis_client: Any) -> bool:
    """True for a cluster client from :func:`client`."""
    return isinstance(redis_client, _LazyCluster)


def nodes(redis_client: Any) -> list[Any]:
    """A ``redis.Redis`` per primary of a cluster (with the client's user and TLS), or ``[redis_client]``."""
    if not is_cluster(redis_client):
        return [redis_client]
    real = redis_client.real()
    return [real.get_redis_connection(node) for node in real.get_primaries()]


def scan_keys(redis_client: Any, match: str, *, count: int = 1000) -> Iterator[bytes | str]:
    """Every key matching the glob ``match``, node by node (SCAN on each primary; a key seen twice during a
    rehash is yielded twice — callers must be idempotent)."""
    for node in nodes(redis_client):
        yield from node.scan_iter(match=match, count=count)


def delete_matching(redis_client: Any, patterns: Iterable[str], *, batch: int = 500) -> int:
    """Delete every key matching any of ``patterns``, node by node (one DEL per key, pipelined per node: keys of
    different slots cannot share a command on a cluster). Returns the number deleted."""
    deleted = 0
    for node in nodes(redis_client):
        for pattern in patterns:
            found = list(node.scan_iter(match=pattern, count=1000))
            for i in range(0, len(found), batch):
                pipe = node.pipeline(transaction=False)
                for key in found[i:i + batch]:
                    pipe.delete(key)
                deleted += sum(int(n) for n in pipe.execute())
    return deleted


def access_problem(exc: BaseException) -> str | None:
    """The :data:`ACCESS_HINTS` entry for a refusal no waiting heals (login, ACL, TLS), or None."""
    from redis import exceptions as rx

    chain: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and len(chain) < 5:  # a cluster client wraps the node's refusal
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    text = " ".join(str(e) for e in chain)
    if any(isinstance(e, rx.AuthenticationError) for e in chain) or any(
            s in text for s in ("NOAUTH", "WRONGPASS", "Authentication required", "invalid username-password")):
        return ACCESS_HINTS["auth"]
    if any(isinstance(e, rx.NoPermissionError) for e in chain) or "NOPERM" in text:
        return ACCESS_HINTS["permission"]
    if "SSL" in text or "CERTIFICATE_VERIFY" in text or "wrong version number" in text:
        return ACCESS_HINTS["tls"]
    return None


def check_access(settings: Settings, *, timeout_s: float = 5.0) -> None:
    """PING Redis with ``settings``; a refused login, ACL or TLS handshake is a ConfigError naming the fix.

    Raises:
        ConfigError: refused (see :data:`ACCESS_HINTS`).
        redis.RedisError: Redis unreachable (the caller decides: "start the stack" or wait).
    """
    probe = client(settings, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
    try:
        probe.ping()
    except Exception as exc:
        hint = access_problem(exc)
        if hint is not None:
            raise ConfigError(f"Redis at {settings.masked()['redis_url']}: {exc} — {hint}") from exc
        raise
    finally:
        probe.close()


def probe(settings: Settings, *, timeout_s: float = 3.0) -> None:
    """:func:`check_access`, with an unreachable Redis as :class:`StackUnavailableError` naming ``runjournal stack up``
    and ``RUNJOURNAL_REDIS_URL``: what the commands' preflight and the library's entry points (``Journal``,
    ``ApprovalInbox.from_settings``) check before their first Redis call, so the answer comes within ``timeout_s``
    seconds, named, instead of a redis-py traceback.

    Raises:
        StackUnavailableError: no Redis answers at ``settings.redis_url`` within ``timeout_s`` seconds.
        ConfigError: Redis refused the login, the ACL user or the TLS handshake (see :data:`ACCESS_HINTS`).
    """
    from redis.exceptions import RedisClusterException, RedisError

    try:
        check_access(settings, timeout_s=timeout_s)
    except (RedisError, RedisClusterException) as exc:
        raise StackUnavailableError(f"no Redis answers at {settings.masked()['redis_url']}: start the local stack "
                                    f"with `runjournal stack up` (or set RUNJOURNAL_REDIS_URL): {exc}", exc) from None
