"""Issue 28, case 7: one failure policy by meaning — every error the Redis and Kafka clients raise on the services'
paths is classified by what it means (runjournal.core.dependency_errors), whatever its class.

The bug: during a 3-4 s Redis Cluster slot migration redis-py's own retries ended in a plain
``ClusterError("TTL exhausted.")``, which the policy called fatal: the projector exited 1. A failure waiting can
fix must be waited out, whatever class the client raises it under; a refusal no waiting fixes stops at once and
names the fix.
"""

from __future__ import annotations

import logging
import types
from typing import Any

import pytest
import redis
from confluent_kafka import KafkaError, KafkaException

from runjournal.consumers.runtime.dlq import DeadLetterError
from runjournal.consumers.runtime.failures import (
    FATAL,
    TRANSIENT,
    FailurePolicy,
    FatalDependencyError,
    classify,
    stops_consumer,
)
from runjournal.core.crypto.errors import KeyDestroyedError, KeyUnavailableError
from runjournal.producers.errors import JournalError, ProducerFencedError

E = redis.exceptions


def _policy() -> FailurePolicy:
    return FailurePolicy("t", logging.getLogger("t"), max_wait_s=5, backoff_base_s=0.001, backoff_cap_s=0.002)


def _fails_once(exc: BaseException) -> tuple[list[int], Any]:
    calls: list[int] = []

    def work() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise exc
        return "done"

    return calls, work


def kx(name: str, **flags: bool) -> KafkaException:
    """``KafkaException(KafkaError(<code name>))`` as librdkafka raises it (flags off unless given)."""
    return KafkaException(KafkaError(getattr(KafkaError, name), **flags))


def chained(outer: BaseException, *causes: BaseException) -> BaseException:
    """``outer`` raised ``from`` ``causes[0]``, raised ``from`` ``causes[1]`` …"""
    cur = outer
    for cause in causes:
        cur.__cause__ = cause
        cur = cause
    return outer


def test_a_slot_migration_ending_in_ttl_exhausted_is_waited_out() -> None:
    """The reproduced bug: redis-py's cluster client gives up after RedisClusterRequestTTL redirections with a plain
    ``ClusterError``; the policy waits and does the work again instead of stopping the service."""
    exc = E.ClusterError("TTL exhausted.")
    assert classify(exc).kind == TRANSIENT and classify(exc).dependency == "redis"
    calls, work = _fails_once(exc)
    policy = _policy()
    assert policy.call("apply partition 0", work) == "done"
    assert calls == [1, 1] and policy.retries == 1


_PASSWORD = "RUNJOURNAL_REDIS_PASSWORD"
_REDIS_ACL = "acls show --redis"
_CA = "RUNJOURNAL_REDIS_SSL_CA_LOCATION"
_KAFKA_ACL = "runjournal acls create"
_SASL = "RUNJOURNAL_KAFKA_SASL_PASSWORD"

