"""Settings in one typed place (pydantic-settings): every value has a default, an ``OBSHUB_*`` environment
variable, and is validated before anything starts.

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

from pathlib import Path

import platformdirs
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """obshub settings. Environment: ``OBSHUB_HOME``, ``OBSHUB_CACHE``, ``OBSHUB_KAFKA_PORT``,
    ``OBSHUB_KAFKA_CONTROLLER_PORT``, ``OBSHUB_KAFKA_VERSION``, ``OBSHUB_KAFKA_HEAP_MB``,
    ``OBSHUB_BOOTSTRAP`` (an existing cluster's bootstrap servers; default: the local broker),
    ``OBSHUB_EVENTS_PARTITIONS`` / ``OBSHUB_STEPS_PARTITIONS`` (partitions ``obshub up`` gives the events and
    step-summary topics when it creates them), ``OBSHUB_STREAMS_PARTITIONS`` (default ``--partitions`` of
    ``obshub streams worker``: its repartition topic and tables)."""

    model_config = SettingsConfigDict(env_prefix="OBSHUB_", extra="ignore")

    home: Path = Field(default_factory=lambda: Path(platformdirs.user_data_dir("obshub")))
    cache: Path = Field(default_factory=lambda: Path(platformdirs.user_cache_dir("obshub")))
    kafka_port: int = Field(19092, ge=1, le=65535)
    kafka_controller_port: int | None = Field(None, ge=1, le=65535)
    kafka_version: str = "4.1.1"
    kafka_heap_mb: int = Field(512, ge=128)
    bootstrap: str | None = None
    # partition counts: the parallelism of each stage (docs/STREAMS.md "Sizing"); fixed once a topic exists
    events_partitions: int = Field(8, ge=1, le=4096)     # obshub.events.v1: stream workers that can ingest
    steps_partitions: int = Field(4, ge=1, le=4096)      # obshub.steps.v1: consumers of the summaries
    streams_partitions: int = Field(8, ge=1, le=1024)    # a stream app's <app>-steps topic and its tables

    @field_validator("home", "cache")
    @classmethod
    def _absolute(cls, v: Path) -> Path:
        return v.expanduser().resolve()

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


def load_settings(**overrides) -> Settings:
    """Settings from the environment, with explicit overrides (CLI flags) taking precedence.
    Raises :class:`obshub.core.errors.ConfigError` naming the setting (and its variable) that is invalid."""
    from pydantic import ValidationError

    from obshub.core.errors import ConfigError

    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors())
        names = ", ".join(f"OBSHUB_{str(e['loc'][0]).upper()}" for e in exc.errors() if e["loc"])
        raise ConfigError(f"invalid setting: {problems}",
                          f"fix the value of {names or 'the setting'} (environment or command-line flag)") from None
