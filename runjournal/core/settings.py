"""One frozen settings object, read from ``RUNJOURNAL_*`` environment variables.

Precedence: environment variable > the running local stack's state file (written by
``runjournal stack up``) > built-in default. So after ``runjournal stack up`` every
other command finds the broker and Redis without any variable set.

Variables (each field of :class:`Settings`, upper-cased, with the ``RUNJOURNAL_`` prefix; the
docs/reference/settings.md lists meanings and defaults): ``BOOTSTRAP``, ``REDIS_URL``,
``QDRANT_PATH``, ``QDRANT_URL``, ``QDRANT_API_KEY``, ``SCHEMA_REGISTRY_URL``, ``TOPIC_PREFIX``,
``STACK_DIR``, ``CACHE_DIR``, the archive's ``ARCHIVE_URL``, ``OBJECT_STORE_ENDPOINT``, ``OBJECT_STORE_KEY``,
``OBJECT_STORE_SECRET``, its retention ``RETENTION_S``, ``RETENTION_OVERRIDES`` and ``RUN_ID_MEMORY_S``,
``PARTITIONS``,
``REPLICATION_FACTOR``, ``LOG_LEVEL``,
``CONSOLE_OPERATOR_TOKEN``, ``STREAMS_RETENTION_MS``, ``STREAM_CHUNK_BYTES``, the encryption settings ``ENCRYPTION``,
``KMS``, ``KEYS_DIR``, ``KEY_CACHE_SIZE``, ``KEY_CACHE_TTL_MS``, ``DATA_KEY_ROTATION_MS``, the Redis security settings
``REDIS_USERNAME``, ``REDIS_PASSWORD``,
``REDIS_SSL_CA_LOCATION``, ``REDIS_SSL_CERTIFICATE_LOCATION``,
``REDIS_SSL_KEY_LOCATION`` (``REDIS_URL`` may name a Redis Cluster: ``runjournal.core._redis_url``), the Kafka
security settings ``KAFKA_SECURITY_PROTOCOL``, ``KAFKA_SASL_MECHANISM``, ``KAFKA_SASL_USERNAME``,
``KAFKA_SASL_PASSWORD``, ``KAFKA_SSL_CA_LOCATION``, ``KAFKA_SSL_CERTIFICATE_LOCATION``,
``KAFKA_SSL_KEY_LOCATION``, ``KAFKA_SSL_KEY_PASSWORD``, ``KAFKA_PROPERTIES_FILE``, and any
``RUNJOURNAL_LIBRDKAFKA_<NAME>`` pass-through property (``runjournal.core._kafka_props``).

The local stack's state file supplies, besides the endpoints, the replication factor (its broker
count) and, for a ``--secure`` stack, its security protocol, CA and the operator's credentials —
only when the bootstrap itself came from the state file (never mixed into another cluster's settings).
Likewise a secure stack's Redis CA and the operator's Redis user, only with the Redis URL of the state file.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from runjournal.core import _kafka_props
from runjournal.core._redis_url import parse_redis_url
from runjournal.core.errors import ConfigError
from runjournal.core.spend_policy import SpendPolicy, check_currency

__all__ = ["Settings", "default_cache_dir", "default_stack_dir", "mask_url"]

STATE_FILE = "stack.json"


def default_stack_dir() -> Path:
    """``$XDG_STATE_HOME/runjournal``, i.e. ``~/.local/state/runjournal`` by default."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "runjournal"


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/runjournal``, i.e. ``~/.cache/runjournal`` by default."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "runjournal"


_USERINFO = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:@/]*)(?::[^@/]*)?@", re.I)


def mask_url(url: str | None) -> str | None:
    """Return ``url`` with any password replaced by ``***`` (``redis://u:***@host:6379/0``)."""
    if url is None:
        return None
    return _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:***@" if m["user"] or "@" in m[0] else m[0], url)


def retention_scope(scope: str) -> tuple[str | None, str | None] | None:
    """``(tenant, agent)`` named by a ``RUNJOURNAL_RETENTION_OVERRIDES`` scope, or None when it is not one."""
    if m := re.fullmatch(r"tenant:(.+)/agent:(.+)", scope):
        return m[1], m[2]
    if m := re.fullmatch(r"tenant:(.+)", scope):
        return m[1], None
    if m := re.fullmatch(r"agent:(.+)", scope):
        return None, m[1]
    return None


