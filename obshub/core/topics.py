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

:func:`layout` is the ONE table of every topic obshub uses on a cluster, the stream worker's repartition,
changelog and leader topics and the scaled-out rule engine's state topic included: partitions, replication
factor, ``min.insync.replicas``, retention and cleanup policy. ``obshub topics create|check``
(:mod:`obshub.topics_cli`) creates and checks a cluster against it; ``obshub up`` and the stream worker
create their topics with the same values (:func:`topic_config`).
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


# ------------------------------------------------------------------------------------------------------
# The one table: every topic obshub uses on a cluster, with the settings `obshub topics check` compares
# ------------------------------------------------------------------------------------------------------
#: retention of the stream worker's repartition topic ``<app>-steps`` (ms): its records are folded within
#: a window of seconds; 24 h leaves room for a worker that was down for a night
REPARTITION_RETENTION_MS = 24 * _HOUR


@dataclass(frozen=True)
class TopicLayout:
    """One row of :func:`layout`: how a topic must look on the cluster.

    ``partitions``: partition count; ``replication_factor``: copies of each partition; ``min_insync_replicas``:
    copies that must acknowledge a write (``acks=all``) before it succeeds; ``retention_ms``: how long a
    record is kept, ms (None for a compacted topic: the latest record per key is kept for ever);
    ``cleanup_policy``: ``delete`` or ``compact``; ``owner``: who writes it (``pipeline``, ``streams``,
    ``rules``); ``why``: the reason for these values."""

    name: str
    partitions: int
    replication_factor: int
    min_insync_replicas: int
    retention_ms: int | None
    cleanup_policy: str
    owner: str
    why: str

    def config(self) -> dict[str, str]:
        """The topic-level configs of this row, as Kafka names them (``cleanup.policy``,
        ``min.insync.replicas``, ``retention.ms``): what a create sets and a check compares."""
        out = {"cleanup.policy": self.cleanup_policy, "min.insync.replicas": str(self.min_insync_replicas)}
        if self.retention_ms is not None:
            out["retention.ms"] = str(self.retention_ms)
        return out


def min_insync_replicas(rf: int) -> int:
    """``min.insync.replicas`` for replication factor ``rf``: 2 from 3 copies on (a write survives the loss
    of one broker and is never acknowledged by one copy alone), else 1 (a cluster of one or two brokers
    cannot do better without stopping writes whenever one broker is gone)."""
    return 2 if rf >= 3 else 1


#: bounds (s) of a changelog's segment time: at least 10 s (fewer, larger segment files), at most 1 h
CHANGELOG_SEGMENT_S = (10.0, 3600.0)
#: bounds (s) of a changelog's tombstone time: at least 60 s, longer than a restarted worker's read of its
#: changelogs (a tombstone removed mid-read could leave a dropped key behind in the table it rebuilds)
CHANGELOG_TOMBSTONE_S = (60.0, 3600.0)


def changelog_cleaner_config(retention_s: float) -> dict[str, str]:
    """The log cleaner's settings (Kafka topic-config names, values in ms or a ratio) of a stream table's
    changelog for a worker whose job retention is ``retention_s`` (s). Each is proportional to the retention,
    so the records a restarted worker reads are bounded by what the last few retentions wrote, never by the
    jobs ever seen (docs/STREAMS.md "Retention"):

    - ``segment.ms`` = retention (10 s to 1 h): the cleaner compacts closed segments only, so the active
      segment holds at most one retention of writes;
    - ``max.compaction.lag.ms`` = the same: a closed segment is compacted within it whatever share of the
      log is dirty (Kafka also rolls the active segment at this age);
    - ``min.cleanable.dirty.ratio`` = 0.5 (Kafka's default): cleans earlier when half the log is dirty;
    - ``min.compaction.lag.ms`` = 0 (the default): Faust needs only the latest value of a key;
    - ``delete.retention.ms`` = retention (60 s to 1 h): a tombstone stays that long after the cleaning
      that first saw it, then goes, so tombstones held are bounded by the drops of that time.
    """
    seg = min(CHANGELOG_SEGMENT_S[1], max(CHANGELOG_SEGMENT_S[0], retention_s))
    tomb = min(CHANGELOG_TOMBSTONE_S[1], max(CHANGELOG_TOMBSTONE_S[0], retention_s))
    seg_ms = str(int(seg * 1000))
    return {
        "segment.ms": seg_ms,
        "max.compaction.lag.ms": seg_ms,
        "min.cleanable.dirty.ratio": "0.5",
        "min.compaction.lag.ms": "0",
        "delete.retention.ms": str(int(tomb * 1000)),
    }