# (exception, kind, dependency, a words the cause must hold — the fix, for a fatal one); each comment says where the
# client raises it (redis-py 7: redis/cluster.py, redis/connection.py, redis/_parsers/base.py; librdkafka via
# confluent-kafka: a KafkaException from a call, a message's error(), a delivery report, error_cb).
TABLE = [
    # -- Redis Cluster changing shape: waiting fixes it ------------------------------------------------------------
    # RedisCluster._internal_execute_command: MOVED / ASK / TRYAGAIN on every one of RedisClusterRequestTTL tries
    pytest.param(E.ClusterError("TTL exhausted."), TRANSIENT, "redis", "slot", id="redis-ClusterError-TTL"),
    # -CLUSTERDOWN (parser), re-raised after NodesManager.initialize()
    pytest.param(E.ClusterDownError("The cluster is down"), TRANSIENT, "redis", "", id="redis-CLUSTERDOWN"),
    # -MASTERDOWN: a replica lost its primary (replica-serve-stale-data no)
    pytest.param(E.MasterDownError("Link with MASTER is down and replica-serve-stale-data is set to 'no'."),
                 TRANSIENT, "redis", "", id="redis-MASTERDOWN"),
    # -TRYAGAIN: a multi-key command while its slot is being migrated
    pytest.param(E.TryAgainError("Multiple keys request during rehashing of slot"), TRANSIENT, "redis", "",
                 id="redis-TRYAGAIN"),
    # -MOVED escaping: a MULTI's EXECABORT raises the queued redirection; a plain client pointed at a cluster node
    pytest.param(E.MovedError("3999 127.0.0.1:6381"), TRANSIENT, "redis", "redis+cluster://", id="redis-MOVED"),
    # -ASK escaping the same ways, while the slot is MIGRATING
    pytest.param(E.AskError("3999 127.0.0.1:6381"), TRANSIENT, "redis", "", id="redis-ASK"),
    # NodesManager.get_node_from_slot: the slots table has no node for the slot yet (not a RedisError)
    pytest.param(E.SlotNotCoveredError('Slot "3999" is not covered by the cluster.'), TRANSIENT, "redis", "",
                 id="redis-SlotNotCoveredError"),
    # NodesManager.initialize: no seed answered CLUSTER SLOTS
    pytest.param(E.RedisClusterException("Redis Cluster cannot be connected. Please provide at least one reachable "
                                         "node: Error 111 connecting to 127.0.0.1:7000. Connection refused."),
                 TRANSIENT, "redis", "", id="redis-cluster-cannot-be-connected"),
    # NodesManager.initialize with require_full_coverage: a primary down, its slots not taken over yet
    pytest.param(E.RedisClusterException("All slots are not covered after query all startup_nodes. 10923 of 16384 "
                                         "covered..."), TRANSIENT, "redis", "", id="redis-cluster-slots-not-covered"),
    # NodesManager.initialize: the seeds disagree on the slots while a migration completes
    pytest.param(E.RedisClusterException("startup_nodes could not agree on a valid slots cache: a vs b on slot: 1"),
                 TRANSIENT, "redis", "", id="redis-cluster-seeds-disagree"),
    # RedisCluster._internal_execute_command: no node known for the command (a refresh emptied the table)
    pytest.param(E.RedisClusterException("No targets were found to execute ('GET', 'k') command on"), TRANSIENT,
                 "redis", "", id="redis-cluster-no-targets"),
    # WATCH in a ClusterPipeline: a slot moved while watching (or another client changed the key)
    pytest.param(E.WatchError("Slot rebalancing occurred while watching keys"), TRANSIENT, "redis", "",
                 id="redis-WatchError"),
    # -- Redis away, restarting, failing over, full: waiting fixes it -----------------------------------------------
    # Connection.connect: refused / reset / unreachable (after redis-py's Retry gave up)
    pytest.param(E.ConnectionError("Error 111 connecting to localhost:6379. Connection refused."), TRANSIENT,
                 "redis", "", id="redis-ConnectionError-refused"),
    # _parsers/socket.py: the server closed the connection (a restart, a kill)
    pytest.param(E.ConnectionError("Connection closed by server."), TRANSIENT, "redis", "",
                 id="redis-ConnectionError-closed"),
    # -ERR max number of clients reached (parser maps it to ConnectionError)
    pytest.param(E.ConnectionError("max number of clients reached"), TRANSIENT, "redis", "",
                 id="redis-max-clients"),
    # a TLS connection cut while the server restarts: an outage, not a refused handshake
    pytest.param(E.ConnectionError("Error 8 connecting to h:6380. [SSL: UNEXPECTED_EOF_WHILE_READING] EOF occurred "
                                   "in violation of protocol (_ssl.c:1006)."), TRANSIENT, "redis", "",
                 id="redis-tls-eof"),
    # Connection.read_response / connect: socket timeout
    pytest.param(E.TimeoutError("Timeout reading from socket"), TRANSIENT, "redis", "", id="redis-TimeoutError"),
    # ConnectionPool.make_connection: max_connections reached (the cluster client re-raises it as is)
    pytest.param(E.MaxConnectionsError("Too many connections"), TRANSIENT, "redis", "",
                 id="redis-MaxConnectionsError"),
    # -LOADING after a restart
    pytest.param(E.BusyLoadingError("Redis is loading the dataset in memory"), TRANSIENT, "redis", "",
                 id="redis-LOADING"),
    # -LOADING as a bare ResponseError (a reply no class maps in this redis-py)
    pytest.param(E.ResponseError("LOADING Redis is loading the dataset in memory"), TRANSIENT, "redis", "",
                 id="redis-LOADING-reply"),
    # -READONLY: a write reached a primary a failover demoted
    pytest.param(E.ReadOnlyError("You can't write against a read only replica."), TRANSIENT, "redis", "",
                 id="redis-READONLY"),
    # -OOM with maxmemory-policy noeviction
    pytest.param(E.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."), TRANSIENT, "redis", "",
                 id="redis-OOM"),
    # -BUSY: a script runs longer than busy-reply-threshold
    pytest.param(E.ResponseError("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN "
                                 "NOSAVE."), TRANSIENT, "redis", "", id="redis-BUSY"),
    # -NOREPLICAS: min-replicas-to-write not met while a replica restarts
    pytest.param(E.ResponseError("NOREPLICAS Not enough good replicas to write."), TRANSIENT, "redis", "",
                 id="redis-NOREPLICAS"),
    # -NOSCRIPT escaping Script.__call__: the script cache of a restarted primary lost between load and call
    pytest.param(E.NoScriptError("No matching script. Please use EVAL."), TRANSIENT, "redis", "",
                 id="redis-NOSCRIPT"),
    # -ERR problem with LDAP service: the server's authentication backend is away
    pytest.param(E.ExternalAuthProviderError("problem with LDAP service"), TRANSIENT, "redis", "",
                 id="redis-ExternalAuthProviderError"),
    # -- Redis refusals no waiting fixes: fatal, naming the fix --------------------------------------------------
    # -WRONGPASS in AUTH / HELLO
    pytest.param(E.AuthenticationError("invalid username-password pair or user is disabled."), FATAL, "redis",
                 _PASSWORD, id="redis-WRONGPASS"),
    # -NOAUTH: a password is required and none was given
    pytest.param(E.AuthenticationError("Authentication required."), FATAL, "redis", _PASSWORD, id="redis-NOAUTH"),
    # AUTH user pass against a Redis without ACL users (< 6)
    pytest.param(E.AuthenticationWrongNumberOfArgsError("wrong number of arguments for 'auth' command"), FATAL,
                 "redis", _PASSWORD, id="redis-AUTH-args"),
    # -NOPERM: the role's ACL does not allow the command or key
    pytest.param(E.NoPermissionError("this user has no permissions to run the 'evalsha' command"), FATAL, "redis",
                 _REDIS_ACL, id="redis-NOPERM"),
    pytest.param(E.AuthorizationError("not authorized"), FATAL, "redis", _REDIS_ACL, id="redis-AuthorizationError"),
    # Connection.connect: ssl.SSLCertVerificationError wrapped as ConnectionError
    pytest.param(E.ConnectionError("Error 1 connecting to h:6380. [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify "
                                   "failed: unable to get local issuer certificate (_ssl.c:1006)."), FATAL, "redis",
                 _CA, id="redis-tls-unknown-ca"),
    # rediss:// to a plain-text port
    pytest.param(E.ConnectionError("Error 1 connecting to h:6379. [SSL: WRONG_VERSION_NUMBER] wrong version number "
                                   "(_ssl.c:1006)."), FATAL, "redis", _CA, id="redis-tls-wrong-version"),
    # Connection.on_connect: SELECT refused
    pytest.param(E.ConnectionError("Invalid Database"), FATAL, "redis", "RUNJOURNAL_REDIS_URL",
                 id="redis-invalid-database"),
    # a cluster client that could not log in to any seed: the refusal is the cause of the cause (redis_client._cluster)
    pytest.param(chained(E.ConnectionError("no Redis Cluster node answers at 127.0.0.1:7000: Redis Cluster cannot be "
                                           "connected. Please provide at least one reachable node: invalid"),
                         E.RedisClusterException("Redis Cluster cannot be connected. Please provide at least one "
                                                 "reachable node: invalid"),
                         E.AuthenticationError("invalid username-password pair or user is disabled.")),
                 FATAL, "redis", _PASSWORD, id="redis-cluster-login-refused"),
    # redis+cluster:// against a Redis without cluster mode (CLUSTER SLOTS refused, wrapped twice)
    pytest.param(chained(E.ConnectionError("no Redis Cluster node answers at 127.0.0.1:6379: Redis Cluster cannot be "
                                           "connected. Please provide at least one reachable node: Cluster mode is "
                                           "not enabled on this node"),
                         E.RedisClusterException("Cluster mode is not enabled on this node")),
                 FATAL, "redis", "use redis://", id="redis-cluster-mode-off"),
    # RedisCluster(): a database other than 0
    pytest.param(E.RedisClusterException("A ``db`` querystring option can only be 0 in cluster mode"), FATAL,
                 "redis", "database 0", id="redis-cluster-db"),
    # -WRONGTYPE, -ERR …: the data or the server is not what the code expects
    pytest.param(E.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"), FATAL, "redis",
                 "", id="redis-WRONGTYPE"),
    # -EXECABORT with no queued error to raise instead
    pytest.param(E.ExecAbortError("Transaction discarded because of previous errors."), FATAL, "redis", "",
                 id="redis-EXECABORT"),
    # _parsers: "Protocol Error": something that is not Redis on the port
    pytest.param(E.InvalidResponse("Protocol Error: b'H'"), FATAL, "redis", "RUNJOURNAL_REDIS_URL",
                 id="redis-protocol-error"),
    # -- refused by redis-py before sending: a bug of the caller (raised as it is) -------------------------------
    # -CROSSSLOT, or the cluster client's own check before a script / transaction
    pytest.param(E.ClusterCrossSlotError("Keys in request don't hash to the same slot"), FATAL, "runjournal",
                 "hash tag", id="redis-CROSSSLOT"),
    pytest.param(E.CrossSlotTransactionError("All keys involved in a cluster transaction must map to the same slot"),
                 FATAL, "runjournal", "hash tag", id="redis-CrossSlotTransactionError"),
    pytest.param(E.RedisClusterException("ERROR: Calling pipelined function watch is blocked when running redis in "
                                         "cluster mode..."), FATAL, "runjournal", "", id="redis-cluster-blocked"),
    # Encoder.encode: a value of a type Redis cannot hold
    pytest.param(E.DataError("Invalid input of type: 'dict'."), FATAL, "runjournal", "", id="redis-DataError"),
    # -- Kafka: a broker, leader or coordinator away or moving; waiting fixes it -----------------------------------
    # any call: the connection to a broker failed / every broker is down (error_cb, admin futures, consume)
    pytest.param(kx("_TRANSPORT"), TRANSIENT, "kafka", "", id="kafka-_TRANSPORT"),
    pytest.param(kx("_ALL_BROKERS_DOWN"), TRANSIENT, "kafka", "", id="kafka-_ALL_BROKERS_DOWN"),
    pytest.param(kx("_FAIL"), TRANSIENT, "kafka", "", id="kafka-_FAIL"),
    pytest.param(kx("_RESOLVE"), TRANSIENT, "kafka", "", id="kafka-_RESOLVE"),
    # a call's own timeout (list_topics, describe_topics, get_watermark_offsets, commit_transaction)
    pytest.param(kx("_TIMED_OUT"), TRANSIENT, "kafka", "", id="kafka-_TIMED_OUT"),
    pytest.param(kx("_TIMED_OUT_QUEUE"), TRANSIENT, "kafka", "", id="kafka-_TIMED_OUT_QUEUE"),
    # a delivery report: message.timeout.ms passed with the partition leaderless
    pytest.param(kx("_MSG_TIMED_OUT"), TRANSIENT, "kafka", "", id="kafka-_MSG_TIMED_OUT"),
    # a transactional call waiting for its coordinator
    pytest.param(kx("_WAIT_COORD"), TRANSIENT, "kafka", "", id="kafka-_WAIT_COORD"),
    # the producer's local queue is full (the transactional publisher's own _QUEUE_FULL)
    pytest.param(kx("_QUEUE_FULL"), TRANSIENT, "kafka", "", id="kafka-_QUEUE_FULL"),
    # Producer.produce: queue.buffering.max.messages reached
    pytest.param(BufferError("Local: Queue full"), TRANSIENT, "kafka", "", id="kafka-BufferError"),
    # requests in flight when a broker left the metadata (killed, restarting; issue 17)
    pytest.param(kx("_DESTROY_BROKER"), TRANSIENT, "kafka", "", id="kafka-_DESTROY_BROKER"),
    pytest.param(kx("_NODE_UPDATE"), TRANSIENT, "kafka", "", id="kafka-_NODE_UPDATE"),
    # a consume loop that stalled past max.poll.interval.ms: the next poll joins again
    pytest.param(kx("_MAX_POLL_EXCEEDED"), TRANSIENT, "kafka", "", id="kafka-_MAX_POLL_EXCEEDED"),
    # broker replies while leadership moves (produce, fetch, list offsets, metadata)
    pytest.param(kx("REQUEST_TIMED_OUT"), TRANSIENT, "kafka", "", id="kafka-REQUEST_TIMED_OUT"),
    pytest.param(kx("NETWORK_EXCEPTION"), TRANSIENT, "kafka", "", id="kafka-NETWORK_EXCEPTION"),
    pytest.param(kx("BROKER_NOT_AVAILABLE"), TRANSIENT, "kafka", "", id="kafka-BROKER_NOT_AVAILABLE"),
    pytest.param(kx("LEADER_NOT_AVAILABLE"), TRANSIENT, "kafka", "", id="kafka-LEADER_NOT_AVAILABLE"),
    pytest.param(kx("NOT_LEADER_FOR_PARTITION"), TRANSIENT, "kafka", "", id="kafka-NOT_LEADER_FOR_PARTITION"),
    pytest.param(kx("REPLICA_NOT_AVAILABLE"), TRANSIENT, "kafka", "", id="kafka-REPLICA_NOT_AVAILABLE"),
    pytest.param(kx("FENCED_LEADER_EPOCH"), TRANSIENT, "kafka", "", id="kafka-FENCED_LEADER_EPOCH"),
    pytest.param(kx("UNKNOWN_LEADER_EPOCH"), TRANSIENT, "kafka", "", id="kafka-UNKNOWN_LEADER_EPOCH"),
    pytest.param(kx("KAFKA_STORAGE_ERROR"), TRANSIENT, "kafka", "", id="kafka-KAFKA_STORAGE_ERROR"),
    # acks=all with too few in-sync replicas (a broker of three down)
    pytest.param(kx("NOT_ENOUGH_REPLICAS"), TRANSIENT, "kafka", "", id="kafka-NOT_ENOUGH_REPLICAS"),
    pytest.param(kx("NOT_ENOUGH_REPLICAS_AFTER_APPEND"), TRANSIENT, "kafka", "",
                 id="kafka-NOT_ENOUGH_REPLICAS_AFTER_APPEND"),
    pytest.param(kx("THROTTLING_QUOTA_EXCEEDED"), TRANSIENT, "kafka", "", id="kafka-THROTTLING_QUOTA_EXCEEDED"),
    # group and transaction coordinators moving or loading (commit, init_transactions, commit_transaction)
    pytest.param(kx("NOT_COORDINATOR"), TRANSIENT, "kafka", "", id="kafka-NOT_COORDINATOR"),
    pytest.param(kx("COORDINATOR_NOT_AVAILABLE"), TRANSIENT, "kafka", "", id="kafka-COORDINATOR_NOT_AVAILABLE"),
    pytest.param(kx("COORDINATOR_LOAD_IN_PROGRESS"), TRANSIENT, "kafka", "",
                 id="kafka-COORDINATOR_LOAD_IN_PROGRESS"),
    pytest.param(kx("CONCURRENT_TRANSACTIONS"), TRANSIENT, "kafka", "", id="kafka-CONCURRENT_TRANSACTIONS"),
    # a synchronous commit during a rebalance
    pytest.param(kx("REBALANCE_IN_PROGRESS"), TRANSIENT, "kafka", "", id="kafka-REBALANCE_IN_PROGRESS"),
    pytest.param(kx("ILLEGAL_GENERATION"), TRANSIENT, "kafka", "", id="kafka-ILLEGAL_GENERATION"),
    pytest.param(kx("UNKNOWN_MEMBER_ID"), TRANSIENT, "kafka", "", id="kafka-UNKNOWN_MEMBER_ID"),
    pytest.param(kx("UNSTABLE_OFFSET_COMMIT"), TRANSIENT, "kafka", "", id="kafka-UNSTABLE_OFFSET_COMMIT"),
    # a code the table does not name, flagged retriable by a transactional call
    pytest.param(kx("_PREV_IN_PROGRESS", retriable=True), TRANSIENT, "kafka", "", id="kafka-retriable-flag"),
    # -- Kafka refusals no waiting fixes: fatal, naming the fix --------------------------------------------------
    pytest.param(kx("_FATAL"), FATAL, "kafka", "", id="kafka-_FATAL"),
    # a fatal flag wins over a transient code (librdkafka's fatal error, e.g. from error_cb)
    pytest.param(kx("_TRANSPORT", fatal=True), FATAL, "kafka", "", id="kafka-fatal-flag"),
    pytest.param(kx("OUT_OF_ORDER_SEQUENCE_NUMBER", fatal=True), FATAL, "kafka", "",
                 id="kafka-OUT_OF_ORDER_SEQUENCE_NUMBER"),
    # fenced: another producer with the transactional id, another static member with the instance id
    pytest.param(kx("_FENCED"), FATAL, "kafka", "--instance-id", id="kafka-_FENCED"),
    pytest.param(kx("PRODUCER_FENCED"), FATAL, "kafka", "", id="kafka-PRODUCER_FENCED"),
    pytest.param(kx("INVALID_PRODUCER_EPOCH"), FATAL, "kafka", "", id="kafka-INVALID_PRODUCER_EPOCH"),
    pytest.param(kx("FENCED_INSTANCE_ID"), FATAL, "kafka", "--instance-id", id="kafka-FENCED_INSTANCE_ID"),
    # the broker's authorizer
    pytest.param(kx("TOPIC_AUTHORIZATION_FAILED"), FATAL, "kafka", _KAFKA_ACL, id="kafka-TOPIC_AUTHORIZATION_FAILED"),
    pytest.param(kx("GROUP_AUTHORIZATION_FAILED"), FATAL, "kafka", _KAFKA_ACL, id="kafka-GROUP_AUTHORIZATION_FAILED"),
    pytest.param(kx("CLUSTER_AUTHORIZATION_FAILED"), FATAL, "kafka", _KAFKA_ACL,
                 id="kafka-CLUSTER_AUTHORIZATION_FAILED"),
    pytest.param(kx("TRANSACTIONAL_ID_AUTHORIZATION_FAILED"), FATAL, "kafka", _KAFKA_ACL,
                 id="kafka-TRANSACTIONAL_ID_AUTHORIZATION_FAILED"),
    # SASL login refused
    pytest.param(kx("SASL_AUTHENTICATION_FAILED"), FATAL, "kafka", _SASL, id="kafka-SASL_AUTHENTICATION_FAILED"),
    pytest.param(kx("_AUTHENTICATION"), FATAL, "kafka", _SASL, id="kafka-_AUTHENTICATION"),
    pytest.param(kx("UNSUPPORTED_SASL_MECHANISM"), FATAL, "kafka", _SASL, id="kafka-UNSUPPORTED_SASL_MECHANISM"),
    # TLS handshake refused
    pytest.param(kx("_SSL"), FATAL, "kafka", "RUNJOURNAL_KAFKA_SSL_CA_LOCATION", id="kafka-_SSL"),
    # the topic or partition is gone
    pytest.param(kx("UNKNOWN_TOPIC_OR_PART"), FATAL, "kafka", "runjournal topics create",
                 id="kafka-UNKNOWN_TOPIC_OR_PART"),
    pytest.param(kx("_UNKNOWN_TOPIC"), FATAL, "kafka", "runjournal topics create", id="kafka-_UNKNOWN_TOPIC"),
    pytest.param(kx("UNKNOWN_TOPIC_ID"), FATAL, "kafka", "runjournal topics create", id="kafka-UNKNOWN_TOPIC_ID"),
    pytest.param(kx("_UNKNOWN_PARTITION"), FATAL, "kafka", "", id="kafka-_UNKNOWN_PARTITION"),
    # a setting librdkafka or the broker refuses
    pytest.param(kx("_INVALID_ARG"), FATAL, "kafka", "RUNJOURNAL_LIBRDKAFKA_", id="kafka-_INVALID_ARG"),
    pytest.param(kx("INVALID_CONFIG"), FATAL, "kafka", "RUNJOURNAL_LIBRDKAFKA_", id="kafka-INVALID_CONFIG"),
    # a record the broker refuses for itself; a call out of order
    pytest.param(kx("MSG_SIZE_TOO_LARGE"), FATAL, "kafka", "", id="kafka-MSG_SIZE_TOO_LARGE"),
    pytest.param(kx("_STATE"), FATAL, "kafka", "", id="kafka-_STATE"),
    pytest.param(kx("INVALID_TXN_STATE"), FATAL, "kafka", "", id="kafka-INVALID_TXN_STATE"),
    # KIP-848: named a fence, and nothing says waiting fixes it in this table
    pytest.param(kx("FENCED_MEMBER_EPOCH"), FATAL, "kafka", "", id="kafka-FENCED_MEMBER_EPOCH"),
    # -- our wrappers of a client error mean what the client error means ------------------------------------------
    # producers.fencing.fence_producer: JournalError from init_transactions' KafkaException (the recovery job's fence)
    pytest.param(chained(JournalError("could not fence agent-1: coordinator loading"),
                         kx("COORDINATOR_LOAD_IN_PROGRESS")), TRANSIENT, "kafka", "", id="fence-coordinator-loading"),
    pytest.param(chained(JournalError("could not fence agent-1: refused"), kx("TRANSACTIONAL_ID_AUTHORIZATION_FAILED")),
                 FATAL, "kafka", _KAFKA_ACL, id="fence-refused"),
    pytest.param(ProducerFencedError("fenced by the recovery job"), FATAL, "kafka", "", id="ProducerFencedError"),
    # runtime.dlq.DeadLetters.flush: the DLQ's broker did not acknowledge (an outage) …
    pytest.param(DeadLetterError("1 DLQ record(s) unacknowledged, errors: []"), TRANSIENT, "kafka", "",
                 id="dlq-unacknowledged"),
    pytest.param(DeadLetterError("0 DLQ record(s) unacknowledged, errors: [...]",
                                 (KafkaError(KafkaError._MSG_TIMED_OUT),)),  # noqa: SLF001
                 TRANSIENT, "kafka", "", id="dlq-timed-out"),
    # … or refused the records for good
    pytest.param(DeadLetterError("0 DLQ record(s) unacknowledged, errors: [...]",
                                 (KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED),)),
                 FATAL, "kafka", _KAFKA_ACL, id="dlq-refused"),
    # -- the key service (decision 0059): away is waited out, nothing is read or written without its key ----------
    pytest.param(KeyUnavailableError("key directory /k: [Errno 5] Input/output error", kek_id="t-1"), TRANSIENT,
                 "kms", "", id="kms-unavailable"),
    # a destroyed key is no outage: waiting never brings it back
    pytest.param(KeyDestroyedError("key t-1 was destroyed", kek_id="t-1"), FATAL, "runjournal", "",
                 id="kms-key-destroyed"),
]


