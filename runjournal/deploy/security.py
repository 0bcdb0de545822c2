"""The secure local cluster's security: a CA and broker certificate (the JDK's keytool), SCRAM users, broker config.

Recipe: ``../shared/notes/kafka-cluster-and-security.md`` (Kafka 4.2.0, Java 17). At ``stack up --secure``:

1. :func:`make_pki` — keytool (from the JRE the broker already needs) makes a CA (``bc:c``), one broker key
   pair (``CN=localhost``, ``SAN=dns:localhost,ip:127.0.0.1``) signed by it with ``serverAuth`` and
   ``clientAuth``, a PKCS12 keystore and truststore, and the CA as PEM for clients (``ssl.ca.location``).
   Store passwords are random, kept in ``secrets.json`` (mode 0600) beside them.
2. :func:`make_users` — a random password per SCRAM user: ``admin`` (the brokers' own inter-broker identity
   and the ACL administrator) and one user per role of ``runjournal.deploy.acls.ROLES``. Created at storage
   format time (``StorageTool format --add-scram``), so they exist before the first broker starts.
3. :func:`broker_properties` — listeners: ``SASL_SSL`` for clients and between brokers (SCRAM-SHA-512), and
   the controller listener on **mutual TLS** (``listener.name.controller.ssl.client.auth=required``): with a
   PLAINTEXT controller listener a broker cannot register under the authorizer, and the usual "fix"
   (``User:ANONYMOUS`` as a super user) lets anyone who reaches the controller port write ACLs. The brokers'
   certificate principal ``User:CN=localhost`` and ``User:admin`` are the only super users;
   ``allow.everyone.if.no.acl.found=false``; the standard KRaft authorizer. Clients authenticate with
   SASL only (``ssl.client.auth=none`` on the client listener).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path

from runjournal.deploy.errors import StackError

__all__ = ["ADMIN_USER", "BROKER_PRINCIPAL", "MECHANISM", "Pki", "broker_properties", "make_pki", "make_users",
           "scram_format_args"]

ADMIN_USER = "admin"
"""The brokers' inter-broker SASL identity; a super user (creates the roles' ACLs)."""
BROKER_PRINCIPAL = "User:CN=localhost"
"""The brokers' certificate principal on the mutual-TLS controller listener; a super user."""
MECHANISM = "SCRAM-SHA-512"
"""The SASL mechanism of the secure stack."""
_DNAME_CA = "CN=runjournal local CA,O=runjournal"
_SAN = "SAN=dns:localhost,ip:127.0.0.1"


@dataclass(frozen=True)
class Pki:
    """Where the secure stack's key material is (``<stack>/kafka/pki``)."""

    directory: Path
    """The folder (mode 0700)."""
    store_password: str
    """Password of the PKCS12 stores and keys (random per stack)."""

    @property
    def ca_pem(self) -> Path:
        """The CA certificate, PEM — the clients' ``ssl.ca.location``."""
        return self.directory / "ca.pem"

    @property
    def ca_store(self) -> Path:
        """The CA's key pair, PKCS12 (signs the broker certificate; tests sign client certificates with it)."""
        return self.directory / "ca.p12"

    @property
    def keystore(self) -> Path:
        """The brokers' key pair and chain, PKCS12."""
        return self.directory / "broker.p12"

    @property
    def truststore(self) -> Path:
        """The CA as a trusted entry, PKCS12 (the brokers' truststore)."""
        return self.directory / "truststore.p12"


def _keytool(keytool: str, *args: str) -> None:
    proc = subprocess.run([keytool, *args], capture_output=True, text=True, timeout=120, check=False)  # noqa: S603
    if proc.returncode != 0:
        raise StackError(f"keytool {args[0]} failed (rc={proc.returncode}): {proc.stdout}{proc.stderr}")