class Settings(BaseSettings):
    """Connection and naming settings for every runjournal command and service.

    Construct with :meth:`load` (env + stack state file). Unknown ``RUNJOURNAL_*``
    variables are an error, not ignored, so a typo cannot silently fall back to a default.

    Raises:
        ConfigError: a variable is invalid or unknown; the message names it.
    """

    model_config = SettingsConfigDict(env_prefix="RUNJOURNAL_", extra="forbid", frozen=True)

    bootstrap: str = "127.0.0.1:9092"
    """Kafka bootstrap servers, comma separated ``host:port``."""
    redis_url: str = "redis://127.0.0.1:6379/0"
    """Redis URL: ``redis://`` / ``rediss://`` (TLS) for one server, ``redis+cluster://h1:p1,h2:p2`` /
    ``rediss+cluster://…`` for a Redis Cluster (``runjournal.core._redis_url``); a password in it is masked."""
    redis_username: str | None = None
    """Redis ACL user (wins over the URL's); None: the URL's, else Redis's ``default`` user."""
    redis_password: SecretStr | None = None
    """Password of the Redis user (wins over the URL's); masked when printed."""
    redis_ssl_ca_location: Path | None = None
    """PEM of the CA that signed the Redis servers' certificates (needs a ``rediss`` URL); None: the system's."""
    redis_ssl_certificate_location: Path | None = None
    """The client's PEM certificate for Redis (mutual TLS, ``tls-auth-clients yes``)."""
    redis_ssl_key_location: Path | None = None
    """The client's PEM private key for Redis (mutual TLS)."""
    qdrant_path: Path | None = None
    """Embedded Qdrant directory; None means ``<stack_dir>/qdrant``."""
    qdrant_url: str | None = None
    """Qdrant server URL; when set, local mode is not used."""
    qdrant_api_key: SecretStr | None = None
    """Qdrant server API key."""
    schema_registry_url: str | None = None
    """Confluent Schema Registry URL: writers use Confluent framing and readers resolve schema ids
    there; None means writers use Avro single-object encoding (readers read both framings either way)."""
    critical_event_types: str = ""
    """Comma-separated event type symbols this reader does not know but must not pass over: an event
    of such a type parks its run (BLOCKED) instead of being recorded as UNKNOWN; ``*`` = every unknown type."""
    topic_prefix: str = "runjournal"
    """Prefix of every topic name."""
    archive_url: str | None = None
    """Where closed runs are archived (issue 30): a local folder ``file:///path`` (or a plain path), or
    ``s3://bucket/prefix`` on an S3 object store. None: ``file://<stack_dir>/archive``, or
    ``s3://runjournal-archive/<topic_prefix>`` while the local stack runs an object store
    (``stack up --object-store``)."""
    object_store_endpoint: str | None = None
    """S3 endpoint URL for an ``s3://`` archive (``http://127.0.0.1:9000``); None: the AWS default (or the running
    stack's object store)."""
    object_store_key: str | None = None
    """S3 access key id; None: the running stack's object store's, else the AWS default chain (environment,
    ``~/.aws``, instance role)."""
    object_store_secret: SecretStr | None = None
    """S3 secret access key; masked when printed."""
    retention_s: float | None = Field(default=None, ge=0)
    """How long a finished run stays in the hot stores (Kafka, Redis) before the archiver moves it to the archive,
    seconds, counted by Redis's clock from when the archiver saw the run finish (issue 30). None or 0: kept
    forever (the default)."""
    retention_overrides: dict[str, float] = Field(default_factory=dict)
    """Per tenant and agent retention, seconds (JSON): ``{"tenant:<id>": s, "agent:<name>": s,
    "tenant:<id>/agent:<name>": s}``; the most specific entry wins (tenant and agent, then agent, then tenant,
    then :attr:`retention_s`); 0 keeps that scope's runs forever."""
    run_id_memory_s: float | None = Field(default=30 * 24 * 3600, ge=0)
    """How long the id of a run the archiver moved out stays claimed in Redis (``rj:{P:r:<run>}:claim``), seconds
    (30 days): a ``start_run`` with that id meanwhile is refused as a run id in use; after it the claim expires, so
    Redis holds no key per archived run beyond that window. A run id reused later anyway is refused by the archive
    (``RunIdReusedError``: its manifest names another RUN_STARTED), never merged into the older run's object. None
    or 0: the claim stays for ever (about 100 bytes a run, growing with the history) (decision 0056)."""
    stack_dir: Path = Field(default_factory=default_stack_dir)
    """Local stack directory (data, logs, ``stack.json``)."""
    cache_dir: Path = Field(default_factory=default_cache_dir)
    """Cache of Maven-resolved broker jars."""
    partitions: int = Field(default=6, ge=1, le=10_000)
    """Partition count for ``topics create`` (fixed at creation: the run-to-partition map depends on it)."""
    replication_factor: int = Field(default=3, ge=1, le=32)
    """Replication factor for ``topics create`` (3 for production; the local stack's state supplies its broker
    count). ``min.insync.replicas`` follows from it: 2 when replicated (deploy/topics.py)."""
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] | None = None
    """librdkafka ``security.protocol``; None: librdkafka's default (PLAINTEXT)."""
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] | None = None
    """``sasl.mechanism`` (needs a SASL_* protocol). OAUTHBEARER takes ``sasl.oauthbearer.*`` pass-through."""
    kafka_sasl_username: str | None = None
    """``sasl.username`` (PLAIN, SCRAM)."""
    kafka_sasl_password: SecretStr | None = None
    """``sasl.password`` (PLAIN, SCRAM); masked when printed."""
    kafka_ssl_ca_location: Path | None = None
    """``ssl.ca.location``: PEM file of the CA(s) that signed the brokers' certificates; None: the system's."""
    kafka_ssl_certificate_location: Path | None = None
    """``ssl.certificate.location``: the client's PEM certificate (mutual TLS)."""
    kafka_ssl_key_location: Path | None = None
    """``ssl.key.location``: the client's PEM private key (mutual TLS)."""
    kafka_ssl_key_password: SecretStr | None = None
    """``ssl.key.password`` of an encrypted client key; masked when printed."""
    kafka_properties_file: Path | None = None
    """A ``key=value`` file of librdkafka properties (e.g. a managed Kafka's client file)."""
    kafka_properties: dict[str, SecretStr] = Field(default_factory=dict)
    """Pass-through librdkafka properties, merged from ``kafka_properties_file`` and ``RUNJOURNAL_LIBRDKAFKA_*``
    at :meth:`load` (not a variable of its own). Values are SecretStr; :meth:`masked` shows non-secret ones."""
    log_level: str | None = None
    """Log level of every command (DEBUG … CRITICAL); None: INFO for services, WARNING otherwise."""
    console_operator_token: SecretStr | None = None
    """``runjournal console``: operators who sign in with this token may approve and deny, and cancel, pause and
    resume runs; unset: read-only."""
    outcome_commit: Literal["group", "strict"] = "group"
    """How an agent's ``Journal`` acknowledges a side effect's outcome (``Journal(outcome_commit=…)``): ``group`` —
    the TOOL_CALL_COMMITTED of a tool with ``reconcile()`` rides the next commit (one broker round trip per call;
    a crash before that commit leaves the call OUTCOME_UNKNOWN, reconciled by key); ``strict`` — every outcome is
    committed before ``call`` returns (two round trips). Tools without ``reconcile()`` are strict either way."""
    tracing: Literal["auto", "otel", "off"] = "auto"
    """OpenTelemetry traces (the ``otel`` extra; docs/guide/tracing.md): ``otel`` — on, exported as the standard
    ``OTEL_*`` variables say (OTLP over HTTP by default); ``off`` — off whatever they say; ``auto`` — on when
    ``OTEL_TRACES_EXPORTER`` (not ``none``), ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``
    is set. Read from the environment by ``runjournal.core.otel`` at the first traced step of a process; a value given
    in code takes effect when a ``Journal`` or ``RecoveryJob`` is built with it (``otel.apply_setting``)."""
    run_events_warn: int = Field(default=10_000, ge=0, le=2**62)
    """A run's event budget (events, counted by seq): an agent publishing the event that reaches it logs a warning
    once and counts ``runjournal_journal_runs_over_event_budget_total``; the console marks the run. 0: no warning.
    A warning only: the projection's cost per event does not grow with the run (README § Limits)."""
    run_events_max: int = Field(default=0, ge=0, le=2**62)
    """Hard limit of a run's events: past it the agent's ``RunHandle`` refuses to start new work (a node, a tool
    call's intent, a message, an approval request) with ``RunTooLongError`` before anything is published;
    outcomes, node ends and the run's end still go through, so no effect is left unrecorded. 0: no limit."""
    payload_chunk_bytes: int = Field(default=512 * 1024, ge=1024, le=960 * 1024)
    """Largest record of a large tool result on ``{prefix}.payloads`` and of a framework record's part on
    ``{prefix}.checkpoints`` (bytes, 1 KiB … 960 KiB; default 512 KiB). At most 960 KiB: a record must stay below the
    producer's and the broker's ``message.max.bytes`` (1 MB by default) with its key — a larger chunk would be
    refused only after the tool ran, its result lost (``runjournal.producers.results``)."""
    max_result_bytes: int = Field(default=256 * 1024 * 1024, ge=1024, le=2**31 - 1)
    """Largest tool result (UTF-8 canonical JSON, bytes) the journal records (default 256 MiB): a larger result
    raises ``ResultTooLargeError`` before any of it is produced (the call is recorded as committed without a
    result, docs/design/protocol.md § Results); call arguments over it raise ``ArgumentsTooLargeError`` before the
    intent."""
    streams_retention_ms: int = Field(default=24 * 3600 * 1000, ge=60_000)
    """``retention.ms`` of ``{prefix}.streams`` at ``topics create`` (ms, default 24 h, at least 1 min): how long a
    run's streamed partial output (``run.stream()``, ``runjournal.producers.streams``) stays readable by a reader
    that resumes by offset. Stream records are never read by recovery or the projector."""
    stream_chunk_bytes: int = Field(default=64 * 1024, ge=64, le=960 * 1024)
    """Largest chunk ``StreamWriter.write`` accepts (UTF-8 bytes of its JSON data, default 64 KiB): a larger one raises
    ``StreamChunkTooLargeError`` before anything is produced."""
    memory_nice: int = Field(default=19, ge=0, le=19)
    """CPU niceness ``runjournal memory-extractor`` gives its process after its preflight (0 … 19, 19 = lowest priority;
    0 leaves it as started): memory may lag, the projector, recovery and agents on the same host must not
    wait for CPU behind embeddings (docs/guide/memory.md)."""
    memory_sched: Literal["idle", "other"] = "idle"
    """Linux scheduling policy of every ``runjournal memory-extractor`` thread: ``idle`` (``SCHED_IDLE``, the default:
    only CPU time no normal thread wants; nice 19 alone still took 16-24 % of a projector's speed on 2 cores, bench
    pair 5) or ``other`` (time-sharing, bounded by ``memory_nice``)."""
    memory_headroom_cores: float = Field(default=1.0, ge=0)
    """Idle cores the rest of the host must leave before ``runjournal memory-extractor`` handles its next batch
    (0 = no gate; capped at the CPU count - 0.5): priority alone left a projector rebuild at 0.86-0.90 of its speed
    on 2 cores (caches and memory bandwidth are shared), see ``consumers/memory/headroom.py``."""
    memory_headroom_wait_ms: int = Field(default=2000, ge=0)
    """Longest wait for that headroom before one batch, ms (then one batch is handled anyway: memory lags, it
    never stops)."""
    spend_currency: str = "USD"
    """ISO 4217 code money is counted in (spend ledger, ``runjournal.producers.spend``; docs/guide/spend.md): costs
    and money budgets are integer micro-units of it."""
    spend_prices: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Model → ``{"input_per_mtok": …, "output_per_mtok": …}``, currency units per million tokens (JSON, e.g.
    ``{"gpt-4o": {"input_per_mtok": "2.50", "output_per_mtok": "10"}, "*": {…}}``; ``*`` prices every other model).
    Empty: money is not counted; with prices, a model without one is refused (``UnknownModelError``)."""
    spend_budgets: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Default budgets: scope → ``{dim: limit}`` (JSON). Scopes ``run``, ``tenant``, ``user`` (each kind's default)
    and ``tenant:<id>``, ``user:<id>``; dims ``input_tokens``, ``output_tokens``, ``model_calls`` (counts) and
    ``cost`` (currency units). An operator's ``runjournal spend budget`` overrides one scope's limit."""

    encryption: Literal["off", "on"] = "off"
    """Payload encryption (issue 33, docs/guide/encryption.md): ``on`` — an agent's ``Journal`` encrypts the content
    fields of the events it writes (AES-256-GCM, a key per tenant or subject; ``runjournal.core.crypto``); ``off`` —
    content is written in clear (the default). Readers read both either way."""
    kms: Literal["local", "aws", "vault"] = "local"
    """The key service that holds the key-encryption keys: ``local`` — a key directory (:attr:`keys_dir`); ``aws``
    (AWS KMS) and ``vault`` (HashiCorp Vault transit) are documented, not built in this release."""
    keys_dir: Path | None = None
    """The local key directory (``RUNJOURNAL_KMS=local``): one ``0600`` file per key-encryption key; None:
    ``<stack_dir>/keys``. Whoever can read it can read every encrypted payload its keys cover."""
    key_cache_size: int = Field(default=1024, ge=1, le=1_000_000)
    """Most unwrapped data keys a process keeps (``runjournal.core.crypto.cache``)."""
    key_cache_ttl_ms: int = Field(default=300_000, ge=0)
    """How long a process keeps one unwrapped data key, ms (default 5 min; 0: never cached): a key destroyed by
    another process stops decrypting here within it."""
    memory_key_grant: str = ""
    """Tenants whose encrypted content the memory extractor opens (comma list, or ``*`` for every tenant; empty,
    the default: none — encrypted content makes no memory). Items drawn from it are stored sealed under the same
    user's (or tenant's) key (``runjournal.consumers.memory.sealing``, docs/guide/encryption.md § Memory)."""
    data_key_rotation_ms: int = Field(default=86_400_000, ge=1000)
    """How long a writer uses one data key per scope before it makes a new one, ms (default 24 h; counted on the
    process's monotonic clock)."""

    @field_validator("spend_currency")
    @classmethod
    def _iso_currency(cls, v: str) -> str:
        return check_currency(v)

    @model_validator(mode="after")
    def _spend_parses(self) -> Settings:
        self.spend_policy()  # SpendConfigError (a ValueError) names a malformed price or budget at load
        return self

    def spend_policy(self) -> SpendPolicy:
        """The parsed prices and default budgets (``runjournal.producers.spend.SpendPolicy``).

        Raises:
            SpendConfigError: a malformed price or budget (named).
        """
        return SpendPolicy.parse(self.spend_currency, self.spend_prices, self.spend_budgets)

    @field_validator("retention_overrides")
    @classmethod
    def _retention_scopes(cls, v: dict[str, float]) -> dict[str, float]:
        for scope, seconds in v.items():
            if retention_scope(scope) is None:
                raise ValueError(f"unknown scope {scope!r}: use 'tenant:<id>', 'agent:<name>' or "
                                 "'tenant:<id>/agent:<name>'")
            if seconds < 0:
                raise ValueError(f"scope {scope!r}: retention must be >= 0 seconds (0 keeps forever), not {seconds}")
        return v

    def retention_for(self, tenant_id: str | None, agent: str | None) -> float | None:
        """The retention of a run of ``tenant_id`` and ``agent``, seconds; None: kept forever.

        The most specific of :attr:`retention_overrides` wins (``tenant:<t>/agent:<a>``, ``agent:<a>``,
        ``tenant:<t>``), else :attr:`retention_s`; 0 means forever too.
        """
        for scope in (f"tenant:{tenant_id}/agent:{agent}", f"agent:{agent}", f"tenant:{tenant_id}"):
            if scope in self.retention_overrides:
                return self.retention_overrides[scope] or None
        return self.retention_s or None

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, v: str | None) -> str | None:
        if v is not None and v.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ValueError("must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL")
        return v.upper() if v else None

    @field_validator("redis_url")
    @classmethod
    def _redis_url_form(cls, v: str) -> str:
        parse_redis_url(v)  # ValueError names the accepted forms
        return v

    @field_validator("topic_prefix")
    @classmethod
    def _legal_topic(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,200}", v):
            raise ValueError("topic prefix may hold only letters, digits, '.', '_' and '-'")
        return v

    @classmethod
    def load(cls, **overrides: Any) -> Settings:
        """Read the environment and the pass-through properties, fill unset endpoints (and, with them, the
        replication factor and a secure stack's security) from the local stack's state file, apply overrides.

        Raises:
            ConfigError: an invalid or unknown ``RUNJOURNAL_*`` variable, a refused pass-through property
                or an inconsistent security combination (each named in the message).
        """
        internal = {"RUNJOURNAL_KAFKA_PROPERTIES"}
        known = {f"RUNJOURNAL_{name.upper()}" for name in cls.model_fields} - internal
        unknown = sorted(k for k in os.environ if k.startswith("RUNJOURNAL_") and k not in known
                         and not k.startswith(_kafka_props.ENV_PREFIX))
        if unknown:
            raise ConfigError(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}, "
                              f"and {_kafka_props.ENV_PREFIX}<librdkafka property>")
        try:
            base = cls(**overrides)
        except ValidationError as exc:
            raise ConfigError(_explain(exc)) from exc
        except SettingsError as exc:  # a complex setting (a JSON object) that does not parse
            raise ConfigError(_explain_unparsed(exc)) from exc
        explicit = {f for f in cls.model_fields if f"RUNJOURNAL_{f.upper()}" in os.environ or f in overrides}
        fill: dict[str, Any] = {}
        if "kafka_properties" not in overrides:
            fill.update(_passthrough(base, explicit))
        kafka_given = "bootstrap" in explicit or "bootstrap" in fill
        fill.update(_from_stack_state(base.stack_dir / STATE_FILE, explicit, with_kafka=not kafka_given,
                                      prefix=base.topic_prefix))
        settings = base.model_copy(update=fill) if fill else base
        _check_kafka_security(settings)
        _check_redis_security(settings)
        return settings

    # -- derived names -----------------------------------------------------------------
    @property
    def events_topic(self) -> str:
        """``{prefix}.events``: the compacted journal topic."""
        return f"{self.topic_prefix}.events"

    @property
    def schemas_topic(self) -> str:
        """``{prefix}.schemas``: compacted, writer schemas keyed by fingerprint (``runjournal.schemas.catalog``)."""
        return f"{self.topic_prefix}.schemas"

    @property
    def critical_types(self) -> frozenset[str]:
        """:attr:`critical_event_types` as a set of symbols (``{"*"}`` means every unknown type)."""
        return frozenset(t.strip().upper() for t in self.critical_event_types.split(",") if t.strip())

    @property
    def events_dlq_topic(self) -> str:
        """``{prefix}.events.dlq``: quarantined undecodable events, with their source offset."""
        return f"{self.topic_prefix}.events.dlq"

    @property
    def memory_dlq_topic(self) -> str:
        """``{prefix}.memory.dlq``: memory items that could not be written to Qdrant."""
        return f"{self.topic_prefix}.memory.dlq"

    @property
    def checkpoints_topic(self) -> str:
        """``{prefix}.checkpoints``: the framework adapters' records (LangGraph checkpoints, Agents SDK sessions),
        compacted, written in the journal's transaction (``runjournal.adapters``)."""
        return f"{self.topic_prefix}.checkpoints"

    @property
    def payloads_topic(self) -> str:
        """``{prefix}.payloads``: large tool results cut into records (``runjournal.producers.results``), compacted,
        written in the journal's transactions on the run's partition; as many partitions as the events topic."""
        return f"{self.topic_prefix}.payloads"

    @property
    def streams_topic(self) -> str:
        """``{prefix}.streams``: runs' streamed partial output (``run.stream()``), ``cleanup.policy=delete`` with
        ``streams_retention_ms``, keyed and partitioned by run like the events; never read by recovery or the
        projector (``runjournal.producers.streams``)."""
        return f"{self.topic_prefix}.streams"

    @property
    def all_topics(self) -> tuple[str, ...]:
        """Every topic runjournal keeps under this prefix: events, its DLQ, the memory DLQ, the schemas topic and
        the adapters' checkpoints topic, the large results' payloads topic and the streams topic. The one list that
        creation, ``topics describe`` and cleanup (demo, bench, tests) share."""
        return (self.events_topic, self.events_dlq_topic, self.memory_dlq_topic, self.schemas_topic,
                self.checkpoints_topic, self.payloads_topic, self.streams_topic)

    @property
    def effective_archive_url(self) -> str:
        """The archive actually used: :attr:`archive_url`, or ``file://<stack_dir>/archive``."""
        return self.archive_url or (self.stack_dir / "archive").absolute().as_uri()

    @property
    def effective_keys_dir(self) -> Path:
        """The local key directory actually used (``keys_dir`` or ``<stack_dir>/keys``)."""
        return self.keys_dir or (self.stack_dir / "keys")

    @property
    def effective_qdrant_path(self) -> Path:
        """The embedded Qdrant directory actually used (``qdrant_path`` or ``<stack_dir>/qdrant``)."""
        return self.qdrant_path or (self.stack_dir / "qdrant")

    def masked(self) -> dict[str, Any]:
        """All settings as a JSON-able dict with secrets masked (for logs and ``--json`` output)."""
        out = self.model_dump(mode="json")
        out["redis_url"] = mask_url(self.redis_url)
        out["qdrant_url"] = mask_url(self.qdrant_url)
        out["schema_registry_url"] = mask_url(self.schema_registry_url)
        out["object_store_endpoint"] = mask_url(self.object_store_endpoint)
        for name in ("qdrant_api_key", "kafka_sasl_password", "kafka_ssl_key_password", "redis_password",
                     "console_operator_token", "object_store_secret"):
            out[name] = "***" if getattr(self, name) else None
        out["kafka_properties"] = {k: "***" if _kafka_props.is_secret(k) else v.get_secret_value()
                                   for k, v in sorted(self.kafka_properties.items())}
        return out

    def as_env(self) -> dict[str, str]:
        """``RUNJOURNAL_*`` variables that make ``Settings.load()`` in a child process give these settings back —
        Kafka security and pass-through properties included (secrets revealed: for a child's environment only).

        Every environment handed to a child process (demo fleet, bench, tests) is built from this, so a
        child never connects with less than its parent (e.g. plaintext to a SASL_SSL listener).
        """
        env: dict[str, str] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            # the console's operator token stays with the console: no child process needs it
            if name in ("kafka_properties", "kafka_properties_file", "console_operator_token") or value is None:
                continue
            env[f"RUNJOURNAL_{name.upper()}"] = (value.get_secret_value() if isinstance(value, SecretStr)
                                                 else json.dumps(value) if isinstance(value, dict | list)
                                                 else str(value))
        env["RUNJOURNAL_QDRANT_PATH"] = str(self.effective_qdrant_path)
        for key, secret in self.kafka_properties.items():
            env[_kafka_props.env_name(key)] = secret.get_secret_value()
        return env

    def kafka_security_config(self) -> dict[str, str]:
        """The librdkafka properties these settings add to every client: the typed security settings, then
        the pass-through properties (secrets revealed — for :mod:`runjournal.core.kafka` only)."""
        out: dict[str, str] = {}
        for field_name, key in _kafka_props.TYPED_KEYS.items():
            value = getattr(self, field_name)
            if value is not None:
                out[key] = value.get_secret_value() if isinstance(value, SecretStr) else str(value)
        out.update({k: v.get_secret_value() for k, v in self.kafka_properties.items()})
        return out

    def __repr__(self) -> str:
        return f"Settings({self.masked()!r})"

    __str__ = __repr__


