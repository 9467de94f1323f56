"""Settings in one typed place: one pydantic model per role, every default written once.

=========================  ==================================================================================
role                       model
=========================  ==================================================================================
common / local broker      :class:`Settings` (pydantic-settings: ``OBSHUB_*`` environment variables)
Kafka connection           :class:`obshub.core.kafka.KafkaConnection` (built by :func:`obshub.core.kafka.connection`)
agent                      :class:`AgentConfig` with :class:`KafkaConfig`, :class:`BatchConfig`, :class:`SpoolConfig`
stream worker              :class:`StreamsSettings` (defaults of ``streams.app.WorkerConfig`` and its CLI)
rule engine                :class:`RulesSettings` (defaults of ``rules.service.RuleService`` and its CLI)
=========================  ==================================================================================

Every value is validated before anything starts; command-line defaults refer to these models, never to a
second copy of a number.

Layout of the state directory (``$OBSHUB_HOME``, default ``platformdirs.user_data_dir("obshub")``)::

    $OBSHUB_HOME/
      kafka/server.properties   generated broker config
      kafka/data/               KRaft log dirs (formatted on first start)
      logs/                     kafka.log, streams-*.log, rules.log, agent-*.log
      run/                      <component>.pid and <component>.json (what runs, since when)
      state/                    Faust table state, rule-engine state

Downloads are cached outside the state dir, in ``$OBSHUB_CACHE`` (default
``platformdirs.user_cache_dir("obshub")``), so wiping the state keeps the Kafka jars and header tree.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import platformdirs
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from obshub.core.errors import ConfigError
from obshub.core.kafka import KafkaConnection, check_bootstrap
from obshub.core.schema import DLQ_MAX_BYTES
from obshub.core.topics import EVENTS_PARTITIONS, STEPS_PARTITIONS

#: the local broker's port (``obshub up``) when ``OBSHUB_KAFKA_PORT`` does not say otherwise
DEFAULT_KAFKA_PORT = 19092
#: bootstrap servers of the local broker on its default port
LOCAL_BOOTSTRAP = f"127.0.0.1:{DEFAULT_KAFKA_PORT}"
#: partitions of a stream app's repartition topic and tables (``OBSHUB_STREAMS_PARTITIONS``)
STREAMS_PARTITIONS = 8


class Settings(BaseSettings):
    """obshub settings. Environment: ``OBSHUB_HOME``, ``OBSHUB_CACHE``, ``OBSHUB_KAFKA_PORT``,
        ``OBSHUB_KAFKA_CONTROLLER_PORT``, ``OBSHUB_KAFKA_VERSION``, ``OBSHUB_KAFKA_HEAP_MB``,
        ``OBSHUB_BOOTSTRAP`` (an existing cluster's bootstrap servers; default: the local broker),
        ``OBSHUB_EVENTS_PARTITIONS`` / ``OBSHUB_STEPS_PARTITIONS`` (partitions ``obshub up`` gives the events and
        step-summary topics when it creates them), ``OBSHUB_STREAMS_PARTITIONS`` (default ``--partitions`` of
        ``obshub streams worker``: its repartition topic and tables), ``OBSHUB_RULES_JOB_RETENTION_S`` (the rule
    engine drops a job's groups this many seconds after its last record, docs/RULES.md "Retention")."""

    model_config = SettingsConfigDict(env_prefix="OBSHUB_", extra="ignore")

    home: Path = Field(default_factory=lambda: Path(platformdirs.user_data_dir("obshub")))
    cache: Path = Field(default_factory=lambda: Path(platformdirs.user_cache_dir("obshub")))
    kafka_port: int = Field(DEFAULT_KAFKA_PORT, ge=1, le=65535)
    kafka_controller_port: int | None = Field(None, ge=1, le=65535)
    kafka_version: str = "4.1.1"
    kafka_heap_mb: int = Field(512, ge=128)
    bootstrap: str | None = None
    # partition counts: the parallelism of each stage (docs/STREAMS.md "Sizing"); fixed once a topic exists
    events_partitions: int = Field(EVENTS_PARTITIONS, ge=1, le=4096)  # obshub.events.v1: stream workers that can ingest
    steps_partitions: int = Field(STEPS_PARTITIONS, ge=1, le=4096)  # obshub.steps.v1: consumers of the summaries
    streams_partitions: int = Field(STREAMS_PARTITIONS, ge=1, le=1024)  # a stream app's <app>-steps topic and tables
    # s after a job's last record that the rule engine drops its groups, alerts resolved first (docs/RULES.md)
    rules_job_retention_s: float = Field(3600.0, gt=0)

    @field_validator("home", "cache", mode="before")
    @classmethod
    def _empty_is_default(cls, v: Any, info: Any) -> Any:
        """An empty ``OBSHUB_HOME`` / ``OBSHUB_CACHE`` (``OBSHUB_HOME=$UNSET_VARIABLE``) is the default folder,
        as an empty XDG variable is (it was the working directory: state written wherever the command ran,
        and a second command elsewhere found no broker)."""
        if isinstance(v, str) and not v.strip():
            return Path(
                (platformdirs.user_data_dir if info.field_name == "home" else platformdirs.user_cache_dir)("obshub")
            )
        return v

    @field_validator("bootstrap")
    @classmethod
    def _bootstrap_form(cls, v: str | None) -> str | None:
        """``OBSHUB_BOOTSTRAP`` well formed (:func:`obshub.core.kafka.check_bootstrap`), refused at once:
        ``127.0.0.1:99999`` waited for a connect timeout and then said "connection refused". Empty or
        blank is the local broker, as before."""
        if v is None or not v.strip():
            return None
        return check_bootstrap(v, "OBSHUB_BOOTSTRAP")

    @field_validator("home", "cache")
    @classmethod
    def _absolute(cls, v: Path) -> Path:
        """The folder made absolute; a relative one is refused (the state would follow the working
        directory: `obshub up` in one folder and `obshub down` in another would not find the same broker),
        and so is a file at it (or at a folder above it), here rather than by the first ``mkdir`` of a
        command (a NotADirectoryError traceback)."""
        if not v.expanduser().is_absolute():
            raise ValueError(
                f"{str(v)!r} is a relative path: every obshub command would find another folder from another "
                f"working directory; give an absolute one, e.g. {Path.cwd() / v}"
            )
        p = v.expanduser().resolve()
        for above in (p, *p.parents):
            if above.exists():
                if not above.is_dir():
                    raise ValueError(f"{p} cannot be a folder: {above} is a file")
                break
        return p

    @field_validator("kafka_version", mode="before")
    @classmethod
    def _empty_version_is_default(cls, v: Any) -> Any:
        """An empty ``OBSHUB_KAFKA_VERSION`` is the default version, as an empty ``OBSHUB_HOME`` is the default."""
        return cls.model_fields["kafka_version"].default if isinstance(v, str) and not v.strip() else v

    @field_validator("kafka_version")
    @classmethod
    def _a_version(cls, v: str) -> str:
        """A Kafka release number (``4.1.1``, ``4.2.0-rc1``): it names the cache folder of the broker's jars
        and goes into a Maven POM, so ``../../x`` wrote that POM outside the cache (newuser20)."""
        if not re.fullmatch(r"\d+\.\d+\.\d+([.-][A-Za-z0-9]+)*", v):
            raise ValueError(f"{v!r} is not a Kafka release number such as 4.1.1")
        return v

    @model_validator(mode="after")
    def _ports_fit(self) -> "Settings":
        """The KRaft controller's port (``OBSHUB_KAFKA_CONTROLLER_PORT``, default the broker's + 1) must be
        a port and not the broker's: ``OBSHUB_KAFKA_PORT=65535`` made it 65536 (an OverflowError traceback
        from ``obshub up``'s port check), and one port for both made the broker's storage format fail with a
        Java stack trace."""
        if self.kafka_controller_port is None and self.kafka_port == 65535:
            raise ValueError(
                "OBSHUB_KAFKA_PORT=65535 leaves no port for the Kafka controller listener (the broker's port + 1 "
                "unless OBSHUB_KAFKA_CONTROLLER_PORT says otherwise); choose a lower port or set "
                "OBSHUB_KAFKA_CONTROLLER_PORT"
            )
        if self.kafka_controller_port == self.kafka_port:
            raise ValueError(
                f"OBSHUB_KAFKA_CONTROLLER_PORT and OBSHUB_KAFKA_PORT are both {self.kafka_port}: the broker and its "
                "KRaft controller need two ports; unset OBSHUB_KAFKA_CONTROLLER_PORT (the broker's port + 1) or "
                "choose another"
            )
        return self

    @property
    def controller_port(self) -> int:
        """The KRaft controller listener port (default: broker port + 1)."""
        return self.kafka_controller_port or self.kafka_port + 1

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` list the clients use."""
        return self.bootstrap or f"127.0.0.1:{self.kafka_port}"

    # state layout ------------------------------------------------------------------------------------
    @property
    def kafka_dir(self) -> Path:
        return self.home / "kafka"

    @property
    def logs_dir(self) -> Path:
        return self.home / "logs"

    @property
    def run_dir(self) -> Path:
        return self.home / "run"

    @property
    def state_dir(self) -> Path:
        return self.home / "state"

    @property
    def kafka_libs(self) -> Path:
        """Where the broker's jars for ``kafka_version`` are cached."""
        return self.cache / "kafka" / self.kafka_version / "libs"


def load_settings(**overrides: Any) -> Settings:
    """Settings from the environment, with explicit overrides (CLI flags) taking precedence.
    Raises :class:`obshub.core.errors.ConfigError` naming the setting (and its variable) that is invalid."""
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        problems = "; ".join(
            (f"{'.'.join(str(x) for x in e['loc'])}: " if e["loc"] else "") + e["msg"].removeprefix("Value error, ")
            for e in exc.errors()
        )
        names = ", ".join(f"OBSHUB_{str(e['loc'][0]).upper()}" for e in exc.errors() if e["loc"])
        raise ConfigError(
            f"invalid setting: {problems}",
            f"fix the value of {names or 'the variables named above'} (environment or command-line flag)",
        ) from None


# ---------------------------------------------------------------------------------------------------------
# Agent (``obshub agent``, producer/)
# ---------------------------------------------------------------------------------------------------------
#: batch bounds: encoded size of one Kafka message (bytes) and age of its first event (ms); a step end
#: seals the open batch, unless it follows a step-aligned batch and is younger than the step minimum (ms)
BATCH_MAX_BYTES = 256 * 1024
BATCH_MAX_AGE_MS = 1000
BATCH_STEP_MIN_AGE_MS = 200
#: spool bounds: all segment files together, and one segment (bytes)
SPOOL_MAX_BYTES = 256 * 1024 * 1024
SPOOL_SEGMENT_BYTES = 4 * 1024 * 1024


class KafkaConfig(KafkaConnection):
    """How the agent talks to Kafka: the connection (:class:`obshub.core.kafka.KafkaConnection`) plus the
    agent producer's tuning.

    ``delivery_timeout_ms``: a batch not acknowledged within it (ms after it was handed to librdkafka) makes
    the transport purge librdkafka's queue and spool it with every newer batch (so it is short compared
    with librdkafka's 300 s default: the spool, not librdkafka's memory queue, is where batches wait out an
    outage). The transport times it, not librdkafka: librdkafka's own ``message.timeout.ms`` is off (0,
    never), because librdkafka times out an old message while newer ones of the same partition stay queued
    and are delivered first once a leader serves (a broker loss reordered an agent's batches that way). ``queue_max_messages`` /
    ``queue_max_kbytes`` bound librdkafka's in-memory queue; when it is full the publisher waits
    (back-pressure) up to ``max_block_ms`` and then spools. ``linger_ms`` (librdkafka's ``linger.ms``)
    is 0: the agent sends one batch per loop turn (about five a second), so waiting for more messages
    to share a request only adds latency and a wakeup of librdkafka's broker thread per batch; messages
    queued while a request is in flight (a spool replay) still share the next one.
    """

    compression: str = Field("lz4", pattern="^(none|gzip|snappy|lz4|zstd)$")
    linger_ms: int = Field(0, ge=0, le=60_000)
    delivery_timeout_ms: int = Field(10_000, ge=1_000, le=3_600_000)
    queue_max_messages: int = Field(10_000, ge=1)
    queue_max_kbytes: int = Field(256 * 1024, ge=1)
    max_block_ms: int = Field(2_000, ge=0)
    extra: dict[str, str] = Field(default_factory=dict)

    def librdkafka_config(self) -> dict[str, object]:
        """The confluent-kafka producer configuration (:func:`obshub.core.kafka.producer_config`):
        idempotent (``enable.idempotence``, which implies ``acks=all`` and at most 5 in-flight requests
        per connection, ordered), compressed, with the security settings; secrets revealed here only.
        ``extra`` entries override."""
        from obshub.core.kafka import producer_config

        return producer_config(
            self,
            {
                "enable.idempotence": True,
                "acks": "all",
                "compression.type": self.compression,
                "linger.ms": self.linger_ms,
                "message.timeout.ms": 0,  # never: the transport times deliveries (class docstring)
                "request.timeout.ms": min(30_000, self.delivery_timeout_ms),  # in-flight fails within it too
                "queue.buffering.max.messages": self.queue_max_messages,
                "queue.buffering.max.kbytes": self.queue_max_kbytes,
                "message.max.bytes": 8 * 1024 * 1024,
                "reconnect.backoff.ms": 100,
                "reconnect.backoff.max.ms": 1000,
                **self.extra,
            },
        )


class BatchConfig(BaseModel):
    """Batch bounds: a batch is sealed when its encoded size would pass ``max_bytes`` (bytes of the msgpack
    message), at the end of a training step (once ``step_min_age_ms`` old when the previous batch was
    also sealed at a step end), or when its first event is ``max_age_ms`` old, whichever comes first
    (obshub/producer/batcher.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_bytes: int = Field(BATCH_MAX_BYTES, ge=1024, le=1024 * 1024)  # <= Kafka's default max.message.bytes
    max_age_ms: int = Field(BATCH_MAX_AGE_MS, ge=1, le=60_000)
    step_min_age_ms: int = Field(BATCH_STEP_MIN_AGE_MS, ge=0, le=60_000)


class SpoolConfig(BaseModel):
    """On-disk spool bounds: at most ``max_bytes`` of segment files, each up to ``segment_bytes``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dir: Path
    max_bytes: int = Field(SPOOL_MAX_BYTES, ge=64 * 1024)
    segment_bytes: int = Field(SPOOL_SEGMENT_BYTES, ge=16 * 1024)

    @model_validator(mode="after")
    def _segments_fit(self) -> "SpoolConfig":
        if self.segment_bytes * 4 > self.max_bytes:
            raise ValueError(
                f"spool segment size {self.segment_bytes} B must be at most a quarter of the "
                f"spool size {self.max_bytes} B (the oldest segment is dropped when it is full)"
            )
        return self


#: an agent host name (``--host``): the Kafka key and the spool folder
HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


class AgentConfig(BaseModel):
    """Everything ``obshub agent`` needs besides the event source.

    ``loss_interval_s``: how often ring-buffer loss counters are turned into AGENT_LOSS events.
    ``flush_timeout_s``: on SIGTERM, how long to try to deliver what is left before exiting (at most; the
    wait ends sooner once Kafka takes nothing, ``producer.transport.SHUTDOWN_STALL_S``).
    ``clock_refresh_s``: how often the monotonic -> realtime offset is measured again.
    ``only_jobs``: serve only the processes registered for these jobs (empty: every job on the node);
    the events of processes registered for another job are dropped by the agent.
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
    only_jobs: tuple[str, ...] = ()

    @field_validator("host")
    @classmethod
    def _host_name(cls, host: str) -> str:
        if not HOST_RE.match(host):
            raise ValueError(
                f"host name {host!r} must be letters, digits, '.', '_' or '-' (it names the Kafka key and the spool folder)"
            )
        return host


class AgentSettingsError(ConfigError):
    """Invalid agent settings (:func:`agent_config`). ``by_option``: every wrong setting is one a
    command-line option gives (named in the message), so ``obshub agent`` reports it as a usage error
    (exit 2, as every command's bad option values); False when one comes from elsewhere (the
    ``OBSHUB_KAFKA_*`` security variables), an error of the configuration (exit 1)."""

    def __init__(self, message: str, hint: str | None = None, by_option: bool = False):
        super().__init__(message, hint)
        self.by_option = by_option


#: pydantic's range and length errors in words a command line uses (``{input}``: the value given)
_PLAIN = {
    "greater_than_equal": "{input!r} is less than the least allowed, {ge}",
    "greater_than": "{input!r} must be more than {gt}",
    "less_than_equal": "{input!r} is more than the most allowed, {le}",
    "less_than": "{input!r} must be less than {lt}",
    "string_too_short": "{input!r} is empty",
    "string_too_long": "{input!r} is longer than {max_length} characters",
}


def _plain(e: Any) -> str:
    """One pydantic error ``e`` in plain words (:data:`_PLAIN`), else its own message."""
    form = _PLAIN.get(e["type"])
    if form is not None:
        try:
            return form.format(input=e.get("input"), **(e.get("ctx") or {}))
        except (KeyError, IndexError, ValueError):
            pass
    return str(e["msg"]).removeprefix("Value error, ")


def agent_config(option_names: dict[str, str] | None = None, **values: Any) -> AgentConfig:
    """Build an :class:`AgentConfig`, turning validation errors into one :class:`AgentSettingsError` that
    lists each wrong setting and why. ``option_names`` maps a setting's dotted field name
    (``batch.max_bytes``) to what the user wrote (``--batch-max-bytes``), so that a command line's error
    names its option (and ``by_option`` says whether every one was an option)."""
    try:
        return AgentConfig(**values)
    except ValidationError as exc:
        lines, by_option = [], bool(option_names)
        for e in exc.errors():
            loc = ".".join(str(p) for p in e["loc"]) or "agent"
            by_option = by_option and loc in (option_names or {})
            lines.append(f"{(option_names or {}).get(loc, loc)}: {_plain(e)}")
        raise AgentSettingsError(
            "invalid agent settings: " + "; ".join(lines),
            "see `obshub agent --help` for the options and their ranges",
            by_option=by_option,
        ) from None


# ---------------------------------------------------------------------------------------------------------
# Stream worker (``obshub streams worker``, streams/)
# ---------------------------------------------------------------------------------------------------------
class StreamsSettings(BaseModel):
    """Defaults of a stream worker (``streams.app.WorkerConfig`` and ``obshub streams worker``).

    ``partitions``: partitions of the internal ``<app_id>-steps`` topic and of the fold tables (the
    parallelism of the join). ``window_s``: a step closes at most this long after its first data arrived
    (processing time), seconds. ``dlq_max_bytes``: a DLQ record keeps the original value up to this size.
    ``job_retention_s``: a job's state is dropped this many seconds after its last data (docs/STREAMS.md
    "Retention"). ``read_idle_every_s``: an idle worker writes its ``read`` report at most this often, seconds
    (``streams.app.ReadReports``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    app_id: str = "obshub-streams"
    bootstrap: str = LOCAL_BOOTSTRAP
    partitions: int = Field(STREAMS_PARTITIONS, ge=1, le=1024)
    window_s: float = Field(10.0, gt=0)
    metrics_port: int = Field(0, ge=0, le=65535)
    dlq_max_bytes: int = Field(DLQ_MAX_BYTES, ge=1)
    job_retention_s: float = Field(3600.0, gt=0)
    read_idle_every_s: float = Field(5.0, gt=0)


STREAMS = StreamsSettings()


# ---------------------------------------------------------------------------------------------------------
# Rule engine (``obshub rules serve``, rules/)
# ---------------------------------------------------------------------------------------------------------
class RulesSettings(BaseModel):
    """Defaults of the rule service (``rules.service.RuleService`` and ``obshub rules serve``).

    ``group_prefix``: prefix of its Kafka consumer groups. ``health_every_s``: seconds between health
    records. ``max_replay_age_s``: alert changes older than this, read by a new notify group, are not
    delivered (seconds)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    group_prefix: str = "obshub-rules"
    health_every_s: float = Field(5.0, gt=0)
    max_replay_age_s: float = Field(3600.0, gt=0)


RULES = RulesSettings()
