"""Publish replayed events as obshub batches: one agent identity per rank, fast or at recorded speed.

Every rank becomes an agent: host ``rank<N>``, host id ``N``, its own ``agent_id`` and batch sequence
from 0, so the stream application sees exactly what N live agents would send (``schema.Batch`` on
``schema.TOPIC_EVENTS``, key = host). The batch clock offset is 0: event times are the trace's own.

Ordering. The ranks' event streams are merged by a *gate* time: the largest ``ts_ns`` seen so far in the
rank's file order (Kineto files are only roughly time-ordered). With ``speed`` set, an event is sent
no earlier than ``(gate - first gate) / speed`` after the start ("recorded speed" is ``speed=1``); pending
batches are flushed before every wait so nothing sits in a buffer while the replay sleeps. Each rank's
collectives and step ends come after its other events (see :mod:`mapping`).

Batches are bounded by ``max_events`` and by an estimate of their encoded size (``max_bytes``, well
under Kafka's default 1 MiB message limit).
"""

from __future__ import annotations

import heapq
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from obshub.core import kafka, schema
from obshub.core.schema import Batch, Clock, Event
from obshub.core.settings import BATCH_MAX_BYTES
from obshub.replay.errors import ReplayError
from obshub.replay.inputs import ReplayInputs
from obshub.replay.mapping import RankTrace, map_rank

QUIET_KAFKA_LOG = logging.getLogger("obshub.replay.kafka")
"""librdkafka's own log lines (connection refused, retries) go here, not to the terminal; failures
surface as ReplayError instead."""
QUIET_KAFKA_LOG.addHandler(logging.NullHandler())
QUIET_KAFKA_LOG.propagate = False

Sink = Callable[[Batch], None]
"""Where batches go: ``KafkaSink`` for a real replay, a list's ``append`` in tests."""


@dataclass
class PublishResult:
    """Totals of one replay: ``events`` and ``batches`` per host, ``wall_s`` elapsed seconds."""

    events: dict[str, int] = field(default_factory=dict)
    batches: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0


class _RankBatcher:
    """Collects one rank's events into batches bounded by count and estimated bytes."""

    def __init__(self, rt: RankTrace, job: str, run_id: str, sink: Sink, max_events: int, max_bytes: int):
        self.rt, self.job, self.sink = rt, job, sink
        self.agent_id = f"replay-{run_id}-rank{rt.rank}"
        self.max_events, self.max_bytes = max_events, max_bytes
        self.pending: list[Event] = []
        self.est_bytes = 0
        self.seq = 0
        self.sent_events = 0

    def add(self, ev: Event) -> None:
        self.pending.append(ev)
        self.est_bytes += 64 + sum(len(v) for v in (ev.payload or {}).values() if isinstance(v, str))
        if len(self.pending) >= self.max_events or self.est_bytes >= self.max_bytes:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        b = Batch(
            self.job, self.rt.host, self.rt.rank, self.agent_id, self.seq, self.pending, Clock(0, 0, 0), time.time_ns()
        )
        self.sink(b)
        self.seq += 1
        self.sent_events += len(self.pending)
        self.pending, self.est_bytes = [], 0


def _gated(rt: RankTrace, job: str, idx: int) -> Iterator[tuple[int, int, int, Event]]:
    gate, n = 0, 0
    for ev in map_rank(rt, job):
        gate = max(gate, ev.ts_ns)
        n += 1
        yield gate, idx, n, ev


