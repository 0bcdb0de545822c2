"""Kafka connection settings beyond ``bootstrap.servers``: security, and pass-through librdkafka properties.

Read by :mod:`runjournal.core.settings` (at load) and applied by :mod:`runjournal.core.kafka` (per client).

* **Typed settings** — ``RUNJOURNAL_KAFKA_SECURITY_PROTOCOL``, ``…_SASL_MECHANISM``, ``…_SASL_USERNAME``,
  ``…_SASL_PASSWORD``, ``…_SSL_CA_LOCATION``, ``…_SSL_CERTIFICATE_LOCATION``, ``…_SSL_KEY_LOCATION``,
  ``…_SSL_KEY_PASSWORD`` map one to one onto librdkafka's ``security.protocol``, ``sasl.mechanism`` … keys
  (:data:`TYPED_KEYS`).
* **Pass-through** — any other librdkafka property (librdkafka's CONFIGURATION.md), from a Java-style
  ``.properties`` file (``RUNJOURNAL_KAFKA_PROPERTIES_FILE``: ``key=value`` lines, ``#`` comments — the
  client file a managed Kafka hands out) and from ``RUNJOURNAL_LIBRDKAFKA_<NAME>`` variables (``<NAME>``
  upper-cased with ``.`` written as ``_``: ``RUNJOURNAL_LIBRDKAFKA_SOCKET_KEEPALIVE_ENABLE=true`` →
  ``socket.keepalive.enable``; librdkafka's property names hold no ``_``). Variables win over the file.
  OAUTHBEARER's ``sasl.oauthbearer.*`` properties (``method=oidc``, client id/secret, token endpoint)
  come this way.
* **Refused**: a pass-through key runjournal's correctness rests on (:data:`PROTECTED`: acks, idempotence,
  transactions, isolation, group and offset handling, callbacks), Java-only keys (``sasl.jaas.config``),
  and a key set both by a typed setting and by pass-through. Names and values are checked by librdkafka
  itself at load (:func:`check_with_librdkafka`), so a typo fails at start with its source named.
"""

from __future__ import annotations

import configparser
import logging
import re
from collections.abc import Mapping
from pathlib import Path

from runjournal.core.errors import ConfigError

__all__ = ["ENV_PREFIX", "PROTECTED", "TYPED_KEYS", "check_with_librdkafka", "env_name", "env_properties",
           "is_secret", "merge", "read_properties_file", "take_bootstrap"]

#: Environment variables with this prefix are pass-through librdkafka properties.
ENV_PREFIX = "RUNJOURNAL_LIBRDKAFKA_"

#: Settings field → the librdkafka property it sets.
TYPED_KEYS: dict[str, str] = {
    "kafka_security_protocol": "security.protocol",
    "kafka_sasl_mechanism": "sasl.mechanism",
    "kafka_sasl_username": "sasl.username",
    "kafka_sasl_password": "sasl.password",
    "kafka_ssl_ca_location": "ssl.ca.location",
    "kafka_ssl_certificate_location": "ssl.certificate.location",
    "kafka_ssl_key_location": "ssl.key.location",
    "kafka_ssl_key_password": "ssl.key.password",
}
_ALIASES = {"sasl.mechanisms": "sasl.mechanism"}

_CORRECTNESS = "runjournal sets it per client; the journal's guarantees rest on it"
#: Pass-through keys refused at load, with the reason shown in the error.
PROTECTED: dict[str, str] = {
    **{k: "set RUNJOURNAL_BOOTSTRAP instead" for k in ("metadata.broker.list",)},
    **{k: _CORRECTNESS for k in (
        "acks", "request.required.acks", "enable.idempotence", "transactional.id", "isolation.level",
        "enable.auto.commit", "auto.commit.enable", "enable.auto.offset.store", "group.id", "group.instance.id",
        "auto.offset.reset", "partitioner", "allow.auto.create.topics", "enable.gapless.guarantee")},
    "sasl.jaas.config": "a Java client property; librdkafka takes sasl.username and sasl.password",
    "client.dns.lookup": "a Java client property; librdkafka has no equivalent (drop it)",
}

_SECRET = re.compile(r"password|secret|\.pem$|jaas|token|credential|keytab|oauthbearer\.config", re.I)


def is_secret(key: str) -> bool:
    """True when librdkafka property ``key`` holds a secret (masked in ``runjournal settings``)."""
    return bool(_SECRET.search(key))


