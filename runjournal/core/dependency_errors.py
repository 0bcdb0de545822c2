"""What an error of the Redis or Kafka client means: a failure waiting can fix, or one it cannot.

docs/design/protocol.md § One failure policy: a dependency's failure is classified by what it means, never by
its exception class alone. redis-py raises one meaning under many classes (a slot migration ends in a
``ClusterError`` "TTL exhausted", a ``TryAgainError``, a ``MovedError`` escaping a transaction, a
``SlotNotCoveredError`` that is not even a ``RedisError``) and one class with many meanings (a
``ConnectionError`` may be a refused socket or a TLS certificate the server rejects; a
``RedisClusterException`` may be a cluster still forming or a programming error); librdkafka's
``KafkaError.retriable()`` is set only on errors of the transactional API, so a broker away shows as
``_TRANSPORT`` with ``retriable() == False`` everywhere else. This module is the one table of both clients'
errors; :func:`runjournal.consumers.runtime.failures.classify` builds the failure policy's verdict on it, and the
lower layers that must tell the two kinds apart (the writer-schema catalog) use it directly.

Kinds:

* ``transient`` — waiting and doing the same work again fixes it: a server or broker away, restarting,
  loading, failing over; a cluster's topology changing (slots migrating, a leader or coordinator moving, a
  rebalance); a pool or queue full; a request timed out.
* ``fatal`` — no waiting fixes it: refused credentials, ACL or TLS handshake, fencing, a topic gone, a
  setting the server rejects; the cause names the fix when there is one. A client refusing the call itself (a
  cross-slot script, a bad argument) is a bug in the caller: ``fatal`` with dependency ``runjournal``.

The chain of causes is read for refusals: a cluster client that could not log in to any seed raises a
``RedisClusterException`` (then a ``ConnectionError``, :mod:`runjournal.core.redis_client`) whose cause is the
``AuthenticationError``; that is the refusal, not an outage. Unlike
:func:`runjournal.core.redis_client.access_problem` (a start-up probe, where failing fast on any TLS error is the
point) only definite TLS refusals count here (an unknown CA, a wrong protocol version, a certificate the server
wants or rejects): a connection cut during a handshake, as a restarting server does, is an outage.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, NamedTuple

from runjournal.core import kafka, redis_client

if TYPE_CHECKING:  # pragma: no cover
    from confluent_kafka import KafkaError

__all__ = ["FATAL", "TRANSIENT", "Meaning", "kafka_meaning", "kafka_stops", "meaning", "not_permitted", "redis_meaning"]

TRANSIENT, FATAL = "transient", "fatal"


class Meaning(NamedTuple):
    """What one client error means."""

    kind: str
    """``transient`` (waiting fixes it) or ``fatal`` (it does not)."""
    dependency: str
    """``redis`` or ``kafka``; ``runjournal`` when the client refused the call itself (a bug of the caller)."""
    cause: str
    """One line: the error, and for a fatal one the fix when it is known."""


# -- Redis -------------------------------------------------------------------------------------------------------

_SLOTS_MOVING = "a Redis Cluster slot is moving or its node failing over"
_CLUSTER_URL = ("a Redis Cluster node answers with redirections: if this lasts, RUNJOURNAL_REDIS_URL names one node "
                "of a cluster and must be redis+cluster://host:port,…")
_HASH_TAG = ("keys of one script or transaction must share a hash tag (runjournal.core.redis_keys): a bug, "
             "report it")
_NOT_A_CLUSTER = ("RUNJOURNAL_REDIS_URL names a Redis Cluster (redis+cluster://) but this Redis runs without "
                  "cluster mode: use redis://host:port")
_URL = "check RUNJOURNAL_REDIS_URL (host, port, database, redis:// or rediss://)"

#: Replies (the first word of a Redis error) that waiting fixes: loading, failing over, a replica serving a
#: primary's keys, a cluster resharding or down, memory full, a script still running, replicas missing.
_REDIS_TRANSIENT_REPLIES = frozenset({
    "LOADING", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "MOVED", "ASK", "OOM", "BUSY", "NOREPLICAS",
    "UNBLOCKED"})

#: Definite TLS refusals (OpenSSL's reason codes, as ``ssl.SSLError`` names them): the settings, not an outage.
_TLS_REFUSALS = ("CERTIFICATE_VERIFY_FAILED", "WRONG_VERSION_NUMBER", "UNKNOWN_CA", "CERTIFICATE_REQUIRED",
                 "BAD_CERTIFICATE", "HANDSHAKE_FAILURE", "NO_SHARED_CIPHER", "PEM LIB")

#: ``RedisClusterException`` messages of a cluster that is forming, resharding or partly down (redis-py's
#: ``NodesManager.initialize`` and ``RedisCluster.execute_command``); every other one is a refused call.
_CLUSTER_FORMING = ("Redis Cluster cannot be connected", "All slots are not covered", "could not agree on a valid "
                    "slots cache", "No targets were found")
#: ``RedisClusterException`` / ``ConnectionError`` messages of a setting the server or the client refuses.
_REDIS_CONFIG = (
    ("Cluster mode is not enabled", _NOT_A_CLUSTER),  # NodesManager.initialize: CLUSTER SLOTS refused
    ("Argument 'db'", "a Redis Cluster has database 0 only: drop the database from RUNJOURNAL_REDIS_URL"),
    ("``db`` querystring", "a Redis Cluster has database 0 only: drop the database from RUNJOURNAL_REDIS_URL"),
    ("Unix Domain Socket", _URL),
    ("Invalid Database", _URL),  # Connection.on_connect: SELECT refused
    ("protocol must be", _URL), ("Invalid RESP version", _URL),  # HELLO refused
)


@cache
def _redis_table() -> tuple[tuple[type[BaseException], str, str, str], ...]:
    """``(class, kind, dependency, hint)``, most specific first; the first ``isinstance`` match decides.

    Where redis-py raises each (redis-py 5-7, ``redis/exceptions.py``, ``redis/cluster.py``, ``redis/connection.py``,
    ``redis/_parsers/base.py``); a class this redis-py lacks is left out.
    """
    from redis import exceptions as rx

    rows: list[tuple[str, str, str, str]] = [
        # the connection handshake: AUTH/HELLO refused (subclasses of ConnectionError: before it)
        ("AuthenticationWrongNumberOfArgsError", FATAL, "redis", redis_client.ACCESS_HINTS["auth"] +
         " (a user name needs Redis 6 or later)"),
        ("AuthenticationError", FATAL, "redis", redis_client.ACCESS_HINTS["auth"]),
        ("AuthorizationError", FATAL, "redis", redis_client.ACCESS_HINTS["permission"]),
        ("NoPermissionError", FATAL, "redis", redis_client.ACCESS_HINTS["permission"]),
        # "ERR problem with LDAP service": the server's own authentication backend is away
        ("ExternalAuthProviderError", TRANSIENT, "redis", ""),
        # ConnectionPool.get_connection: every connection in use; they come back
        ("MaxConnectionsError", TRANSIENT, "redis", ""),
        # -LOADING: the server is loading its data set after a restart
        ("BusyLoadingError", TRANSIENT, "redis", ""),
        # refused, reset, closed by the server, "max number of clients reached", Retry exhausted (TLS refusals and
        # refused settings are read from the message first, see _redis_refusal)
        ("ConnectionError", TRANSIENT, "redis", ""),
        ("TimeoutError", TRANSIENT, "redis", ""),
        # RedisCluster.execute_command: "TTL exhausted." after MOVED / ASK / TRYAGAIN on every attempt (its
        # subclasses ClusterDownError -CLUSTERDOWN and MasterDownError -MASTERDOWN too)
        ("ClusterError", TRANSIENT, "redis", _SLOTS_MOVING),
        # -TRYAGAIN: a multi-key command during resharding
        ("TryAgainError", TRANSIENT, "redis", _SLOTS_MOVING),
        # -MOVED / -ASK escaping: a transaction's EXECABORT raises the queued redirection, and a plain client
        # pointed at a cluster node gets one for every key of another node
        ("AskError", TRANSIENT, "redis", _CLUSTER_URL),
        # NodesManager.get_node_from_slot: the slots table has no node for a slot (a refresh is due)
        ("SlotNotCoveredError", TRANSIENT, "redis", _SLOTS_MOVING),
        # -READONLY: a write reached a primary demoted by a failover
        ("ReadOnlyError", TRANSIENT, "redis", ""),
        # -OOM: maxmemory reached with noeviction; keys expire or memory is added
        ("OutOfMemoryError", TRANSIENT, "redis", ""),
        # -NOSCRIPT escaping Script.__call__ (it loads and retries once): the script cache of a restarted or
        # failed-over primary was lost in between; the next call loads it again
        ("NoScriptError", TRANSIENT, "redis", ""),
        # a WATCH transaction lost its race, or "Slot rebalancing occurred while watching keys": run it again
        ("WatchError", TRANSIENT, "redis", ""),
        # refused by the client before anything is sent: the caller's bug
        ("ClusterCrossSlotError", FATAL, "runjournal", _HASH_TAG),  # -CROSSSLOT
        ("CrossSlotTransactionError", FATAL, "runjournal", _HASH_TAG),
        ("InvalidPipelineStack", FATAL, "runjournal", "a bug, report it"),
        ("DataError", FATAL, "runjournal", ""),  # a value redis-py cannot encode
        ("LockError", FATAL, "runjournal", ""),
        ("PubSubError", FATAL, "runjournal", ""),
        # "Protocol Error": something that is not Redis (or TLS spoken to plain text) on the port
        ("InvalidResponse", FATAL, "redis", _URL),
        # -EXECABORT, -ERR, -WRONGTYPE, module errors …: the transient replies are read from the reply first
        ("ResponseError", FATAL, "redis", ""),
    ]
    return tuple((getattr(rx, name), kind, dep, hint) for name, kind, dep, hint in rows if hasattr(rx, name))


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and up to four of its causes (explicit, or implicit when not suppressed)."""
    out: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and len(out) < 5 and cur not in out:
        out.append(cur)
        cur = cur.__cause__ or (None if cur.__suppress_context__ else cur.__context__)
    return out


