"""The agents' control topic: requests to an agent of one host, today only the deep dive (attach the
per-call probes of the deep-dive tier, ``ProbeOptions.deep_dive``, for ``steps`` training steps, at most
``max_s`` seconds, then detach them).

Who asks: an operator (``obshub deep-dive --host H``), or the hub (a rule or the straggler analysis
that points at a host calls :func:`request_deep_dive`). Each agent reads the topic's one partition from
the beginning and acts on the requests for its host that were made after it started and are still
valid (``ts_ns + max_s`` not passed), so a request made while the agent (re)starts is neither lost nor
replayed on the next start.

Message (JSON, key = host): ``{"action": "deep_dive", "host": str, "steps": int >= 1, "max_s": float > 0,
"ts_ns": int (CLOCK_REALTIME ns of the request), "by": str}``. A malformed message is logged with what
was wrong and skipped; it never stops the agent.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable

from obshub.core.kafka import KafkaConnection, admin_config, consumer_config, producer_config

log = logging.getLogger("producer.control")

#: the control topic: one partition (requests stay in order), kept one hour
CONTROL_TOPIC = "obshub.control.v1"
CONTROL_RETENTION_MS = 3600 * 1000


@dataclass(frozen=True)
class DeepDive:
    """A deep-dive request: for ``host``, ``steps`` steps (counted per process: every registered rank of
    the host ends that many), at most ``max_s`` s; made at ``ts_ns`` (CLOCK_REALTIME ns) by ``by``."""

    host: str
    steps: int
    max_s: float
    ts_ns: int
    by: str = ""


def parse_request(raw: bytes) -> DeepDive:
    """A control message -> :class:`DeepDive`. Raises ValueError naming the field that is wrong."""
    try:
        d = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"control message is not JSON: {exc}") from None
    if not isinstance(d, dict) or d.get("action") != "deep_dive":
        raise ValueError(f"control message action {d.get('action') if isinstance(d, dict) else d!r} is not 'deep_dive'")
    host, steps, max_s, ts = d.get("host"), d.get("steps"), d.get("max_s"), d.get("ts_ns")
    if not isinstance(host, str) or not host:
        raise ValueError(f"deep_dive: host {host!r} is not a host name")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"deep_dive: steps {steps!r} is not an integer >= 1")
    if not isinstance(max_s, (int, float)) or isinstance(max_s, bool) or not 0 < max_s <= 86400:
        raise ValueError(f"deep_dive: max_s {max_s!r} is not a number of seconds in (0, 86400]")
    if not isinstance(ts, int) or isinstance(ts, bool) or ts <= 0:
        raise ValueError(f"deep_dive: ts_ns {ts!r} is not a positive integer")
    return DeepDive(host, steps, float(max_s), ts, str(d.get("by", "")))


def ensure_control_topic(conn: KafkaConnection, timeout_s: float = 10.0) -> None:
    """Create :data:`CONTROL_TOPIC` (1 partition, 1 h retention) unless it exists. Raises the
    broker's error (anything but "already exists")."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from obshub.core.topics import replication_factor

    admin = AdminClient(admin_config(conn, quiet=True))
    if CONTROL_TOPIC in admin.list_topics(timeout=timeout_s).topics:
        return
    fut = admin.create_topics(
        [NewTopic(CONTROL_TOPIC, 1, replication_factor(), config={"retention.ms": str(CONTROL_RETENTION_MS)})],
        operation_timeout=timeout_s,
    )[CONTROL_TOPIC]
    try:
        fut.result()
    except Exception as exc:
        if "already exists" not in str(exc).lower():
            raise


def request_deep_dive(
    conn: KafkaConnection, host: str, steps: int = 20, max_s: float = 120.0, by: str = ""
) -> DeepDive:
    """Ask the agent of ``host`` for a deep dive of ``steps`` steps (at most ``max_s`` s). Returns the
    request sent. Raises ValueError for a bad argument, RuntimeError when the broker did not take it."""
    from confluent_kafka import Producer

    req = DeepDive(host, steps, float(max_s), time.time_ns(), by)
    body = json.dumps({"action": "deep_dive", **req.__dict__}).encode()
    parse_request(body)  # the same checks the agent makes
    ensure_control_topic(conn)
    producer = Producer(producer_config(conn, quiet=True))
    errors: list = []
    producer.produce(CONTROL_TOPIC, body, key=host.encode(), on_delivery=lambda err, _m: err and errors.append(err))
    left = producer.flush(15)
    if left or errors:
        raise RuntimeError(f"Failed to send the deep-dive request for {host} to {CONTROL_TOPIC}: {errors or 'timeout'}")
    return req


class ControlListener:
    """A daemon thread reading :data:`CONTROL_TOPIC` for ``host``: calls ``on_deep_dive(request)`` for
    every valid request made at or after ``since_ns`` (CLOCK_REALTIME ns; default: now) and not expired.
    The topic is created when missing; while the broker is unreachable the thread retries every
    ``retry_s``. ``close()`` stops it. Costs the agent one consumer poll per ``poll_s`` (0.2 s)."""

    def __init__(
        self,
        conn: KafkaConnection,
        host: str,
        on_deep_dive: Callable[[DeepDive], None],
        since_ns: int | None = None,
        poll_s: float = 0.2,
        retry_s: float = 5.0,
    ):
        self.conn, self.host, self.on_deep_dive = conn, host, on_deep_dive
        self.since_ns = time.time_ns() if since_ns is None else since_ns
        self.poll_s, self.retry_s = poll_s, retry_s
        self.ready = threading.Event()  # set once the partition is assigned
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="obshub-control", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        consumer = None
        while not self._stop.is_set() and consumer is None:
            try:
                ensure_control_topic(self.conn)
                conf = consumer_config(
                    self.conn,
                    f"obshub-agent-control-{self.host}-{uuid.uuid4().hex[:8]}",
                    {"enable.auto.commit": False, "auto.offset.reset": "earliest"},
                    quiet=True,
                )
                consumer = Consumer(conf)
                consumer.assign([TopicPartition(CONTROL_TOPIC, 0, OFFSET_BEGINNING)])
            except Exception as exc:
                log.warning("control topic %s not reachable (%s); retrying in %.0f s", CONTROL_TOPIC, exc, self.retry_s)
                self._stop.wait(self.retry_s)
        if consumer is None:
            return
        self.ready.set()
        try:
            while not self._stop.is_set():
                msg = consumer.poll(self.poll_s)
                if msg is None or msg.error():
                    continue
                self._handle(msg.value())
        finally:
            consumer.close()

    def _handle(self, raw: bytes) -> None:
        try:
            req = parse_request(raw)
        except ValueError as exc:
            log.warning("skipping a message of %s: %s", CONTROL_TOPIC, exc)
            return
        if req.host != self.host or req.ts_ns < self.since_ns or time.time_ns() > req.ts_ns + req.max_s * 1e9:
            return
        try:
            self.on_deep_dive(req)
        except Exception as exc:  # the agent's handler must not end the listener
            log.warning("deep-dive request of %s failed: %s", req.by or "?", exc)

    def close(self) -> None:
        """Stop the thread (waits up to 2 s)."""
        self._stop.set()
        self._thread.join(2.0)