@pytest.mark.parametrize(("exc", "kind", "dependency", "fix"), TABLE)
def test_every_client_error_is_classified_by_what_it_means(exc: BaseException, kind: str, dependency: str,
                                                          fix: str) -> None:
    """Each row through ``classify`` and through ``FailurePolicy.call``: a transient one is waited out and the same
    work done again; a fatal one stops at once (``FatalDependencyError`` naming the fix; a bug is raised as it is,
    its traceback is clearer)."""
    verdict = classify(exc)
    assert (verdict.kind, verdict.dependency) == (kind, dependency), verdict.cause
    assert fix in verdict.cause
    calls, work = _fails_once(exc)
    policy = _policy()
    if kind == TRANSIENT:
        assert policy.call("work", work) == "done"
        assert calls == [1, 1] and policy.retries == 1
    else:
        expected = type(exc) if dependency == "runjournal" else FatalDependencyError
        with pytest.raises(expected) as raised:
            policy.call("work", work)
        assert calls == [1] and policy.retries == 0
        assert fix in str(raised.value) or dependency == "runjournal"


@pytest.mark.parametrize(("code", "stops"), [
    ("_FATAL", True), ("_FENCED", True), ("FENCED_INSTANCE_ID", True), ("TOPIC_AUTHORIZATION_FAILED", True),
    ("GROUP_AUTHORIZATION_FAILED", True), ("SASL_AUTHENTICATION_FAILED", True), ("_AUTHENTICATION", True),
    ("UNKNOWN_TOPIC_OR_PART", True), ("UNKNOWN_TOPIC_ID", True),
    # librdkafka retries these by itself: a consumer logs them and goes on
    ("_TRANSPORT", False), ("_ALL_BROKERS_DOWN", False), ("NOT_COORDINATOR", False), ("_DESTROY_BROKER", False),
    ("_MAX_POLL_EXCEEDED", False), ("_SSL", False),
])
def test_a_consumer_stops_on_refusals_only(code: str, stops: bool) -> None:
    assert stops_consumer(KafkaError(getattr(KafkaError, code))) is stops
    assert stops_consumer(KafkaError(getattr(KafkaError, code), fatal=True))  # the fatal flag always stops