def _redis_refusal(chain: list[BaseException]) -> str | None:
    """The fix for a refusal anywhere in ``chain`` (login, ACL, TLS, a refused setting), or None."""
    from redis import exceptions as rx

    for exc in chain:
        text = str(exc)
        upper = text.upper()
        if isinstance(exc, rx.AuthenticationError) or any(
                s in text for s in ("WRONGPASS", "NOAUTH", "invalid username-password", "Authentication required")):
            return redis_client.ACCESS_HINTS["auth"]
        if isinstance(exc, (rx.NoPermissionError, rx.AuthorizationError)) or "NOPERM" in text:
            return redis_client.ACCESS_HINTS["permission"]
        if any(code in upper for code in _TLS_REFUSALS):
            return redis_client.ACCESS_HINTS["tls"]
        if isinstance(exc, (rx.ConnectionError, rx.RedisClusterException)):
            for marker, fix in _REDIS_CONFIG:
                if marker in text:
                    return fix
    return None


def _reply_code(exc: BaseException) -> str:
    """The first word of a Redis error reply (redis-py 7 keeps it as ``status_code`` on the classes it maps)."""
    code = getattr(exc, "status_code", None)
    return code if isinstance(code, str) and code else (str(exc).split(" ", 1)[0] if str(exc) else "")


