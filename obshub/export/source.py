"""Read one job's events and step summaries back from Kafka for export.

Reads ``schema.TOPIC_EVENTS`` and ``schema.TOPIC_STEPS`` from the beginning up to the end offsets they
had when the read started (a snapshot: live traffic arriving meanwhile is not waited for), with a
throw-away consumer group that commits nothing. Batches that do not decode are counted, not fatal.
Event times are put on the realtime clock (``ts_ns + clock.offset_ns``, see ``schema.to_realtime_ns``).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

from obshub.core import kafka, schema
from obshub.export.errors import ExportError
from obshub.export.perfetto import HostEvents

QUIET_KAFKA_LOG = logging.getLogger("obshub.export.kafka")  # librdkafka noise; failures raise ExportError
QUIET_KAFKA_LOG.addHandler(logging.NullHandler())
QUIET_KAFKA_LOG.propagate = False


@dataclass
class JobData:
    """What was found for a job: ``hosts`` (sorted: rank<N> numerically, then by name), ``summaries``
    (step -> summary), and counts of ``undecodable`` batches and ``batches`` read."""

    hosts: list[HostEvents]
    summaries: dict[int, dict]
    batches: int = 0
    undecodable: int = 0
    notes: list[str] = field(default_factory=list)


def _snapshot(bootstrap: str, topic: str, timeout_s: float) -> Iterator[bytes]:
    """Every message value of ``topic`` up to its current end offsets."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    c = Consumer(kafka.consumer_config(kafka.KafkaConnection(bootstrap=bootstrap),
                                       f"obshub-export-{uuid.uuid4().hex[:8]}", {
        "enable.auto.commit": False, "auto.offset.reset": "earliest", "logger": QUIET_KAFKA_LOG}))
    try:
        try:
            md = c.list_topics(topic, timeout=min(timeout_s, 10.0))
        except KafkaException as exc:
            raise ExportError(f"Failed to reach Kafka at {bootstrap}: {exc}",
                              hint="start the broker with `obshub up` or pass --bootstrap") from None
        tmd = md.topics.get(topic)
        if tmd is None or tmd.error is not None or not tmd.partitions:
            return
        ends, parts = {}, []
        for p in tmd.partitions:
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)
            if hi > lo:
                ends[p] = hi
                parts.append(TopicPartition(topic, p, lo))
        if not parts:
            return
        c.assign(parts)
        deadline = time.monotonic() + timeout_s
        while ends and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None or m.error():
                continue
            if m.offset() + 1 >= ends.get(m.partition(), 0):
                ends.pop(m.partition(), None)
            yield m.value()
        if ends:
            raise ExportError(f"Failed to read {topic} to its end within {timeout_s:.0f} s "
                              f"({len(ends)} partition(s) short)", hint="raise --timeout-s")
    finally:
        c.close()


def _host_order(h: HostEvents):
    n = h.host[4:]
    return (0, int(n), "") if h.host.startswith("rank") and n.isdigit() else (1, 0, h.host)


def read_job(bootstrap: str, job: str, steps: tuple[int, int], *, timeout_s: float = 60.0,
             events_topic: str = schema.TOPIC_EVENTS, steps_topic: str = schema.TOPIC_STEPS) -> JobData:
    """Events of ``job`` whose step is within ``steps`` (inclusive), per host, and the job's step
    summaries in that range. Raises ExportError when the broker cannot be reached."""
    lo, hi = steps
    hosts: dict[str, HostEvents] = {}
    data = JobData([], {})
    for value in _snapshot(bootstrap, events_topic, timeout_s):
        data.batches += 1
        try:
            b = schema.decode_batch(value)
        except schema.SchemaError:
            data.undecodable += 1
            continue
        if b.job != job:
            continue
        h = hosts.setdefault(b.host, HostEvents(b.host, b.host_id))
        for e in b.events:
            if lo <= e.step <= hi:
                h.events.append(e._replace(ts_ns=schema.to_realtime_ns(e.ts_ns, b.clock)))
    for value in _snapshot(bootstrap, steps_topic, timeout_s):
        try:
            s = json.loads(value)
        except (ValueError, TypeError):
            continue
        if isinstance(s, dict) and s.get("job") == job and isinstance(s.get("step"), int) and lo <= s["step"] <= hi:
            data.summaries[s["step"]] = s  # the latest summary of a step wins
    data.hosts = sorted((h for h in hosts.values() if h.events), key=_host_order)
    if data.undecodable:
        data.notes.append(f"{data.undecodable} batch(es) on {events_topic} did not decode and were skipped")
    return data
