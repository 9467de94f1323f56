"""One Kafka connection configuration for every client obshub creates.

:class:`KafkaConnection` says how to reach the cluster: bootstrap servers, client id and the security
settings (``security.protocol``, SASL mechanism / user / password, TLS CA / certificate / key). One
function per client kind turns it into that client's configuration:

==========================  ==========================================================================
:func:`producer_config`     confluent-kafka ``Producer`` dict
:func:`consumer_config`     confluent-kafka ``Consumer`` dict (a group id is required)
:func:`admin_config`        confluent-kafka ``AdminClient`` dict
:func:`faust_kwargs`        keyword arguments of ``faust.App`` (broker URLs, credentials)
:func:`aiokafka_kwargs`     keyword arguments of aiokafka clients
==========================  ==========================================================================

Each takes ``extra``: librdkafka settings of that one client (``group.id`` style keys), applied last.
Secrets are ``SecretStr``: they never appear in ``repr``, logs or error messages; only these functions
reveal them, to hand them to the client library.

Security settings not given explicitly come from the environment, so every client of every component
(agent, stream workers, rule engine, replay, export, tail, status, alerts, demo) reaches a secured
cluster with the same variables (also what the Helm chart sets): ``OBSHUB_KAFKA_SECURITY_PROTOCOL``
(PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL), ``OBSHUB_KAFKA_SASL_MECHANISM``, ``OBSHUB_KAFKA_SASL_USERNAME``,
``OBSHUB_KAFKA_SASL_PASSWORD``, ``OBSHUB_KAFKA_SSL_CA_LOCATION``, ``OBSHUB_KAFKA_SSL_CERTIFICATE_LOCATION``,
``OBSHUB_KAFKA_SSL_KEY_LOCATION``, ``OBSHUB_KAFKA_SSL_KEY_PASSWORD`` (``ENV``). :func:`connection` builds the connection of
:class:`obshub.core.settings.Settings`.
"""

from __future__ import annotations

import enum
import os
import ssl
from pathlib import Path
from typing import Any, Callable, Protocol

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from obshub.core.log import NullLogger


class _HasBootstrap(Protocol):
    """What :func:`connection` reads (``obshub.core.settings.Settings`` has it)."""

    @property
    def bootstrap_servers(self) -> str: ...


class SecurityProtocol(str, enum.Enum):
    """Kafka ``security.protocol`` values (librdkafka CONFIGURATION.md)."""

    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"


class SaslMechanism(str, enum.Enum):
    """Kafka ``sasl.mechanism`` values obshub supports."""

    PLAIN = "PLAIN"
    SCRAM_SHA_256 = "SCRAM-SHA-256"
    SCRAM_SHA_512 = "SCRAM-SHA-512"


#: field of KafkaConnection -> the environment variable that gives it when not set explicitly
ENV = {
    "security_protocol": "OBSHUB_KAFKA_SECURITY_PROTOCOL",
    "sasl_mechanism": "OBSHUB_KAFKA_SASL_MECHANISM",
    "sasl_username": "OBSHUB_KAFKA_SASL_USERNAME",
    "sasl_password": "OBSHUB_KAFKA_SASL_PASSWORD",
    "ssl_ca_location": "OBSHUB_KAFKA_SSL_CA_LOCATION",
    "ssl_certificate_location": "OBSHUB_KAFKA_SSL_CERTIFICATE_LOCATION",
    "ssl_key_location": "OBSHUB_KAFKA_SSL_KEY_LOCATION",
    "ssl_key_password": "OBSHUB_KAFKA_SSL_KEY_PASSWORD",
}


def _env(field: str) -> Callable[[], Any]:
    return lambda: os.environ.get(ENV[field]) or None


def _env_protocol() -> "SecurityProtocol":
    value = (os.environ.get(ENV["security_protocol"]) or "PLAINTEXT").upper()
    try:
        return SecurityProtocol(value)
    except ValueError:
        from obshub.core.errors import ConfigError

        raise ConfigError(
            f"{ENV['security_protocol']}={value!r} is not a Kafka security protocol",
            "use one of " + ", ".join(p.value for p in SecurityProtocol),
        ) from None


#: how bootstrap servers are written, for messages
BOOTSTRAP_FORM = "host:port (port 1-65535), several separated by commas, e.g. kafka-0:9092,kafka-1:9092"


