"""The Kafka topics obshub creates: name, partition count, retention and why those values.

Topic names are part of the wire contract (:mod:`obshub.core.schema`); this module says how each topic
is laid out on the broker. ``obshub up`` (:func:`obshub.stack.ensure_topics`) creates every topic of
:data:`TOPICS` that does not exist, with the partition counts of the settings (:func:`topic_specs`).

On a production cluster two things are settings, read by every component that creates a topic (``obshub
up``, the stream workers' internal and changelog topics, the partitioned rule engine's state topic):
``OBSHUB_KAFKA_REPLICATION_FACTOR`` (default 1, the single local broker; 3 on a usual cluster) and
``OBSHUB_KAFKA_PARTITIONS`` (``name=count`` pairs, comma-separated, for any topic, e.g.
``obshub.events.v1=64,obshub.alerts.v1=4``; it takes precedence over ``OBSHUB_EVENTS_PARTITIONS`` /
``OBSHUB_STEPS_PARTITIONS``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from obshub.core import schema


@dataclass(frozen=True)
class TopicSpec:
    """A topic obshub creates: name, partition count, retention (ms) and why those values."""

    name: str
    partitions: int
    retention_ms: int
    why: str


_HOUR = 3600 * 1000
#: default partition counts of the events and step-summary topics (``OBSHUB_EVENTS_PARTITIONS`` /
#: ``OBSHUB_STEPS_PARTITIONS`` choose others when ``obshub up`` creates them)
EVENTS_PARTITIONS = 8
STEPS_PARTITIONS = 4
TOPICS: tuple[TopicSpec, ...] = (
    TopicSpec(
        schema.TOPIC_EVENTS,
        EVENTS_PARTITIONS,
        24 * _HOUR,
        "agent batches keyed by host; 8 partitions = up to 8 stream workers in parallel; 24 h replay window",
    ),
    TopicSpec(
        schema.TOPIC_STEPS,
        STEPS_PARTITIONS,
        7 * 24 * _HOUR,
        "per-step summaries keyed by job; 7 days of history for baselines and post-mortems",
    ),
    TopicSpec(
        schema.TOPIC_ALERTS,
        2,
        30 * 24 * _HOUR,
        "alert state changes keyed by fingerprint; 30 days, the usual incident-review horizon",
    ),
    TopicSpec(
        schema.TOPIC_DLQ,
        1,
        7 * 24 * _HOUR,
        "undecodable or invalid messages with the reason in headers; one partition keeps them in order",
    ),
)


def topic_specs(settings: Any) -> tuple[TopicSpec, ...]:
    """:data:`TOPICS` with the partition counts of ``settings`` (``events_partitions``,
    ``steps_partitions``): what ``obshub up`` creates. Partition counts are fixed once a topic exists."""
    counts = {schema.TOPIC_EVENTS: settings.events_partitions, schema.TOPIC_STEPS: settings.steps_partitions}
    return tuple(replace(t, partitions=counts.get(t.name, t.partitions)) for t in TOPICS)


def replication_factor() -> int:
    """Replication factor of the topics obshub creates (``OBSHUB_KAFKA_REPLICATION_FACTOR``, default 1).
    Raises ConfigError naming the variable when it is not a positive integer."""
    raw = os.environ.get("OBSHUB_KAFKA_REPLICATION_FACTOR", "").strip() or "1"
    try:
        n = int(raw)
        if n < 1:
            raise ValueError
    except ValueError:
        from obshub.core.errors import ConfigError

        raise ConfigError(
            f"OBSHUB_KAFKA_REPLICATION_FACTOR={raw!r} is not a positive integer",
            "set it to the number of brokers that hold a copy of each partition (3 on most "
            "clusters, 1 for the local broker)",
        ) from None
    return n


def partitions(spec: TopicSpec) -> int:
    """Partition count of ``spec``: its entry in ``OBSHUB_KAFKA_PARTITIONS`` (``name=count,...``), else
    ``spec.partitions``. Raises ConfigError naming the variable on a malformed entry."""
    raw = os.environ.get("OBSHUB_KAFKA_PARTITIONS", "").strip()
    for item in filter(None, (x.strip() for x in raw.split(","))):
        name, sep, count = item.partition("=")
        if not sep or not count.strip().isdigit() or int(count) < 1:
            from obshub.core.errors import ConfigError

            raise ConfigError(
                f"OBSHUB_KAFKA_PARTITIONS: {item!r} is not topic=count",
                "e.g. OBSHUB_KAFKA_PARTITIONS=obshub.events.v1=64,obshub.steps.v1=16",
            )
        if name.strip() == spec.name:
            return int(count)
    return spec.partitions
