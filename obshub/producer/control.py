"""The agent's side of the control topic (:mod:`obshub.core.control`: the message contract, the
operator's :func:`request_deep_dive` and the hub's rate-limited :class:`DeepDiveTrigger`): a listener that
hands the deep-dive requests for its host to the agent.

Each agent reads the topic's one partition from the beginning and acts on the requests for its host that
were made after it started and are still valid (``ts_ns + max_s`` not passed), so a request made while the
agent (re)starts is neither lost nor replayed on the next start. A malformed message is logged with what
was wrong and skipped; it never stops the agent.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Callable

from obshub.core.control import (
    CONTROL_RETENTION_MS,
    CONTROL_TOPIC,
    DeepDive,
    DeepDiveTrigger,
    ensure_control_topic,
    parse_request,
    request_deep_dive,
)
from obshub.core.kafka import KafkaConnection, consumer_config

__all__ = [
    "CONTROL_RETENTION_MS",
    "CONTROL_TOPIC",
    "ControlListener",
    "DeepDive",
    "DeepDiveTrigger",
    "ensure_control_topic",
    "parse_request",
    "request_deep_dive",
]

log = logging.getLogger("producer.control")


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
        self.failed = 0  # requests whose handler raised (obshub_agent_caught_errors{where="deep_dive"})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="obshub-control", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

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
            except KafkaException as exc:
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

    def _handle(self, raw: bytes | None) -> None:
        """Act on one message value of the topic (None: a tombstone). Never raises: a malformed message is
        logged and skipped, a failing handler logged and counted (``failed``); the thread, and with it every
        later request, lives on (a deeply nested JSON message or a tombstone used to end it)."""
        try:
            req = parse_request(raw)
        except ValueError as exc:
            log.warning("skipping a message of %s: %s", CONTROL_TOPIC, exc)
            return
        if req.host != self.host or req.ts_ns < self.since_ns or time.time_ns() > req.ts_ns + req.max_s * 1e9:
            return
        try:
            self.on_deep_dive(req)
        except Exception as exc:  # noqa: BLE001 - the agent's handler must not end the listener: logged, counted
            self.failed += 1
            log.warning("deep-dive request of %s failed: %s", req.by or "?", exc)

    def close(self) -> None:
        """Stop the thread (waits up to 2 s)."""
        self._stop.set()
        self._thread.join(2.0)