def bootstrap_problem(bootstrap: str) -> str | None:
    """Why ``bootstrap`` (bootstrap servers: comma-separated ``host:port``, an IPv6 host in brackets,
    ``[::1]:9092``, an optional ``scheme://`` prefix as librdkafka takes it) is malformed, or None when it
    is well formed. Refused: an empty entry (``a:9092,``), a missing or non-numeric port, a port outside
    1-65535, an empty host, a blank inside an entry. Nothing is resolved or connected here: a client given
    ``127.0.0.1:99999`` waited its whole connect timeout to report "connection refused"."""
    if not bootstrap.strip():
        return "it is empty"
    for raw in bootstrap.split(","):
        entry = raw.strip()
        if not entry:
            return f"{bootstrap!r} has an empty address between commas"
        addr = entry.split("://", 1)[1] if "://" in entry else entry
        if any(c.isspace() for c in addr):
            return f"{entry!r} holds a blank"
        host, sep, port = addr.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        elif ":" in host:
            return f"{entry!r}: an IPv6 host is written in brackets, [::1]:9092"
        if not sep:
            return f"{entry!r} has no port"
        if not host:
            return f"{entry!r} has no host"
        if not port.isdigit():
            return f"{entry!r}: port {port!r} is not a number"
        if not 1 <= int(port) <= 65535:
            return f"{entry!r}: port {int(port)} is out of range (1-65535)"
    return None


def check_bootstrap(bootstrap: str, what: str = "bootstrap servers") -> str:
    """``bootstrap`` stripped when well formed (:func:`bootstrap_problem`); else ValueError naming ``what``
    gave it (``OBSHUB_BOOTSTRAP``, ``--bootstrap``), what is wrong and the form (:data:`BOOTSTRAP_FORM`)."""
    why = bootstrap_problem(bootstrap)
    if why is not None:
        raise ValueError(f"{what}: {why}; give {BOOTSTRAP_FORM}")
    return bootstrap.strip()


