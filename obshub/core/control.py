"""The agents' control topic, the contract every stage shares: requests to the agent of one host, today
only the deep dive (attach the per-call probes of the deep-dive tier for ``steps`` training steps, at
most ``max_s`` seconds, then detach them).

Who asks: an operator (``obshub deep-dive --host H``: :func:`request_deep_dive`), or the hub
automatically (:class:`DeepDiveTrigger`, used by the rule engine's ``deep_dive`` sink,
``obshub/rules/sinks/deep_dive.py``, when a rule or the straggler analysis names a host). The agent's side
(a listener per agent) is ``obshub.producer.control.ControlListener``.

Message (JSON, key = host): ``{"action": "deep_dive", "host": str, "steps": int in 1..100000, "max_s":
float in (0, 86400], "ts_ns": int in 1..2**63-1 (CLOCK_REALTIME ns of the request), "by": str}``. A malformed message is refused naming the
field (:func:`parse_request`); the agent logs it and skips it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

from obshub.core.kafka import KafkaConnection, admin_config, producer_config

log = logging.getLogger("obshub.control")

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


MAX_STEPS = 100_000  # as `obshub deep-dive --steps` and the deep_dive sink's `steps`


def parse_request(raw: bytes | None) -> DeepDive:
    """A control message (its Kafka value; None for a tombstone) -> :class:`DeepDive`. Raises ValueError
    naming the field that is wrong, for any input: no value, bytes that are not UTF-8 JSON, JSON nested too
    deep for the decoder, numbers out of their range (``steps`` 1..100000, ``max_s`` (0, 86400], ``ts_ns``
    1..2**63-1: an agent compares it with its clock as a float)."""
    if raw is None:
        raise ValueError("control message has no value (a tombstone)")
    try:
        d = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError, TypeError) as exc:
        why = "nested too deep" if isinstance(exc, RecursionError) else str(exc)
        raise ValueError(f"control message is not JSON: {why}") from None
    if not isinstance(d, dict) or d.get("action") != "deep_dive":
        what = d.get("action") if isinstance(d, dict) else d
        raise ValueError(f"control message action {_short(what)} is not 'deep_dive'")
    host, steps, max_s, ts = d.get("host"), d.get("steps"), d.get("max_s"), d.get("ts_ns")
    if not isinstance(host, str) or not host:
        raise ValueError(f"deep_dive: host {_short(host)} is not a host name")
    if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"deep_dive: steps {_short(steps)} is not an integer in 1..{MAX_STEPS}")
    if not isinstance(max_s, (int, float)) or isinstance(max_s, bool) or not 0 < max_s <= 86400:
        raise ValueError(f"deep_dive: max_s {_short(max_s)} is not a number of seconds in (0, 86400]")
    if not isinstance(ts, int) or isinstance(ts, bool) or not 0 < ts < 2**63:
        raise ValueError(f"deep_dive: ts_ns {_short(ts)} is not an integer in 1..2**63-1 (ns)")
    return DeepDive(host, steps, float(max_s), ts, str(d.get("by", "")))


def _short(v: Any) -> str:
    """``repr(v)`` cut to 80 characters (a log line must not carry a megabyte of someone's message);
    an int too long to print in decimal is named by its bit length."""
    try:
        text = repr(v)
    except ValueError:  # int beyond sys.get_int_max_str_digits()
        return f"<an integer of {v.bit_length()} bits>"
    return text if len(text) <= 80 else text[:77] + "..."


def encode_request(req: DeepDive) -> bytes:
    """The control message of ``req`` (JSON bytes). Raises ValueError when the agent would refuse it."""
    body = json.dumps({"action": "deep_dive", **req.__dict__}).encode()
    parse_request(body)  # the same checks the agent makes
    return body


def ensure_control_topic(conn: KafkaConnection, timeout_s: float = 10.0) -> None:
    """Create :data:`CONTROL_TOPIC` (1 partition, 1 h retention) unless it exists. Raises the
    broker's error (anything but "already exists")."""
    from confluent_kafka import KafkaException
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
    except KafkaException as exc:
        if "already exists" not in str(exc).lower():
            raise


def _send(producer: Any, body: bytes, host: str, timeout_s: float) -> None:
    errors: list = []

    def delivered(err: Any, _msg: Any) -> None:
        if err:
            errors.append(err)

    producer.produce(CONTROL_TOPIC, body, key=host.encode(), on_delivery=delivered)
    left = producer.flush(timeout_s)
    if left or errors:
        raise RuntimeError(f"Failed to send the deep-dive request for {host} to {CONTROL_TOPIC}: {errors or 'timeout'}")


def request_deep_dive(
    conn: KafkaConnection, host: str, steps: int = 20, max_s: float = 120.0, by: str = ""
) -> DeepDive:
    """Ask the agent of ``host`` for a deep dive of ``steps`` steps (at most ``max_s`` s). Returns the
    request sent. Raises ValueError for a bad argument, RuntimeError when the broker did not take it."""
    from confluent_kafka import Producer

    req = DeepDive(host, steps, float(max_s), time.time_ns(), by)
    body = encode_request(req)
    ensure_control_topic(conn)
    _send(Producer(producer_config(conn, quiet=True)), body, host, 15.0)
    return req


class DeepDiveTrigger:
    """The hub's automatic deep dive: :meth:`request` asks the agent of a host for a deep dive of
    ``steps`` steps (at most ``max_s`` s), rate-limited so that a straggler that stays slow, or a storm of
    alerts across a fleet, cannot keep the per-launch probes attached:

    * per host: at most one request every ``host_every_s`` seconds (default 600 s: a deep dive of 20
      steps of 1 s and its analysis fit well inside it);
    * overall: at most ``max_per_hour`` requests in any rolling hour (default 12), whatever the hosts.

    A request refused by the limits is counted in :attr:`limited` and logged once per host per window;
    :attr:`sent` lists the requests sent. One producer is kept for the trigger's life (created at the
    first request; the control topic is created then if missing). ``clock`` (monotonic s) is for tests.
    Thread-safe."""

    def __init__(
        self,
        conn: KafkaConnection,
        steps: int = 20,
        max_s: float = 120.0,
        host_every_s: float = 600.0,
        max_per_hour: int = 12,
        clock: Callable[[], float] = time.monotonic,
    ):
        if steps < 1 or not 0 < max_s <= 86400 or host_every_s < 0 or max_per_hour < 1:
            raise ValueError(
                f"deep-dive trigger: steps={steps!r} must be >= 1, max_s={max_s!r} in (0, 86400], "
                f"host_every_s={host_every_s!r} >= 0, max_per_hour={max_per_hour!r} >= 1"
            )
        self.conn, self.steps, self.max_s = conn, steps, float(max_s)
        self.host_every_s, self.max_per_hour, self.clock = host_every_s, max_per_hour, clock
        self.sent: list[DeepDive] = []
        self.limited = 0
        self._last: dict[str, float] = {}  # host -> monotonic s of its last request
        self._hour: deque[float] = deque()  # monotonic s of the requests of the last hour
        self._producer: Any = None
        self._lock = threading.Lock()

    def allowed(self, host: str) -> str:
        """'' when a request for ``host`` would be sent now, else why not (the limit that holds it)."""
        now = self.clock()
        while self._hour and now - self._hour[0] >= 3600:
            self._hour.popleft()
        last = self._last.get(host)
        if last is not None and now - last < self.host_every_s:
            return f"{host} was asked {now - last:.0f} s ago (at most one request per {self.host_every_s:g} s a host)"
        if len(self._hour) >= self.max_per_hour:
            return f"{len(self._hour)} deep dives asked in the last hour (at most {self.max_per_hour})"
        return ""

    def request(self, host: str, by: str = "") -> DeepDive | None:
        """Ask ``host``'s agent for a deep dive unless a limit holds it. Returns the request sent, or None
        when rate-limited. Raises ValueError for a bad host name, RuntimeError when the broker did not take
        the request (the limits then do not count it: the next alert may try again)."""
        from confluent_kafka import Producer

        with self._lock:
            why = self.allowed(host)
            if why:
                self.limited += 1
                log.info("deep dive for %s not asked (%s): %s", host, by or "?", why)
                return None
            req = DeepDive(host, self.steps, self.max_s, time.time_ns(), by)
            body = encode_request(req)
            if self._producer is None:
                ensure_control_topic(self.conn)
                self._producer = Producer(producer_config(self.conn, quiet=True))
            _send(self._producer, body, host, 10.0)
            now = self.clock()
            self._last[host] = now
            self._hour.append(now)
            self.sent.append(req)
            log.info("deep dive asked of %s: %d steps, at most %g s (%s)", host, req.steps, req.max_s, by or "?")
            return req