def _passthrough(base: Settings, explicit: set[str]) -> dict[str, Any]:
    """``kafka_properties`` (file, then ``RUNJOURNAL_LIBRDKAFKA_*``) and a bootstrap the file may carry."""
    file_props = _kafka_props.read_properties_file(base.kafka_properties_file) if base.kafka_properties_file else {}
    env_props = _kafka_props.env_properties(os.environ)
    if not file_props and not env_props:
        return {}
    fill: dict[str, Any] = {}
    file_bootstrap = _kafka_props.take_bootstrap(file_props, env_props)  # a managed Kafka's file names its cluster
    if file_bootstrap and "bootstrap" not in explicit:
        fill["bootstrap"] = file_bootstrap
    typed = {key: f"RUNJOURNAL_{name.upper()}" for name, key in _kafka_props.TYPED_KEYS.items()
             if getattr(base, name) is not None}
    merged = _kafka_props.merge(file_props, env_props, typed)
    sources = {k: src for k, (_v, src) in {**file_props, **env_props}.items()}
    _kafka_props.check_with_librdkafka(merged, sources)
    fill["kafka_properties"] = {k: SecretStr(v) for k, v in merged.items()}
    return fill


def _from_stack_state(path: Path, explicit: set[str], *, with_kafka: bool,
                      prefix: str = "runjournal") -> dict[str, Any]:
    """Endpoints from the local stack's state file, and — with its bootstrap — its replication factor and,
    for a secure stack, its security settings and the operator's credentials (unless given)."""
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    fill: dict[str, Any] = {}
    if "redis_url" not in explicit and (url := state.get("redis", {}).get("url")):
        fill["redis_url"] = url
        fill.update(_redis_security_from_state(state["redis"], explicit))
    registry = state.get("registry", {})
    pid = (registry.get("process") or {}).get("pid")
    if "schema_registry_url" not in explicit and pid and registry.get("url") and Path(f"/proc/{pid}").exists():
        fill["schema_registry_url"] = registry["url"]  # while `stack up --registry` runs it
    fill.update(_object_store_from_state(state.get("object_store", {}), explicit, prefix))
    kafka_state = state.get("kafka", {})
    if not with_kafka or not (bs := kafka_state.get("bootstrap")):
        return fill
    fill["bootstrap"] = bs
    if "replication_factor" not in explicit:
        fill["replication_factor"] = min(3, int(kafka_state.get("brokers", 1)))
    security = kafka_state.get("security") or {}
    for name in ("kafka_security_protocol", "kafka_sasl_mechanism", "kafka_ssl_ca_location"):
        if name not in explicit and security.get(name):
            fill[name] = Path(security[name]) if name.endswith("_location") else security[name]
    if not explicit & {"kafka_sasl_username", "kafka_sasl_password"} and (login := _stack_login(security)):
        fill.update(kafka_sasl_username=login[0], kafka_sasl_password=login[1])
    return fill