def env_name(key: str) -> str:
    """The variable of librdkafka property ``key``: ``sasl.oauthbearer.client.id`` →
    ``RUNJOURNAL_LIBRDKAFKA_SASL_OAUTHBEARER_CLIENT_ID``."""
    return ENV_PREFIX + key.replace(".", "_").upper()


def env_properties(environ: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """Pass-through properties from ``RUNJOURNAL_LIBRDKAFKA_*`` variables: ``{key: (value, variable)}``."""
    out: dict[str, tuple[str, str]] = {}
    for name, value in environ.items():
        if name.startswith(ENV_PREFIX) and len(name) > len(ENV_PREFIX):
            out[name[len(ENV_PREFIX):].lower().replace("_", ".")] = (value, name)
    return out


def read_properties_file(path: Path) -> dict[str, tuple[str, str]]:
    """``key=value`` (or ``key: value``) lines of a Java-style properties file: ``{key: (value, "path:key")}``.

    Raises:
        ConfigError: the file is missing or unreadable (names ``RUNJOURNAL_KAFKA_PROPERTIES_FILE``).
    """
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"RUNJOURNAL_KAFKA_PROPERTIES_FILE: cannot read {path}: {exc.strerror}") from exc
    parser = configparser.ConfigParser(interpolation=None, delimiters=("=", ":"), comment_prefixes=("#", "!"),
                                       strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keep keys as written
    try:
        parser.read_string("[properties]\n" + text, source=str(path))
    except configparser.Error as exc:
        raise ConfigError(f"RUNJOURNAL_KAFKA_PROPERTIES_FILE: {path} is not a key=value file: {exc}") from exc
    return {k.strip(): (v.strip(), f"{path}:{k.strip()}") for k, v in parser["properties"].items()}


def take_bootstrap(file_props: dict[str, tuple[str, str]], env_props: dict[str, tuple[str, str]]) -> str | None:
    """Remove and return the file's bootstrap servers (it becomes the bootstrap unless RUNJOURNAL_BOOTSTRAP is set).

    Raises:
        ConfigError: a ``RUNJOURNAL_LIBRDKAFKA_BOOTSTRAP_SERVERS`` variable (RUNJOURNAL_BOOTSTRAP is the one place).
    """
    key = "bootstrap.servers"
    if key in env_props:
        raise ConfigError(f"{env_props[key][1]}: set RUNJOURNAL_BOOTSTRAP instead")
    return file_props.pop(key)[0] if key in file_props else None


def merge(file_props: dict[str, tuple[str, str]], env_props: dict[str, tuple[str, str]],
          typed: Mapping[str, str]) -> dict[str, str]:
    """File, then variables on top; refuse protected keys and keys a typed setting also sets.

    Args:
        file_props / env_props: ``{key: (value, source)}`` from the two pass-through sources.
        typed: ``{librdkafka key: settings variable}`` of the typed settings that are set.

    Raises:
        ConfigError: a protected key, or a key set twice (both sources named).
    """
    merged: dict[str, tuple[str, str]] = {}
    for key, (value, source) in [*file_props.items(), *env_props.items()]:
        canon = _ALIASES.get(key, key)
        if canon in PROTECTED:
            raise ConfigError(f"{source}: librdkafka property {key!r} cannot be passed through ({PROTECTED[canon]})")
        if canon in typed:
            raise ConfigError(f"{source} sets {key!r}, which {typed[canon]} also sets; set it once")
        merged[canon] = (value, source)
    return {k: v for k, (v, _src) in merged.items()}


def check_with_librdkafka(config: Mapping[str, str], sources: Mapping[str, str]) -> None:
    """Let librdkafka itself validate names and values (it builds and drops a client, no connection).

    Raises:
        ConfigError: librdkafka refused a property; the message names where it came from.
    """
    from confluent_kafka import KafkaException, Producer

    silent = logging.getLogger("runjournal.kafka.config-check")
    silent.propagate = False  # the throw-away client's own lines (e.g. with debug=…) are not the app's
    try:
        Producer({**config, "log_level": 0, "logger": silent})
    except (KafkaException, ValueError, TypeError) as exc:
        text = str(exc.args[0] if exc.args else exc)
        culprit = next((src for key, src in sources.items() if key in text), "the Kafka settings")
        raise ConfigError(f"{culprit}: librdkafka refused the configuration: {text}") from exc
