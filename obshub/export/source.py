"""Read one job's events and step summaries back from Kafka for export.

Reads ``schema.TOPIC_STEPS`` and then ``schema.TOPIC_EVENTS`` up to the end offsets they had when the
read started (a snapshot: live traffic arriving meanwhile is not waited for), with a throw-away consumer
group that commits nothing. Neither topic is read from its oldest message when a time range is known:
``snapshot`` starts each partition at the offset of the first message at or after ``since`` (Kafka's
offsets-for-times lookup on message timestamps) and stops at the first one after ``until``. The events
of the requested steps are read from ``EVENTS_BEFORE_S`` before the first of their summaries was closed
to ``EVENTS_AFTER_S`` after the last (a step's batches are sent while it runs, its summary closes at most
a window later); without summaries in range, the whole events topic within ``since``/``until`` is read.
Messages that do not decode are counted and the first ``MAX_NOTED`` listed in ``JobData.notes``
(topic[partition]@offset: field: problem), never fatal.
Event times are put on the realtime clock (``ts_ns + clock.offset_ns``, see ``schema.to_realtime_ns``).

Lives: a restarted job numbers its steps again (summaries carry ``life``; docs/STREAMS.md "Restarts"), so
one step number can hold the events of several lives. ``life=N`` keeps the summaries of life N and the
events of its processes: the job's processes are grouped into generations (processes whose events overlap
in time, across all hosts, belong to one; a restart's new processes start after the old ones stopped), and
the generation most of life N's summaries closed in (the latest one started before each ``closed_at_ns``)
is kept, with the host's own events (pid 0) inside its time span (:func:`keep_life`).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

from obshub.core import kafka, schema
from obshub.export.errors import ExportError
from obshub.export.perfetto import HostEvents

CONNECT_TIMEOUT_S = 10.0  # an unreachable broker is reported after this long
MAX_NOTED = 3  # unusable messages listed by location and reason; the rest are counted
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
    lives: set[int] = field(default_factory=set)  # the lives of the job's summaries in the steps asked


def generations(hosts: dict[str, HostEvents]) -> list[tuple[int, int, set[tuple[str, int]]]]:
    """Group the job's processes into generations: ``[(start_ns, end_ns, {(host, pid), ...})]`` in time
    order, where the processes of one generation have overlapping event spans (realtime ns; pids <= 0,
    the host's own events, belong to none)."""
    spans: dict[tuple[str, int], list[int]] = {}
    for h in hosts.values():
        for e in h.events:
            if e.pid > 0:
                sp = spans.get((h.host, e.pid))
                if sp is None:
                    spans[(h.host, e.pid)] = [e.ts_ns, e.ts_ns]
                elif e.ts_ns < sp[0]:
                    sp[0] = e.ts_ns
                elif e.ts_ns > sp[1]:
                    sp[1] = e.ts_ns
    out: list[tuple[int, int, set[tuple[str, int]]]] = []
    for key, (a, b) in sorted(spans.items(), key=lambda kv: kv[1][0]):
        if out and a <= out[-1][1]:
            lo, hi, members = out[-1]
            members.add(key)
            out[-1] = (lo, max(hi, b), members)
        else:
            out.append((a, b, {key}))
    return out


def keep_life(hosts: dict[str, HostEvents], closed_ns: list[int]) -> None:
    """Keep, in place, only the events of the generation (:func:`generations`) that the summaries closed at
    ``closed_ns`` (realtime ns) belong to: each close votes for the latest generation started before it;
    the most voted wins. The host's own events (pid <= 0) are kept inside that generation's span. With no
    vote (no summary), nothing is dropped."""
    gens = generations(hosts)
    votes: dict[int, int] = {}
    for t in closed_ns:
        i = max((k for k, g in enumerate(gens) if g[0] <= t), default=None)
        if i is not None:
            votes[i] = votes.get(i, 0) + 1
    if not votes:
        return
    lo, hi, members = gens[max(votes, key=lambda k: (votes[k], k))]
    for h in hosts.values():
        h.events = [e for e in h.events if ((h.host, e.pid) in members if e.pid > 0 else lo <= e.ts_ns <= hi)]


#: the latest time they take: the last whole second of int64 ns since 1970 (2262-04-11T23:47:16Z); Kafka's
#: timestamps start at 1970-01-01T00:00:00Z, the earliest
MAX_WHEN_NS = schema.I64_MAX // 1_000_000_000 * 1_000_000_000


def parse_when(text: str, now_ns: int | None = None) -> int:
    """A point in time for ``--since``/``--until``: a duration ago (``30m``, ``2h``, ``1d``, as in rule
    files; at most ``3650d``, as there: ``99999999999h`` ago was 11 million years before 1970, a negative
    time that ``offsets_for_times`` silently read as "from the oldest message") or an ISO 8601 / RFC 3339 time (``2026-12-01T02:00:00Z``;
    no zone = UTC) from 1970-01-01T00:00:00Z to 2262-04-11T23:47:16Z. Returns CLOCK_REALTIME ns (>= 0).
    Raises ValueError naming the text and, for one out of range, the largest (earliest) value accepted."""
    from datetime import datetime, timezone

    from obshub.rules.durations import MAX_DURATION_NS, parse_duration_ns

    now_ns = time.time_ns() if now_ns is None else now_ns
    try:
        ago = parse_duration_ns(text)
    except ValueError:
        ago = None
    if ago is not None:
        if ago > MAX_DURATION_NS:
            raise ValueError(f"{text!r} ago is too far back: the largest duration accepted is 3650d (10 years)")
        return max(now_ns - ago, 0)
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a duration ago (30m, 2h, 1d) nor a time (2026-12-01T02:00:00Z)"
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    ns = int(dt.timestamp()) * 1_000_000_000 + dt.microsecond * 1_000  # exact: no float rounding of the ns
    if not 0 <= ns <= MAX_WHEN_NS:
        raise ValueError(
            f"{text!r} is outside the times accepted: from 1970-01-01T00:00:00Z (Kafka's first timestamp) to "
            "2262-04-11T23:47:16Z (the largest, the last second of int64 ns)"
        )
    return ns


EVENTS_BEFORE_S = 600.0
EVENTS_AFTER_S = 60.0


def snapshot(
    bootstrap: str,
    topic: str,
    timeout_s: float,
    *,
    since_ns: int | None = None,
    until_ns: int | None = None,
    log=QUIET_KAFKA_LOG,
) -> Iterator:
    """Every message (confluent_kafka Message) of ``topic`` up to its current end offsets, restricted to messages whose
    Kafka timestamp (ms) is within [``since_ns``, ``until_ns``] when given: each partition starts at
    ``offsets_for_times(since)`` and ends at ``offsets_for_times(until)``, so nothing outside is read.
    Raises ExportError when Kafka cannot be reached or the read does not finish within ``timeout_s``."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    from obshub.core.reach import BrokerUnreachable, require_broker

    try:
        require_broker(bootstrap, min(timeout_s, CONNECT_TIMEOUT_S), refused_fails=True)
    except BrokerUnreachable as exc:
        raise ExportError(str(exc), hint=exc.hint) from None
    c = Consumer(
        kafka.consumer_config(
            kafka.KafkaConnection(bootstrap=bootstrap),
            f"obshub-export-{uuid.uuid4().hex[:8]}",
            {"enable.auto.commit": False, "auto.offset.reset": "earliest", "logger": log},
        )
    )
    try:
        try:
            md = c.list_topics(topic, timeout=min(timeout_s, 10.0))
        except KafkaException as exc:
            raise ExportError(
                f"Failed to reach Kafka at {bootstrap}: {exc}",
                hint="start the broker with `obshub up` or pass --bootstrap",
            ) from None
        tmd = md.topics.get(topic)
        if tmd is None or tmd.error is not None or not tmd.partitions:
            return
        bounds = {}
        for p in tmd.partitions:
            bounds[p] = list(c.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s))
        for ns, idx in ((since_ns, 0), (until_ns, 1)):
            if ns is None:
                continue
            ms = max(0, ns // 1_000_000 + (1 if idx == 1 else 0))  # until: first message strictly after
            found = c.offsets_for_times([TopicPartition(topic, p, ms) for p in bounds], timeout=timeout_s)
            for tp in found:
                lo_hi = bounds[tp.partition]
                lo_hi[idx] = tp.offset if tp.offset >= 0 else lo_hi[1]  # -1: no message that late
        ends, parts = {}, []
        for p, (lo, hi) in bounds.items():
            if hi > lo:
                ends[p] = hi
                parts.append(TopicPartition(topic, p, lo))
        if not parts:
            return
        c.assign(parts)
        deadline = time.monotonic() + timeout_s
        while ends and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                # nothing more now: a partition whose position passed its end is done even though its last
                # offset was never delivered (a transaction's commit marker: the rule engine's alert changes)
                for tp in c.position([TopicPartition(topic, p) for p in ends]):
                    if tp.offset >= ends[tp.partition]:
                        del ends[tp.partition]
                continue
            if m.error() or m.partition() not in ends:
                continue
            end = ends[m.partition()]
            if m.offset() + 1 >= end:
                del ends[m.partition()]
                c.pause([TopicPartition(topic, m.partition())])
            if m.offset() < end:
                yield m
        if ends:
            raise ExportError(
                f"Failed to read {topic} to its end within {timeout_s:.0f} s ({len(ends)} partition(s) short)",
                hint="raise --timeout-s",
            )
    finally:
        c.close()


def _host_order(h: HostEvents):
    n = h.host[4:]
    return (0, int(n), "") if h.host.startswith("rank") and n.isdigit() else (1, 0, h.host)


def read_job(
    bootstrap: str,
    job: str,
    steps: tuple[int, int],
    *,
    timeout_s: float = 60.0,
    events_topic: str = schema.TOPIC_EVENTS,
    steps_topic: str = schema.TOPIC_STEPS,
    since_ns: int | None = None,
    until_ns: int | None = None,
    life: int | None = None,
) -> JobData:
    """Events of ``job`` whose step is within ``steps`` (inclusive), per host, and the job's step
    summaries in that range; ``since_ns``/``until_ns`` (CLOCK_REALTIME ns) bound the Kafka timestamps
    read; ``life``: only that life of a restarted job (module docstring; None: every life, and
    ``JobData.lives`` says which were found). Raises ExportError when the broker cannot be reached."""
    lo, hi = steps
    hosts: dict[str, HostEvents] = {}
    data = JobData([], {})
    closed = []
    bad: list[str] = []
    bad_steps = 0
    for m in snapshot(bootstrap, steps_topic, timeout_s, since_ns=since_ns, until_ns=until_ns):
        try:
            s = schema.decode_step_summary(m.value())
        except schema.SchemaError as exc:
            bad_steps += 1
            bad.append(f"{m.topic()}[{m.partition()}]@{m.offset()}: {exc}")
            continue
        if s.get("job") == job and isinstance(s.get("step"), int) and lo <= s["step"] <= hi:
            s_life = s.get("life") if isinstance(s.get("life"), int) else 0
            data.lives.add(s_life)
            if life is not None and s_life != life:
                continue
            data.summaries[s["step"]] = s  # the latest summary of a step wins
            if isinstance(s.get("closed_at_ns"), int) and s["closed_at_ns"] > 0:
                closed.append(s["closed_at_ns"])
    ev_since, ev_until = since_ns, until_ns
    if closed and len(data.summaries) == hi - lo + 1:  # every step has a summary: its time bounds the events
        ev_since = max(since_ns or 0, min(closed) - int(EVENTS_BEFORE_S * 1e9))
        ev_until = min(until_ns or (1 << 62), max(closed) + int(EVENTS_AFTER_S * 1e9))
    for m in snapshot(bootstrap, events_topic, timeout_s, since_ns=ev_since, until_ns=ev_until):
        data.batches += 1
        try:
            b = schema.decode_batch(m.value())
        except schema.SchemaError as exc:
            data.undecodable += 1
            bad.append(f"{m.topic()}[{m.partition()}]@{m.offset()}: {exc}")
            continue
        if b.job != job:
            continue
        h = hosts.setdefault(b.host, HostEvents(b.host, b.host_id))
        for e in b.events:
            if lo <= e.step <= hi:
                h.events.append(e._replace(ts_ns=schema.to_realtime_ns(e.ts_ns, b.clock)))
    if life is not None:
        keep_life(hosts, closed)
    data.hosts = sorted((h for h in hosts.values() if h.events), key=_host_order)
    if data.undecodable:
        data.notes.append(
            f"{data.undecodable} batch(es) on {events_topic} did not decode and were skipped (of any job: a "
            "message that does not decode names none; the worker dead-letters them to obshub.dlq.v1 with the reason)"
        )
    if bad_steps:
        data.notes.append(f"{bad_steps} step summary(ies) on {steps_topic} did not decode and were skipped")
    data.notes += [f"skipped {where}" for where in bad[:MAX_NOTED]]
    if len(bad) > MAX_NOTED:
        data.notes.append(f"... and {len(bad) - MAX_NOTED} more")
    return data
