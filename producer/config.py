"""Typed settings of the node agent's transport (pydantic): Kafka connection and security, batch bounds,
spool bounds, and the agent's own identity and timers.

Secrets (SASL password, SSL key password) are ``SecretStr``: they never appear in ``repr``, logs or
error messages; only :meth:`KafkaConfig.librdkafka_config` reveals them, to hand them to librdkafka.

Errors: building a model from bad values raises ``pydantic.ValidationError``; :func:`agent_config` turns
that into :class:`obshub.core.errors.ConfigError` naming the option and what was wrong.
"""

from __future__ import annotations

import enum
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

from obshub.core.errors import ConfigError


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


class KafkaConfig(BaseModel):
    """How the agent talks to Kafka.

    ``delivery_timeout_ms`` is librdkafka's ``message.timeout.ms``: a batch not acknowledged within it is
    reported failed and goes to the spool (so it is short compared with librdkafka's 300 s default: the
    spool, not librdkafka's memory queue, is where batches wait out an outage). ``queue_max_messages`` /
    ``queue_max_kbytes`` bound librdkafka's in-memory queue; when it is full the publisher waits
    (back-pressure) up to ``max_block_ms`` and then spools.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    bootstrap: str = Field(min_length=1)
    security_protocol: SecurityProtocol = SecurityProtocol.PLAINTEXT
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_location: Path | None = None
    ssl_certificate_location: Path | None = None
    ssl_key_location: Path | None = None
    ssl_key_password: SecretStr | None = None
    compression: str = Field("lz4", pattern="^(none|gzip|snappy|lz4|zstd)$")
    linger_ms: int = Field(20, ge=0, le=60_000)
    delivery_timeout_ms: int = Field(10_000, ge=1_000, le=3_600_000)
    queue_max_messages: int = Field(10_000, ge=1)
    queue_max_kbytes: int = Field(256 * 1024, ge=1)
    max_block_ms: int = Field(2_000, ge=0)
    extra: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _security_complete(self) -> "KafkaConfig":
        if self.security_protocol in (SecurityProtocol.SASL_SSL, SecurityProtocol.SASL_PLAINTEXT):
            missing = [n for n in ("sasl_mechanism", "sasl_username", "sasl_password") if getattr(self, n) is None]
            if missing:
                raise ValueError(f"security protocol {self.security_protocol.value} needs "
                                 + ", ".join("--" + m.replace("_", "-") for m in missing))
        for name in ("ssl_ca_location", "ssl_certificate_location", "ssl_key_location"):
            p = getattr(self, name)
            if p is not None and not p.exists():
                raise ValueError(f"--{name.replace('_', '-')} {p} does not exist")
        return self

    def librdkafka_config(self) -> dict[str, object]:
        """The confluent-kafka producer configuration: idempotent (``enable.idempotence``, which implies
        ``acks=all`` and at most 5 in-flight requests per connection, ordered), compressed, with the
        security settings; secrets revealed here only. ``extra`` entries override."""
        conf: dict[str, object] = {
            "bootstrap.servers": self.bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": self.compression,
            "linger.ms": self.linger_ms,
            "message.timeout.ms": self.delivery_timeout_ms,
            "request.timeout.ms": min(30_000, self.delivery_timeout_ms),  # in-flight fails within it too
            "queue.buffering.max.messages": self.queue_max_messages,
            "queue.buffering.max.kbytes": self.queue_max_kbytes,
            "message.max.bytes": 8 * 1024 * 1024,
            "reconnect.backoff.ms": 100,
            "reconnect.backoff.max.ms": 1000,
            "security.protocol": self.security_protocol.value,
        }
        if self.sasl_mechanism is not None:
            conf["sasl.mechanism"] = self.sasl_mechanism.value
        if self.sasl_username is not None:
            conf["sasl.username"] = self.sasl_username
        if self.sasl_password is not None:
            conf["sasl.password"] = self.sasl_password.get_secret_value()
        for name, key in (("ssl_ca_location", "ssl.ca.location"),
                          ("ssl_certificate_location", "ssl.certificate.location"),
                          ("ssl_key_location", "ssl.key.location")):
            if getattr(self, name) is not None:
                conf[key] = str(getattr(self, name))
        if self.ssl_key_password is not None:
            conf["ssl.key.password"] = self.ssl_key_password.get_secret_value()
        conf.update(self.extra)
        return conf


class BatchConfig(BaseModel):
    """Batch bounds: a batch is sealed when its encoded size would pass ``max_bytes`` (bytes of the msgpack
    message) or its first event is ``max_age_ms`` old, whichever comes first."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_bytes: int = Field(256 * 1024, ge=1024, le=1024 * 1024)  # <= Kafka's default max.message.bytes
    max_age_ms: int = Field(200, ge=1, le=60_000)


class SpoolConfig(BaseModel):
    """On-disk spool bounds: at most ``max_bytes`` of segment files, each up to ``segment_bytes``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dir: Path
    max_bytes: int = Field(256 * 1024 * 1024, ge=64 * 1024)
    segment_bytes: int = Field(4 * 1024 * 1024, ge=16 * 1024)

    @model_validator(mode="after")
    def _segments_fit(self) -> "SpoolConfig":
        if self.segment_bytes * 4 > self.max_bytes:
            raise ValueError(f"spool segment size {self.segment_bytes} B must be at most a quarter of the "
                             f"spool size {self.max_bytes} B (the oldest segment is dropped when it is full)")
        return self


_HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


class AgentConfig(BaseModel):
    """Everything ``obshub agent`` needs besides the event source.

    ``loss_interval_s``: how often ring-buffer loss counters are turned into AGENT_LOSS events.
    ``flush_timeout_s``: on SIGTERM, how long to try to deliver what is left before exiting.
    ``clock_refresh_s``: how often the monotonic -> realtime offset is measured again.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    job: str = Field(min_length=1, max_length=256)
    host: str
    host_id: int = Field(ge=0, le=0xFFFF)
    kafka: KafkaConfig
    batch: BatchConfig = Field(default_factory=BatchConfig)
    spool: SpoolConfig
    metrics_port: int | None = Field(None, ge=0, le=65535)
    metrics_addr: str = "0.0.0.0"
    duration_s: float | None = Field(None, gt=0)
    loss_interval_s: float = Field(1.0, gt=0)
    flush_timeout_s: float = Field(15.0, ge=0)
    clock_refresh_s: float = Field(10.0, gt=0)

    @model_validator(mode="after")
    def _host_name(self) -> "AgentConfig":
        if not _HOST_RE.match(self.host):
            raise ValueError(f"host name {self.host!r} must be letters, digits, '.', '_' or '-' "
                             "(it names the Kafka key and the spool folder)")
        return self


def agent_config(**values) -> AgentConfig:
    """Build an :class:`AgentConfig`, turning validation errors into one ConfigError that lists each
    wrong option and why."""
    try:
        return AgentConfig(**values)
    except ValidationError as exc:
        lines = []
        for e in exc.errors():
            loc = ".".join(str(p) for p in e["loc"]) or "agent"
            lines.append(f"{loc}: {e['msg']}")
        raise ConfigError("invalid agent settings: " + "; ".join(lines),
                          "see `obshub agent --help` for the options and their ranges") from None