def _with(text: str, hint: str) -> str:
    return f"{text} ({hint})" if hint else text


def redis_meaning(exc: BaseException) -> Meaning | None:
    """What a redis-py error means (the module docstring); None when ``exc`` is not one.

    Never raises.
    """
    try:
        from redis import exceptions as rx
    except ImportError:  # pragma: no cover - redis is a core dependency
        return None
    if not isinstance(exc, (rx.RedisError, rx.RedisClusterException)):
        return None
    text = f"{type(exc).__name__}: {exc}"
    refusal = _redis_refusal(_chain(exc))
    if refusal is not None:
        return Meaning(FATAL, "redis", _with(text, refusal))
    for cls, kind, dependency, hint in _redis_table():
        if isinstance(exc, cls):
            if cls is rx.ResponseError and _reply_code(exc) in _REDIS_TRANSIENT_REPLIES:  # a reply no class maps
                return Meaning(TRANSIENT, "redis", text)
            return Meaning(kind, dependency, _with(text, hint))
    if isinstance(exc, rx.RedisClusterException):  # not a RedisError: the cluster client's own, by its message
        if any(m in str(exc) for m in _CLUSTER_FORMING):
            return Meaning(TRANSIENT, "redis", _with(text, _SLOTS_MOVING))
        return Meaning(FATAL, "runjournal", text)  # a pipeline command blocked in cluster mode, a bad argument …
    return Meaning(FATAL, "redis", text)  # a RedisError of a kind this table does not know


# -- Kafka -------------------------------------------------------------------------------------------------------

_SAME_ID = "another member runs with the same --instance-id: stop it, or give this one another id"
_TOPICS = "create the topics: `runjournal topics create`"
_ACLS = ("the principal lacks an ACL: grant the role's with `runjournal acls create` "
         "(docs/operations/cluster-and-least-privilege.md)")
_KAFKA_SETTINGS = "librdkafka refused a setting: check RUNJOURNAL_KAFKA_PROPERTIES_FILE and RUNJOURNAL_LIBRDKAFKA_*"

