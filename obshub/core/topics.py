"""The Kafka topics obshub creates: name, partition count, retention and why those values.

Topic names are part of the wire contract (:mod:`obshub.core.schema`); this module says how each topic
is laid out on the broker. ``obshub up`` (:func:`obshub.stack.ensure_topics`) creates every topic of
:data:`TOPICS` that does not exist, with the partition counts of the settings (:func:`topic_specs`).
"""

from __future__ import annotations

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
    TopicSpec(schema.TOPIC_EVENTS, EVENTS_PARTITIONS, 24 * _HOUR,
              "agent batches keyed by host; 8 partitions = up to 8 stream workers in parallel; 24 h replay window"),
    TopicSpec(schema.TOPIC_STEPS, STEPS_PARTITIONS, 7 * 24 * _HOUR,
              "per-step summaries keyed by job; 7 days of history for baselines and post-mortems"),
    TopicSpec(schema.TOPIC_ALERTS, 2, 30 * 24 * _HOUR,
              "alert state changes keyed by fingerprint; 30 days, the usual incident-review horizon"),
    TopicSpec(schema.TOPIC_DLQ, 1, 7 * 24 * _HOUR,
              "undecodable or invalid messages with the reason in headers; one partition keeps them in order"),
)


def topic_specs(settings: Any) -> tuple[TopicSpec, ...]:
    """:data:`TOPICS` with the partition counts of ``settings`` (``events_partitions``,
    ``steps_partitions``): what ``obshub up`` creates. Partition counts are fixed once a topic exists."""
    counts = {schema.TOPIC_EVENTS: settings.events_partitions, schema.TOPIC_STEPS: settings.steps_partitions}
    return tuple(replace(t, partitions=counts.get(t.name, t.partitions)) for t in TOPICS)
