"""The stream app's own topics: the repartition topic ``<app>-steps``, one changelog per table and Faust's
leader topic. :func:`ensure_internal_topics` creates them before Faust starts."""

from __future__ import annotations

import logging
import time

from aiokafka.partitioner import murmur2

from obshub.core import kafka
from obshub.core.log import NullLogger
from obshub.streams.errors import StreamsError

log = logging.getLogger("obshub.streams")

# table name -> partitioned like the input topic ("input") or like the repartition topic ("internal")
TABLES = {
    "agents": "input",
    "inputs": "input",
    "parts": "internal",
    "steps": "internal",
    "members": "internal",
    "jobs": "internal",
    "closed": "internal",
    "folded": "internal",
}


#: how long (s) a key's partition stays cached after its last use: one period, at most two
PARTITION_CACHE_S = 10.0


class PartitionCache:
    """``key`` -> partition of the keys used in the current and the previous period of ``period_s``
    seconds (two generations of dicts: a key used again moves to the current one; the previous one is
    dropped when a period ends). Every host of a step sends the same key (``b"job|step"``) within the
    step's window, so the cache holds the keys of the steps open in the last 1-2 periods: bounded by the
    live steps, not by the jobs ever seen (a fixed-size LRU filled with dead steps' keys and stayed full).
    ``clock``: monotonic seconds. Not thread-safe (the worker's ingest agent is its only caller)."""

    def __init__(self, period_s: float = PARTITION_CACHE_S, clock=time.monotonic) -> None:
        self.period_s, self.clock = period_s, clock
        self.cur: dict[tuple[bytes, int], int] = {}
        self.old: dict[tuple[bytes, int], int] = {}
        self.t0 = clock()

    def __len__(self) -> int:
        return len(self.cur) + len(self.old)

    def get(self, key: bytes, partitions: int) -> int:
        """The partition of ``key`` over ``partitions`` (:func:`partition_of`)."""
        now = self.clock()
        if now - self.t0 >= self.period_s:
            self.old, self.cur, self.t0 = self.cur, {}, now
        k = (key, partitions)
        p = self.cur.get(k)
        if p is None:
            p = self.old.get(k)
            if p is None:
                p = (murmur2(key) & 0x7FFFFFFF) % partitions
            self.cur[k] = p
        return p


_PARTITIONS = PartitionCache()


def partition_of(key: bytes, partitions: int) -> int:
    """The partition of the repartition topic that folds ``key`` (``b"job|step"``): Kafka's default
    partitioner (murmur2 of the key, as the Java client and aiokafka compute it) over ``partitions``.
    Every host of a step sends the same key, so the partitions of the keys used in the last 10-20 s are
    cached (:class:`PartitionCache`; murmur2 is Python code in aiokafka, some µs per key)."""
    return _PARTITIONS.get(key, partitions)


def internal_topics(app_id: str, partitions: int, input_partitions: int) -> dict[str, int]:
    """Names and partition counts of the topics the app owns: the repartition topic (``partitions``), the
    tables' changelogs (Faust names them ``<app>-<table>-changelog``) and Faust's leader topic (1)."""
    out = {f"{app_id}-steps": partitions, f"{app_id}-__assignor-__leader": 1}
    for name, like in TABLES.items():
        out[f"{app_id}-{name}-changelog"] = input_partitions if like == "input" else partitions
    return out