# -- the sibling call sites decide by the same table ---------------------------------------------------------------

class _Msg:
    def __init__(self, err: KafkaError) -> None:
        self._err = err

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return -1001

    def error(self) -> KafkaError:
        return self._err


class _ErrorConsumer:
    """A consumer whose every fetch answers ``err`` (read_ranges' surface)."""

    def __init__(self, err: KafkaError) -> None:
        self.err = err

    def assign(self, _partitions: Any) -> None:
        pass

    def pause(self, _partitions: Any) -> None:
        pass

    def consume(self, _n: int, timeout: float) -> list[_Msg]:
        return [_Msg(self.err)]

    def position(self, partitions: Any) -> list[Any]:
        return [types.SimpleNamespace(partition=tp.partition, offset=0) for tp in partitions]


def test_reading_to_the_end_stops_on_a_refused_read_and_waits_out_an_outage() -> None:
    """runtime.partitions.read_ranges (the recovery job's tails, the execution stores): a read refused for good stops
    the read (before: only a fatal-flagged error did, an unauthorised read spun until the timeout and came back as
    "not read to its end"); a broker away is waited for, as before."""
    from runjournal.consumers.runtime.partitions import read_ranges

    refused = _ErrorConsumer(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    with pytest.raises(KafkaException) as raised:
        read_ranges(refused, "t.events", {0: (0, 5)}, lambda _m: None, timeout_s=5)  # type: ignore[arg-type]
    assert classify(raised.value).kind == FATAL
    away = _ErrorConsumer(KafkaError(KafkaError._TRANSPORT))  # noqa: SLF001
    assert read_ranges(away, "t.events", {0: (0, 5)}, lambda _m: None, timeout_s=0.3) == {0}  # type: ignore[arg-type]


class _TxnProducer:
    """The transactional calls ResumedPublisher.publish makes; commit_transaction raises ``exc``."""

    def __init__(self, exc: KafkaException) -> None:
        self.exc = exc

    def begin_transaction(self) -> None:
        pass

    def commit_transaction(self, _timeout: float) -> None:
        raise self.exc

    def abort_transaction(self, _timeout: float) -> None:
        pass

    def poll(self, _timeout: float) -> int:
        return 0

    def flush(self, _timeout: float) -> int:
        return 0

    def purge(self) -> None:
        pass


@pytest.mark.parametrize("code", ["NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS", "_TRANSPORT", "_TIMED_OUT",
                                  "_FATAL"])  # _FATAL with no cause reported (a fence whose error_cb came late)
def test_run_resumed_not_committed_for_an_outage_is_retried_by_the_next_pass(code: str) -> None:
    """consumers.recovery.resumed: a commit that failed for an outage, without librdkafka's retriable flag, is "not
    committed, the next pass retries" — it raised FatalDependencyError (the recovery job stopped) when the decision
    was ``err.retriable()``."""
    from runjournal.consumers.recovery.resumed import ResumedPublisher

    settings = types.SimpleNamespace(topic_prefix="t", events_topic="t.events")
    publisher = ResumedPublisher(settings, codec=None, partition=lambda _r: 0)  # type: ignore[arg-type]
    publisher._producer = _TxnProducer(kx(code))  # noqa: SLF001
    outcome = publisher.publish([])
    assert outcome is not None and outcome.startswith("RUN_RESUMED not committed") and code in outcome
    publisher._producer = _TxnProducer(kx("TRANSACTIONAL_ID_AUTHORIZATION_FAILED"))  # noqa: SLF001
    with pytest.raises(FatalDependencyError, match=_KAFKA_ACL):
        publisher.publish([])


class _RefusingReader:
    """A schemas-topic reader whose metadata request fails with ``exc``."""

    def __init__(self, exc: KafkaException) -> None:
        self.exc = exc

    def list_topics(self, timeout: float) -> Any:
        raise self.exc

    def close(self) -> None:
        pass


def test_the_schemas_topic_refused_for_good_is_not_a_registry_outage(monkeypatch: pytest.MonkeyPatch) -> None:
    """schemas.catalog: every KafkaException was a RegistryError (transient: the projector waited 240 s on an ACL);
    now only an outage is, a refusal is the client's KafkaException (fatal, naming the fix)."""
    from runjournal.core import kafka
    from runjournal.schemas.catalog import SchemaCatalog
    from runjournal.schemas.errors import RegistryError

    settings = types.SimpleNamespace(schemas_topic="t.schemas")
    catalog = SchemaCatalog(settings, timeout_s=1)  # type: ignore[arg-type]
    monkeypatch.setattr(kafka, "consumer", lambda *_a, **_k: _RefusingReader(kx("_TRANSPORT")))
    with pytest.raises(RegistryError) as away:
        catalog.schema_text(1)
    assert classify(away.value).kind == TRANSIENT
    monkeypatch.setattr(kafka, "consumer", lambda *_a, **_k: _RefusingReader(kx("TOPIC_AUTHORIZATION_FAILED")))
    with pytest.raises(KafkaException) as refused:
        catalog.schema_text(1)
    assert classify(refused.value).kind == FATAL and _KAFKA_ACL in classify(refused.value).cause


def test_the_demo_agent_waits_out_redis_by_meaning() -> None:
    """demo.agent: its Redis waits retried ConnectionError / TimeoutError / BusyLoadingError by class — a slot
    migration's ClusterError was raised, a refused login (an AuthenticationError is a ConnectionError) retried."""
    from runjournal.demo.agent import _redis_transient

    assert _redis_transient(E.ClusterError("TTL exhausted.")) and _redis_transient(E.TryAgainError("x"))
    assert _redis_transient(E.ConnectionError("Connection refused."))
    assert not _redis_transient(E.AuthenticationError("invalid username-password pair"))
    assert not _redis_transient(ValueError("not redis"))