#: bytes a stream worker's changelog record may hold (the topic's ``max.message.bytes``; the worker's producer
#: sends requests up to the same size, obshub/streams/app.py): a table value over the broker's default 1 MB
#: (a step's part of a host that ran thousands of collectives) was refused and crashed the worker
CHANGELOG_MAX_BYTES = 16 * 1024 * 1024


def topic_config(name: str, rf: int | None = None, changelog_retention_s: float | None = None) -> dict[str, str]:
    """Topic-level configs (Kafka names) of ``name`` for a topic created with replication factor ``rf``
    (default :func:`replication_factor`): compacted for a changelog or state topic (a changelog's records
    up to :data:`CHANGELOG_MAX_BYTES`), the retention of
    :data:`TOPICS` for obshub's own topics, :data:`REPARTITION_RETENTION_MS` for other stream topics.
    ``changelog_retention_s`` (the stream worker's job retention, s): a changelog then gets the log
    cleaner's settings of :func:`changelog_cleaner_config` (segment time, compaction lag and tombstone time
    proportional to the retention), so compaction removes a dropped job's records and later its tombstones
    on a cadence set by the retention (docs/STREAMS.md "Retention")."""
    rf = replication_factor() if rf is None else rf
    out = {"min.insync.replicas": str(min_insync_replicas(rf))}
    spec = next((t for t in TOPICS if t.name == name), None)
    if name.endswith("-changelog") or name.endswith("-state"):
        out["cleanup.policy"] = "compact"
        if name.endswith("-changelog"):
            out["max.message.bytes"] = str(CHANGELOG_MAX_BYTES)
        if changelog_retention_s is not None and name.endswith("-changelog"):
            out.update(changelog_cleaner_config(changelog_retention_s))
    elif spec is not None:
        out.update({"cleanup.policy": "delete", "retention.ms": str(spec.retention_ms)})
    else:
        out.update({"cleanup.policy": "delete", "retention.ms": str(REPARTITION_RETENTION_MS)})
    return out


def layout(
    settings: Any,
    internal: dict[str, int] | None = None,
    rules_state: tuple[str, int] | None = None,
) -> tuple[TopicLayout, ...]:
    """Every topic obshub uses, as it must be on the cluster: the rows of :func:`topic_specs` (partition
    counts from ``settings`` and ``OBSHUB_KAFKA_PARTITIONS``), ``internal`` (the stream worker's own topics,
    name -> partition count, from :func:`obshub.streams.topics.internal_topics`) and ``rules_state``
    (name, partitions) of the scaled-out rule engine's state topic. Replication factor and
    ``min.insync.replicas`` come from ``OBSHUB_KAFKA_REPLICATION_FACTOR`` (:func:`replication_factor`,
    :func:`min_insync_replicas`). Raises ConfigError on a malformed setting."""
    rf = replication_factor()
    rows = []

    def row(name: str, n: int, owner: str, why: str) -> TopicLayout:
        cfg = topic_config(name, rf)
        ret = cfg.get("retention.ms")
        return TopicLayout(
            name, n, rf, min_insync_replicas(rf), int(ret) if ret else None, cfg["cleanup.policy"], owner, why
        )

    for t in topic_specs(settings):
        rows.append(row(t.name, partitions(t), "pipeline", t.why))
    for name, n in (internal or {}).items():
        why = (
            "a stream table's changelog: the table is rebuilt from it, the latest value per key is kept"
            if name.endswith("-changelog")
            else "the stream worker's own topic (repartition by job|step, or Faust's leader topic)"
        )
        rows.append(row(name, n, "streams", why))
    if rules_state is not None:
        rows.append(
            row(rules_state[0], rules_state[1], "rules", "the scaled-out rule engine's state, one per steps partition")
        )
    return tuple(rows)