#: Codes no waiting fixes, whatever librdkafka's flags say (fenced, unauthorised, unauthenticated, topic gone),
#: with the fix when there is one: :func:`kafka_stops` stops a consumer on these too.
_FATAL_CODES = {
    # fenced: another producer took the transactional id, another static member the instance id
    "_FATAL": "", "_FENCED": _SAME_ID, "PRODUCER_FENCED": "", "INVALID_PRODUCER_EPOCH": "",
    "FENCED_INSTANCE_ID": _SAME_ID,
    # refused by the broker's authorizer
    "TOPIC_AUTHORIZATION_FAILED": _ACLS, "GROUP_AUTHORIZATION_FAILED": _ACLS, "CLUSTER_AUTHORIZATION_FAILED": _ACLS,
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED": _ACLS, "DELEGATION_TOKEN_AUTHORIZATION_FAILED": _ACLS,
    # refused login
    "SASL_AUTHENTICATION_FAILED": kafka.ACCESS_HINTS["_AUTHENTICATION"],
    "_AUTHENTICATION": kafka.ACCESS_HINTS["_AUTHENTICATION"],
    "UNSUPPORTED_SASL_MECHANISM": kafka.ACCESS_HINTS["_AUTHENTICATION"],
    "ILLEGAL_SASL_STATE": kafka.ACCESS_HINTS["_AUTHENTICATION"],
    # the topic or partition does not exist (a topic id the broker does not know: deleted, or created again)
    "UNKNOWN_TOPIC_OR_PART": _TOPICS, "_UNKNOWN_TOPIC": _TOPICS, "_UNKNOWN_PARTITION": "", "UNKNOWN_TOPIC_ID": _TOPICS,
}

#: Codes waiting fixes although librdkafka's ``retriable()`` is False on them outside the transactional API.
_TRANSIENT_CODES = frozenset({
    # local: the connection to a broker, the broker's handle, the metadata, a local queue
    "_TRANSPORT", "_ALL_BROKERS_DOWN", "_FAIL", "_RESOLVE", "_TIMED_OUT", "_MSG_TIMED_OUT", "_TIMED_OUT_QUEUE",
    "_WAIT_COORD", "_WAIT_CACHE", "_QUEUE_FULL", "_ISR_INSUFF", "_RETRY", "_INTR",
    # a broker handle torn down or moved while requests were in flight (the broker left the metadata: killed,
    # restarting) — the request is answered by the next broker, not a reason to stop (issue 17)
    "_DESTROY_BROKER", "_NODE_UPDATE",
    # the consumer left its group after max.poll.interval.ms; the next poll joins again
    "_MAX_POLL_EXCEEDED",
    # a broker or a partition leader away, moving or behind
    "REQUEST_TIMED_OUT", "NETWORK_EXCEPTION", "BROKER_NOT_AVAILABLE", "LEADER_NOT_AVAILABLE",
    "NOT_LEADER_FOR_PARTITION", "REPLICA_NOT_AVAILABLE", "PREFERRED_LEADER_NOT_AVAILABLE",
    "ELIGIBLE_LEADERS_NOT_AVAILABLE", "FENCED_LEADER_EPOCH", "UNKNOWN_LEADER_EPOCH", "OFFSET_NOT_AVAILABLE",
    "NOT_ENOUGH_REPLICAS", "NOT_ENOUGH_REPLICAS_AFTER_APPEND", "KAFKA_STORAGE_ERROR", "NOT_CONTROLLER",
    "THROTTLING_QUOTA_EXCEEDED", "FETCH_SESSION_ID_NOT_FOUND", "INVALID_FETCH_SESSION_EPOCH", "REBOOTSTRAP_REQUIRED",
    # a group or transaction coordinator away, moving or loading; a rebalance under way
    "COORDINATOR_NOT_AVAILABLE", "NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS", "CONCURRENT_TRANSACTIONS",
    "REBALANCE_IN_PROGRESS", "ILLEGAL_GENERATION", "UNKNOWN_MEMBER_ID", "STALE_MEMBER_EPOCH",
    "UNSTABLE_OFFSET_COMMIT",
})

#: Fixes of fatal codes outside :data:`_FATAL_CODES` (fatal because nothing says otherwise; a consumer does not stop
#: on them by itself: librdkafka keeps trying, and a wrong CA at start is refused by the preflight).
_FATAL_HINTS = {"_SSL": kafka.ACCESS_HINTS["_SSL"], "_INVALID_ARG": _KAFKA_SETTINGS, "INVALID_CONFIG": _KAFKA_SETTINGS}