def _object_store_from_state(entry: dict[str, Any], explicit: set[str], prefix: str) -> dict[str, Any]:
    """While ``stack up --object-store`` runs it: its endpoint, keys and the archive under its bucket — the keys only
    with its endpoint (never mixed into another store's settings)."""
    pid = (entry.get("process") or {}).get("pid")
    if not (pid and entry.get("url") and Path(f"/proc/{pid}").exists()):
        return {}
    fill: dict[str, Any] = {}
    if "object_store_endpoint" not in explicit:
        fill["object_store_endpoint"] = entry["url"]
        if not explicit & {"object_store_key", "object_store_secret"} and entry.get("identity"):
            fill.update(object_store_key=entry["identity"], object_store_secret=SecretStr(entry["credential"]))
    if "archive_url" not in explicit and "object_store_endpoint" not in explicit and entry.get("bucket"):
        fill["archive_url"] = f"s3://{entry['bucket']}/{prefix}"
    return fill


def _stack_login(security: dict[str, Any]) -> tuple[str, SecretStr] | None:
    """A secure stack's default user (the operator) and its password from the stack's users file; None when
    the file is missing, unreadable or has no such user."""
    if not security.get("users_file"):
        return None
    user = security.get("default_user", "operator")
    try:
        password = json.loads(Path(security["users_file"]).read_text())[user]
    except (OSError, ValueError, KeyError):
        return None
    return (user, SecretStr(password)) if password else None