def ensure_internal_topics(
    bootstrap: str,
    app_id: str,
    partitions: int,
    input_partitions: int,
    timeout_s: float = 30.0,
    retention_s: float | None = None,
) -> None:
    """Create the app's own topics before Faust starts, and wait until the broker's metadata lists them.

    Why: Faust creates them itself at start, but when the first group assignment happens before the new
    topic is in the consumer's metadata, the topic is left out of the assignment ("Ignoring missing
    topic") and the fold agent gets no partitions until the next rebalance. Changelogs are compacted.
    With ``retention_s`` (the worker's job retention), a new changelog rolls a segment every
    ``retention_s`` (at least 1 min, at most 1 h) and keeps tombstones as long: compaction (which cleans
    closed segments only) then removes a dropped job's records and later its tombstones, so a restart
    reads only live jobs (docs/STREAMS.md "Retention"). An existing changelog whose cleaner settings differ
    from those of ``retention_s`` gets them (:func:`align_cleaner_configs`), so a changed
    ``--job-retention-s`` bounds a restart's read too; other settings of existing topics stay.
    Raises StreamsError when a topic exists with a different partition count (a changed ``--partitions``
    for an existing app id), cannot be created, or does not show up within ``timeout_s``.
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    want = internal_topics(app_id, partitions, input_partitions)
    admin = AdminClient(kafka.admin_config(kafka.KafkaConnection(bootstrap=bootstrap), {"logger": NullLogger()}))
    md = admin.list_topics(timeout=10)
    for name, n in want.items():
        if name in md.topics and len(md.topics[name].partitions) != n:
            raise StreamsError(
                f"topic {name} has {len(md.topics[name].partitions)} partitions, this worker needs {n}",
                "start the worker with the partition count the app id was created with, or use a new --app-id",
            )
    from obshub.core.topics import replication_factor, topic_config

    new = [
        NewTopic(name, n, replication_factor(), config=topic_config(name, changelog_retention_s=retention_s))
        for name, n in want.items()
        if name not in md.topics
    ]
    if retention_s is not None:
        align_cleaner_configs(admin, [n for n in want if n in md.topics and n.endswith("-changelog")], retention_s)
    if new:
        for name, fut in admin.create_topics(new, operation_timeout=20).items():
            try:
                fut.result()
            except KafkaException as exc:
                if "already exists" not in str(exc).lower():
                    raise StreamsError(f"Failed to create topic {name}: {exc}", "read the broker log") from exc
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        md = admin.list_topics(timeout=10)
        if all(
            name in md.topics and len(md.topics[name].partitions) == n and md.topics[name].error is None
            for name, n in want.items()
        ):
            return
        time.sleep(0.2)
    raise StreamsError(f"the broker did not list topics {sorted(want)} within {timeout_s:.0f} s", "read the broker log")


def align_cleaner_configs(admin, topics: list[str], retention_s: float) -> dict[str, dict[str, str]]:
    """Give existing changelog ``topics`` the log cleaner's settings of job retention ``retention_s``
    (``core.topics.changelog_cleaner_config``) where they differ, with an incremental alter (other settings
    stay). ``admin``: a confluent-kafka ``AdminClient``. Returns ``{topic: {setting: new value}}`` of what
    was changed. Best effort: a broker that refuses (e.g. no ALTER_CONFIGS permission) is logged as a
    warning and the worker starts with the topics as they are.

    Why: the settings were only given to new changelogs, and Kafka never compacts the active segment, so a
    changelog created with a 1 h ``segment.ms`` kept an hour of writes for every restart to read whatever
    retention the worker ran with later (a demo worker read 46,000 records of 20 earlier runs, 8-27 s)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    from obshub.core.topics import changelog_cleaner_config

    want = changelog_cleaner_config(retention_s)
    changed: dict[str, dict[str, str]] = {}
    if not topics:
        return changed
    try:
        res = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in topics]
        for r, fut in admin.describe_configs(res).items():
            have = fut.result(timeout=20)
            diff = {k: v for k, v in want.items() if k not in have or have[k].value != v}
            if diff:
                entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in diff.items()]
                alter = ConfigResource(ConfigResource.Type.TOPIC, r.name, incremental_configs=entries)
                for f in admin.incremental_alter_configs([alter]).values():
                    f.result(timeout=20)
                changed[r.name] = diff
    except (KafkaException, TimeoutError, ValueError) as exc:
        log.warning("could not give the changelogs the cleaner settings of a %.0f s retention: %s", retention_s, exc)
        return changed
    if changed:
        log.info(
            "changelog cleaner settings of a %.0f s retention given to %d existing topic(s)", retention_s, len(changed)
        )
    return changed