@cache
def _codes() -> tuple[dict[int, str], frozenset[int], dict[int, str]]:
    from confluent_kafka import KafkaError

    def code(name: str) -> int:
        return int(getattr(KafkaError, name))

    return ({code(n): fix for n, fix in _FATAL_CODES.items() if hasattr(KafkaError, n)},
            frozenset(code(n) for n in _TRANSIENT_CODES if hasattr(KafkaError, n)),
            {code(n): fix for n, fix in _FATAL_HINTS.items() if hasattr(KafkaError, n)})


def kafka_stops(err: KafkaError, *, uses_group: bool = True) -> bool:
    """True for a librdkafka error a client must stop on whatever it is doing: fatal (the flag), fenced,
    unauthorised, unauthenticated, topic gone (:data:`_FATAL_CODES`). A consumer's ``error_cb`` and a read loop's
    message errors use it; the rest librdkafka retries by itself. ``uses_group=False``: a reader that only assigns
    partitions (never commits) — librdkafka still looks up the coordinator of its ``group.id``, and a role without
    rights on that group (the operator's ``erase``, ``inspect``) is refused there, which stops nothing it does.
    Never raises."""
    from confluent_kafka import KafkaError as _KafkaError

    if not uses_group and err.code() == _KafkaError.GROUP_AUTHORIZATION_FAILED:
        return False
    return bool(err.fatal()) or err.code() in _codes()[0]


def kafka_meaning(err: KafkaError) -> Meaning:
    """What one librdkafka error means: its fatal flag, then its code (:data:`_FATAL_CODES`,
    :data:`_TRANSIENT_CODES`), then ``retriable()`` for a code the table does not name; anything else is fatal.
    Never raises."""
    fatal_codes, transient_codes, hints = _codes()
    code = err.code()
    text = f"{err.name()}: {err.str()}"
    fix = fatal_codes.get(code) or hints.get(code, "")
    if not fix and "group.instance.id" in text:  # a consumer's _FATAL names the fencing in its text only
        fix = _SAME_ID
    text = _with(text, fix)
    if err.fatal() or code in fatal_codes:
        return Meaning(FATAL, "kafka", text)
    if code in transient_codes or err.retriable():
        return Meaning(TRANSIENT, "kafka", text)
    return Meaning(FATAL, "kafka", text)


def meaning(exc: BaseException) -> Meaning | None:
    """What ``exc`` means when it is an error of the Redis or Kafka client (a redis-py error, a
    ``KafkaException`` carrying a ``KafkaError``, the ``BufferError`` of a full produce queue); None otherwise.

    Never raises.
    """
    if isinstance(exc, BufferError):  # confluent-kafka's Producer.produce: the local queue is full; it drains
        return Meaning(TRANSIENT, "kafka", f"BufferError: {exc} (the local produce queue is full)")
    found = redis_meaning(exc)
    if found is not None:
        return found
    try:
        from confluent_kafka import KafkaError, KafkaException
    except ImportError:  # pragma: no cover - confluent-kafka is a core dependency
        return None
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return kafka_meaning(exc.args[0])
    return None


#: librdkafka codes of a broker's authorizer refusing the principal (an ACL it lacks).
_KAFKA_ACL_CODES = ("TOPIC_AUTHORIZATION_FAILED", "GROUP_AUTHORIZATION_FAILED", "CLUSTER_AUTHORIZATION_FAILED",
                    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED")


def not_permitted(exc: BaseException) -> bool:
    """True when ``exc`` or one of its causes is an ACL refusal: Redis's NOPERM (a key or command the user's rules
    do not grant) or a Kafka ``*_AUTHORIZATION_FAILED``, also when a service wrapped it (``FatalDependencyError``
    keeps the cause as ``__cause__``; a producer's background error keeps the code's name in its text). A
    least-privilege user's work that another role does (an operator's recovery pass) tells the two apart with it:
    docs/operations/cluster-and-least-privilege.md. Never raises."""
    try:
        from confluent_kafka import KafkaError, KafkaException
        from redis import exceptions as rx
    except ImportError:  # pragma: no cover - core dependencies
        return False
    for cause in _chain(exc):
        if isinstance(cause, (rx.NoPermissionError, rx.AuthorizationError)) or "NOPERM" in str(cause):
            return True
        err = cause.args[0] if isinstance(cause, KafkaException) and cause.args else None
        name = err.name() if isinstance(err, KafkaError) else ""
        if name in _KAFKA_ACL_CODES or any(code in str(cause) for code in _KAFKA_ACL_CODES):
            return True
    return False