def _redis_security_from_state(entry: dict[str, Any], explicit: set[str]) -> dict[str, Any]:
    """A secure stack's Redis CA and its default user's credentials (the operator), unless given."""
    security = entry.get("security") or {}
    fill: dict[str, Any] = {}
    if "redis_ssl_ca_location" not in explicit and security.get("ca"):
        fill["redis_ssl_ca_location"] = Path(security["ca"])
    if not explicit & {"redis_username", "redis_password"} and (login := _stack_login(security)):
        fill.update(redis_username=login[0], redis_password=login[1])
    return fill


def _check_redis_security(s: Settings) -> None:
    """TLS files need a ``rediss`` URL; mutual TLS needs both files; each file must exist (errors name the variable)."""
    target = parse_redis_url(s.redis_url)
    files = [n for n in ("redis_ssl_ca_location", "redis_ssl_certificate_location", "redis_ssl_key_location")
             if getattr(s, n) is not None]
    if files and not target.tls:
        raise ConfigError(f"Redis TLS files are set ({', '.join(f'RUNJOURNAL_{n.upper()}' for n in files)}) but "
                          "RUNJOURNAL_REDIS_URL is not TLS: use rediss:// (or rediss+cluster://)")
    if (s.redis_ssl_certificate_location is None) != (s.redis_ssl_key_location is None):
        raise ConfigError("Redis mutual TLS needs both RUNJOURNAL_REDIS_SSL_CERTIFICATE_LOCATION and "
                          "RUNJOURNAL_REDIS_SSL_KEY_LOCATION")
    for name in files:
        if not getattr(s, name).is_file():
            raise ConfigError(f"RUNJOURNAL_{name.upper()}: {getattr(s, name)} is not a readable file")


