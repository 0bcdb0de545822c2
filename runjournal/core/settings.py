"""One frozen settings object, read from ``RUNJOURNAL_*`` environment variables.

Precedence: environment variable > the running local stack's state file (written by
``runjournal stack up``) > built-in default. So after ``runjournal stack up`` every
other command finds the broker and Redis without any variable set.

Variables (each field of :class:`Settings`, upper-cased, with the ``RUNJOURNAL_`` prefix; the
README's Settings table lists meanings and defaults): ``BOOTSTRAP``, ``REDIS_URL``,
``QDRANT_PATH``, ``QDRANT_URL``, ``QDRANT_API_KEY``, ``SCHEMA_REGISTRY_URL``, ``TOPIC_PREFIX``,
``STACK_DIR``, ``CACHE_DIR``, ``PARTITIONS``, ``LOG_LEVEL``, ``CONSOLE_OPERATOR_TOKEN``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from runjournal.core.errors import ConfigError

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
    """Redis URL; may carry a password (masked by :meth:`masked`)."""
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
    stack_dir: Path = Field(default_factory=default_stack_dir)
    """Local stack directory (data, logs, ``stack.json``)."""
    cache_dir: Path = Field(default_factory=default_cache_dir)
    """Cache of Maven-resolved broker jars."""
    partitions: int = Field(default=6, ge=1, le=10_000)
    """Partition count for ``topics create`` (fixed at creation: the run-to-partition map depends on it)."""
    log_level: str | None = None
    """Log level of every command (DEBUG … CRITICAL); None: INFO for services, WARNING otherwise."""
    console_operator_token: SecretStr | None = None
    """``runjournal console``: operators who sign in with this token may approve and deny; unset: read-only."""

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, v: str | None) -> str | None:
        if v is not None and v.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ValueError("must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL")
        return v.upper() if v else None

    @field_validator("topic_prefix")
    @classmethod
    def _legal_topic(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,200}", v):
            raise ValueError("topic prefix may hold only letters, digits, '.', '_' and '-'")
        return v

    @classmethod
    def load(cls, **overrides: Any) -> Settings:
        """Read the environment, fill unset endpoints from the local stack's state file, apply overrides.

        Raises:
            ConfigError: an invalid or unknown ``RUNJOURNAL_*`` variable (named in the message).
        """
        known = {f"RUNJOURNAL_{name.upper()}" for name in cls.model_fields}
        unknown = sorted(k for k in os.environ if k.startswith("RUNJOURNAL_") and k not in known)
        if unknown:
            raise ConfigError(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        try:
            base = cls(**overrides)
        except ValidationError as exc:
            raise ConfigError(_explain(exc)) from exc
        state_path = base.stack_dir / STATE_FILE
        fill: dict[str, Any] = {}
        if state_path.exists():
            try:
                state = json.loads(state_path.read_text())
            except (OSError, ValueError):
                state = {}
            if "RUNJOURNAL_BOOTSTRAP" not in os.environ and "bootstrap" not in overrides:
                if bs := state.get("kafka", {}).get("bootstrap"):
                    fill["bootstrap"] = bs
            if "RUNJOURNAL_REDIS_URL" not in os.environ and "redis_url" not in overrides:
                if url := state.get("redis", {}).get("url"):
                    fill["redis_url"] = url
            if "RUNJOURNAL_SCHEMA_REGISTRY_URL" not in os.environ and "schema_registry_url" not in overrides:
                registry = state.get("registry", {})
                pid = (registry.get("process") or {}).get("pid")
                if pid and registry.get("url") and Path(f"/proc/{pid}").exists():  # while `stack up --registry` runs it
                    fill["schema_registry_url"] = registry["url"]
        return base.model_copy(update=fill) if fill else base

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
    def effective_qdrant_path(self) -> Path:
        """The embedded Qdrant directory actually used (``qdrant_path`` or ``<stack_dir>/qdrant``)."""
        return self.qdrant_path or (self.stack_dir / "qdrant")

    def masked(self) -> dict[str, Any]:
        """All settings as a JSON-able dict with secrets masked (for logs and ``--json`` output)."""
        out = self.model_dump(mode="json")
        out["redis_url"] = mask_url(self.redis_url)
        out["qdrant_url"] = mask_url(self.qdrant_url)
        out["schema_registry_url"] = mask_url(self.schema_registry_url)
        out["qdrant_api_key"] = "***" if self.qdrant_api_key else None
        out["console_operator_token"] = "***" if self.console_operator_token else None
        return out

    def __repr__(self) -> str:
        return f"Settings({self.masked()!r})"

    __str__ = __repr__


def _explain(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        name = "_".join(str(p) for p in err.get("loc", ())) or "?"
        parts.append(f"RUNJOURNAL_{name.upper()}: {err.get('msg')}")
    return "invalid settings: " + "; ".join(parts)