def publish(
    inputs: ReplayInputs,
    job: str,
    sink: Sink,
    *,
    speed: float | None = None,
    max_events: int = 2000,
    max_bytes: int = BATCH_MAX_BYTES,
    observe: Callable[[str, Event], None] | None = None,
) -> PublishResult:
    """Map and send every rank of ``inputs`` as job ``job``. ``speed`` None = as fast as possible, else
    the replay-time factor (1.0 = recorded speed, 10 = ten times faster). ``observe(host, event)`` sees
    every event (for the local report). Raises ReplayError for a bad job name or speed;
    TraceFormatError if a file became unreadable."""
    if not job or len(job) > schema.MAX_STR_LEN:
        raise ReplayError(f"job name {job!r} is empty or too long", hint="pass --job NAME")
    if speed is not None and not speed > 0:
        raise ReplayError(f"speed {speed} must be > 0", hint="use --speed recorded, --speed 10 or --speed fast")
    run_id = uuid.uuid4().hex[:8]
    batchers = [_RankBatcher(rt, job, run_id, sink, max_events, max_bytes) for rt in inputs.ranks]
    start = time.monotonic()
    first_gate: int | None = None
    for gate, idx, _, ev in heapq.merge(*(_gated(rt, job, i) for i, rt in enumerate(inputs.ranks))):
        if speed is not None:
            if first_gate is None:
                first_gate = gate
            due = start + (gate - first_gate) / 1e9 / speed
            if due > time.monotonic():
                for b in batchers:
                    b.flush()
                time.sleep(max(0.0, due - time.monotonic()))
        if observe is not None:
            observe(batchers[idx].rt.host, ev)
        batchers[idx].add(ev)
    for b in batchers:
        b.flush()
    return PublishResult(
        {b.rt.host: b.sent_events for b in batchers}, {b.rt.host: b.seq for b in batchers}, time.monotonic() - start
    )


EXIT_NO_BROKER = os.EX_UNAVAILABLE
"""``obshub replay``'s exit code when no broker answered, so nothing was published: 69, sysexits.h's
``EX_UNAVAILABLE`` (1: any other error)."""
CONNECT_TIMEOUT_S = 2.0
"""How long ``KafkaSink`` waits for a broker that accepts connections to answer (s). An address where
nothing listens (connection refused, a name not resolved, no answer within 1 s) fails at once."""


class KafkaSink:
    """Send batches to ``schema.TOPIC_EVENTS`` (key = host) with confluent-kafka. Raises ReplayError at
    construction (``exit_code`` ``EXIT_NO_BROKER``) when no broker listens at ``bootstrap`` (at once: it
    waited 10 s before) or none answers within ``connect_timeout_s``. Call :meth:`close` to flush; it raises
    ReplayError when any message was not delivered."""

    def __init__(
        self, bootstrap: str, topic: str = schema.TOPIC_EVENTS, *, connect_timeout_s: float = CONNECT_TIMEOUT_S
    ):
        from confluent_kafka import Producer

        from obshub.core.reach import HINT, BrokerUnreachable, require_broker, tcp_reason, unreachable_message

        # fail fast, before any trace is read: nothing listening is said at once, a broker that listens gets
        # connect_timeout_s to answer
        why = tcp_reason(bootstrap, min(1.0, connect_timeout_s))
        if why is not None:
            raise ReplayError(unreachable_message(bootstrap, why), hint=HINT, exit_code=EXIT_NO_BROKER)
        try:
            require_broker(bootstrap, connect_timeout_s)
        except BrokerUnreachable as exc:
            raise ReplayError(str(exc), hint=exc.hint, exit_code=EXIT_NO_BROKER) from None
        self.topic = topic
        self.bootstrap = bootstrap
        self.producer = Producer(
            kafka.producer_config(
                kafka.KafkaConnection(bootstrap=bootstrap),
                {
                    "linger.ms": 20,
                    "logger": QUIET_KAFKA_LOG,
                    "compression.type": "lz4",
                    "message.max.bytes": 2 * 1024 * 1024,
                },
            )
        )
        self.failed: list[str] = []
        self.sent = 0

    def _done(self, err, _msg) -> None:
        if err is not None:
            self.failed.append(str(err))

    def __call__(self, batch: Batch) -> None:
        data = schema.encode_batch(batch)
        while True:
            try:
                self.producer.produce(self.topic, key=batch.host.encode(), value=data, on_delivery=self._done)
                break
            except BufferError:
                self.producer.poll(0.1)
        self.producer.poll(0)
        self.sent += 1

    def close(self, timeout_s: float = 30.0) -> None:
        """Wait for delivery. Raises ReplayError naming the first failure."""
        left = self.producer.flush(timeout_s)
        if left:
            raise ReplayError(
                f"Failed to deliver {left} of {self.sent} batches to {self.bootstrap} within {timeout_s:.0f} s",
                hint="is the broker up? run `obshub status`",
            )
        if self.failed:
            raise ReplayError(
                f"Failed to deliver {len(self.failed)} batches to topic {self.topic} at "
                f"{self.bootstrap}: {self.failed[0]}",
                hint="check `obshub status` and the broker log",
            )