def _check_kafka_security(s: Settings) -> None:
    """Refuse combinations librdkafka would reject late or obscurely (each error names the variable to fix)."""
    props = s.kafka_security_config()
    protocol = props.get("security.protocol", "PLAINTEXT").upper()
    mechanism = props.get("sasl.mechanism", props.get("sasl.mechanisms"))
    if protocol.startswith("SASL_") and not mechanism:
        raise ConfigError(f"security protocol {protocol} needs RUNJOURNAL_KAFKA_SASL_MECHANISM "
                          "(PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER)")
    if mechanism and not protocol.startswith("SASL_"):
        raise ConfigError(f"RUNJOURNAL_KAFKA_SASL_MECHANISM={mechanism} needs RUNJOURNAL_KAFKA_SECURITY_PROTOCOL="
                          "SASL_SSL (or SASL_PLAINTEXT)")
    has_user, has_password = "sasl.username" in props, "sasl.password" in props
    if mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512") and not (has_user and has_password):
        raise ConfigError(f"SASL mechanism {mechanism} needs RUNJOURNAL_KAFKA_SASL_USERNAME and "
                          "RUNJOURNAL_KAFKA_SASL_PASSWORD")
    if mechanism == "OAUTHBEARER" and (has_user or has_password):
        raise ConfigError("SASL mechanism OAUTHBEARER takes no username/password: pass sasl.oauthbearer.* "
                          "properties (e.g. RUNJOURNAL_LIBRDKAFKA_SASL_OAUTHBEARER_METHOD=oidc)")
    tls = [k for k in ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location") if k in props]
    if tls and protocol not in ("SSL", "SASL_SSL"):
        raise ConfigError(f"TLS files are set ({', '.join(tls)}) but the security protocol is {protocol}: "
                          "set RUNJOURNAL_KAFKA_SECURITY_PROTOCOL=SSL or SASL_SSL")
    if ("ssl.certificate.location" in props) != ("ssl.key.location" in props):
        raise ConfigError("mutual TLS needs both RUNJOURNAL_KAFKA_SSL_CERTIFICATE_LOCATION and "
                          "RUNJOURNAL_KAFKA_SSL_KEY_LOCATION")
    for name in ("kafka_ssl_ca_location", "kafka_ssl_certificate_location", "kafka_ssl_key_location"):
        path = getattr(s, name)
        if path is not None and not path.is_file():
            raise ConfigError(f"RUNJOURNAL_{name.upper()}: {path} is not a readable file")


_UNPARSED = re.compile(r'field "(?P<field>[a-z0-9_]+)"')


def _explain_unparsed(exc: SettingsError) -> str:
    """pydantic-settings' "error parsing value for field …" as the variable, the JSON error and the fix (the value
    itself is not echoed: it may hold a secret)."""
    found = _UNPARSED.search(str(exc))
    name = f"RUNJOURNAL_{found['field'].upper()}" if found else "a RUNJOURNAL_* variable"
    cause = f" ({exc.__cause__})" if exc.__cause__ is not None else ""
    return (f"{name}: not valid JSON{cause}; give a JSON object, e.g. {name}='{{\"key\": \"value\"}}' "
            f"(docs/reference/settings.md)")


def _explain(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        name = "_".join(str(p) for p in err.get("loc", ())) or "?"
        parts.append(f"RUNJOURNAL_{name.upper()}: {err.get('msg')}")
    return "invalid settings: " + "; ".join(parts)