class KafkaConnection(BaseModel):
    """How a client reaches the cluster. ``bootstrap``: comma-separated ``host:port`` list.
    Validation (``pydantic.ValidationError``): bootstrap servers well formed (:func:`check_bootstrap`); a
    SASL protocol needs mechanism, user name and password; a TLS file that is given must exist."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    bootstrap: str = Field(min_length=1)
    client_id: str | None = None
    security_protocol: SecurityProtocol = Field(default_factory=_env_protocol)
    sasl_mechanism: SaslMechanism | None = Field(default_factory=_env("sasl_mechanism"))
    sasl_username: str | None = Field(default_factory=_env("sasl_username"))
    sasl_password: SecretStr | None = Field(default_factory=_env("sasl_password"))
    ssl_ca_location: Path | None = Field(default_factory=_env("ssl_ca_location"))
    ssl_certificate_location: Path | None = Field(default_factory=_env("ssl_certificate_location"))
    ssl_key_location: Path | None = Field(default_factory=_env("ssl_key_location"))
    ssl_key_password: SecretStr | None = Field(default_factory=_env("ssl_key_password"))

    @field_validator("bootstrap")
    @classmethod
    def _bootstrap_form(cls, v: str) -> str:
        return check_bootstrap(v)

    @model_validator(mode="after")
    def _security_complete(self) -> "KafkaConnection":
        if self.security_protocol in (SecurityProtocol.SASL_SSL, SecurityProtocol.SASL_PLAINTEXT):
            missing = [n for n in ("sasl_mechanism", "sasl_username", "sasl_password") if getattr(self, n) is None]
            if missing:
                raise ValueError(
                    f"security protocol {self.security_protocol.value} needs "
                    + ", ".join(f"{ENV[m]} (or --{m.replace('_', '-')})" for m in missing)
                )
        for name in ("ssl_ca_location", "ssl_certificate_location", "ssl_key_location"):
            p = getattr(self, name)
            if p is not None and not p.exists():
                raise ValueError(f"{ENV[name]} (--{name.replace('_', '-')}) {p} does not exist")
        return self

    def librdkafka_common(self) -> dict[str, Any]:
        """The settings every confluent-kafka client shares: bootstrap, client id, security (secrets
        revealed here)."""
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap, "security.protocol": self.security_protocol.value}
        if self.client_id is not None:
            conf["client.id"] = self.client_id
        if self.sasl_mechanism is not None:
            conf["sasl.mechanism"] = self.sasl_mechanism.value
        if self.sasl_username is not None:
            conf["sasl.username"] = self.sasl_username
        if self.sasl_password is not None:
            conf["sasl.password"] = self.sasl_password.get_secret_value()
        for name, key in (
            ("ssl_ca_location", "ssl.ca.location"),
            ("ssl_certificate_location", "ssl.certificate.location"),
            ("ssl_key_location", "ssl.key.location"),
        ):
            if getattr(self, name) is not None:
                conf[key] = str(getattr(self, name))
        if self.ssl_key_password is not None:
            conf["ssl.key.password"] = self.ssl_key_password.get_secret_value()
        return conf


def connection(settings: _HasBootstrap, client_id: str | None = None) -> KafkaConnection:
    """The connection to the cluster of ``settings`` (``OBSHUB_BOOTSTRAP``, else the local broker)."""
    return KafkaConnection(bootstrap=settings.bootstrap_servers, client_id=client_id)


def _with(conf: dict[str, Any], quiet: bool, extra: dict[str, Any] | None) -> dict[str, Any]:
    if quiet:
        conf["logger"] = NullLogger()
    conf.update(extra or {})
    return conf


def producer_config(
    conn: KafkaConnection, extra: dict[str, Any] | None = None, *, quiet: bool = False
) -> dict[str, Any]:
    """A confluent-kafka ``Producer`` configuration. ``quiet``: librdkafka's own log lines are dropped
    (failures still reach the caller through delivery reports and exceptions)."""
    return _with(conn.librdkafka_common(), quiet, extra)


def consumer_config(
    conn: KafkaConnection, group_id: str, extra: dict[str, Any] | None = None, *, quiet: bool = False
) -> dict[str, Any]:
    """A confluent-kafka ``Consumer`` configuration in consumer group ``group_id``."""
    conf = conn.librdkafka_common()
    conf["group.id"] = group_id
    return _with(conf, quiet, extra)


def admin_config(conn: KafkaConnection, extra: dict[str, Any] | None = None, *, quiet: bool = False) -> dict[str, Any]:
    """A confluent-kafka ``AdminClient`` configuration."""
    return _with(conn.librdkafka_common(), quiet, extra)


def broker_urls(conn: KafkaConnection) -> list[str]:
    """Faust broker URLs (``kafka://host:port`` per bootstrap server)."""
    return [f"kafka://{h.strip()}" for h in conn.bootstrap.split(",") if h.strip()]


def faust_kwargs(conn: KafkaConnection) -> dict[str, Any]:
    """Keyword arguments of ``faust.App`` that say where and how to connect: ``broker`` and, for a
    secured cluster, ``broker_credentials`` (SASL and/or an SSL context)."""
    kw: dict[str, Any] = {"broker": broker_urls(conn)}
    if conn.security_protocol is SecurityProtocol.PLAINTEXT:
        return kw
    import faust  # only the stream worker needs it; imported here to keep the other clients light

    ssl_context = _ssl_context(conn)
    if conn.sasl_mechanism is not None:
        kw["broker_credentials"] = faust.SASLCredentials(
            username=conn.sasl_username,
            password=_reveal(conn.sasl_password),
            mechanism=conn.sasl_mechanism.value,
            ssl_context=ssl_context,
        )
    else:
        kw["broker_credentials"] = faust.SSLCredentials(ssl_context)
    return kw


def aiokafka_kwargs(conn: KafkaConnection) -> dict[str, Any]:
    """Keyword arguments of aiokafka clients (``AIOKafkaProducer`` / ``AIOKafkaConsumer``)."""
    kw: dict[str, Any] = {"bootstrap_servers": conn.bootstrap, "security_protocol": conn.security_protocol.value}
    if conn.client_id is not None:
        kw["client_id"] = conn.client_id
    if conn.sasl_mechanism is not None:
        kw.update(
            sasl_mechanism=conn.sasl_mechanism.value,
            sasl_plain_username=conn.sasl_username,
            sasl_plain_password=_reveal(conn.sasl_password),
        )
    if conn.security_protocol in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL):
        kw["ssl_context"] = _ssl_context(conn)
    return kw


def _reveal(secret: SecretStr | None) -> str | None:
    return secret.get_secret_value() if secret is not None else None


def _ssl_context(conn: KafkaConnection) -> ssl.SSLContext | None:
    """An ``ssl.SSLContext`` trusting ``ssl_ca_location`` (else the system store) with the client
    certificate and key when given; None for a protocol without TLS."""
    if conn.security_protocol not in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL):
        return None
    ctx = ssl.create_default_context(cafile=str(conn.ssl_ca_location) if conn.ssl_ca_location else None)
    if conn.ssl_certificate_location is not None:
        ctx.load_cert_chain(
            str(conn.ssl_certificate_location),
            str(conn.ssl_key_location) if conn.ssl_key_location else None,
            _reveal(conn.ssl_key_password),
        )
    return ctx