def make_pki(directory: Path, keytool: str) -> Pki:
    """Create the CA, the broker certificate and the stores once; reuse them when ``secrets.json`` exists.

    Args:
        directory: ``<stack>/kafka/pki`` (created with mode 0700).
        keytool: path of the JDK's ``keytool``.

    Raises:
        StackError: a keytool step failed (its output is in the message).
    """
    secrets_file = directory / "secrets.json"
    if secrets_file.exists():
        return Pki(directory, json.loads(secrets_file.read_text())["store_password"])
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    pki = Pki(directory, secrets.token_urlsafe(18))
    pw = ["-storepass", pki.store_password, "-keypass", pki.store_password]
    common = ["-keyalg", "RSA", "-keysize", "2048", "-validity", "3650", "-storetype", "PKCS12"]
    csr, crt = directory / "broker.csr", directory / "broker.crt"
    _keytool(keytool, "-genkeypair", "-alias", "ca", "-dname", _DNAME_CA, "-ext", "bc:c", *common,
             "-keystore", str(pki.ca_store), *pw)
    _keytool(keytool, "-exportcert", "-rfc", "-alias", "ca", "-keystore", str(pki.ca_store), "-storepass",
             pki.store_password, "-file", str(pki.ca_pem))
    _keytool(keytool, "-genkeypair", "-alias", "broker", "-dname", "CN=localhost", "-ext", _SAN, *common,
             "-keystore", str(pki.keystore), *pw)
    _keytool(keytool, "-certreq", "-alias", "broker", "-keystore", str(pki.keystore), "-storepass",
             pki.store_password, "-file", str(csr))
    _keytool(keytool, "-gencert", "-alias", "ca", "-keystore", str(pki.ca_store), "-storepass", pki.store_password,
             "-infile", str(csr), "-outfile", str(crt), "-rfc", "-validity", "3650", "-ext", _SAN,
             "-ext", "KU=digitalSignature,keyEncipherment", "-ext", "EKU=serverAuth,clientAuth")
    for store, alias, cert in ((pki.keystore, "ca", pki.ca_pem), (pki.keystore, "broker", crt),
                               (pki.truststore, "ca", pki.ca_pem)):
        _keytool(keytool, "-importcert", "-noprompt", "-alias", alias, "-file", str(cert), "-keystore", str(store),
                 "-storetype", "PKCS12", "-storepass", pki.store_password)
    _write_private(secrets_file, {"store_password": pki.store_password})
    return pki


def make_users(path: Path, roles: list[str]) -> dict[str, str]:
    """``{user: password}`` for ``admin`` and each role, random, kept in ``path`` (mode 0600); reused if present."""
    if path.exists():
        users: dict[str, str] = json.loads(path.read_text())
        return users
    users = {name: secrets.token_urlsafe(18) for name in [ADMIN_USER, *roles]}
    _write_private(path, users)
    return users


def _write_private(path: Path, data: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(data, out, indent=2)


def scram_format_args(users: dict[str, str]) -> list[str]:
    """``--add-scram`` arguments of ``StorageTool format``: one SCRAM-SHA-512 credential per user."""
    out: list[str] = []
    for name, password in sorted(users.items()):
        out += ["--add-scram", f"{MECHANISM}=[name={name},password={password}]"]
    return out


def broker_properties(pki: Pki, admin_password: str, *, port: int, controller_port: int) -> dict[str, str]:
    """The security part of one node's ``server.properties`` (see the module docstring, step 3)."""
    jaas = (f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{ADMIN_USER}" '
            f'password="{admin_password}";')
    return {
        "listeners": f"SASL_SSL://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"SASL_SSL://127.0.0.1:{port}",
        "listener.security.protocol.map": "CONTROLLER:SSL,SASL_SSL:SASL_SSL",
        "inter.broker.listener.name": "SASL_SSL",
        "sasl.enabled.mechanisms": MECHANISM,
        "sasl.mechanism.inter.broker.protocol": MECHANISM,
        f"listener.name.sasl_ssl.{MECHANISM.lower()}.sasl.jaas.config": jaas,
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": str(pki.keystore),
        "ssl.keystore.password": pki.store_password,
        "ssl.key.password": pki.store_password,
        "ssl.truststore.type": "PKCS12",
        "ssl.truststore.location": str(pki.truststore),
        "ssl.truststore.password": pki.store_password,
        "ssl.client.auth": "none",
        "listener.name.controller.ssl.client.auth": "required",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": f"User:{ADMIN_USER};{BROKER_PRINCIPAL}",
        "allow.everyone.if.no.acl.found": "false",
    }
