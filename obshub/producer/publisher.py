"""Kafka publisher: one confluent-kafka (librdkafka) idempotent producer, its delivery reports and its
back-pressure. It knows nothing about spools or ordering policy: :mod:`producer.transport` drives it.

Producer settings (see :meth:`obshub.core.settings.KafkaConfig.librdkafka_config`): ``enable.idempotence``
(librdkafka: no duplicates from its own retries, ordering kept per partition, ``acks=all``), compression
(lz4 by default), ``linger.ms``, no ``message.timeout.ms`` (librdkafka never fails a message by age: the
transport times deliveries with :meth:`Publisher.oldest_outstanding_s` and purges the whole queue at once,
so no newer batch is delivered after an older one failed), bounded in-memory queue.

Delivery reports are served by :meth:`Publisher.poll`, which the agent calls every loop turn. When
librdkafka's queue is full, :meth:`Publisher.produce` polls (serving reports, which frees the queue) and
retries for up to ``max_block_ms``, counting each wait in ``backpressure_waits``; it returns False when
the queue is still full then, and the caller spools the batch. It never raises BufferError.

Errors: :class:`producer.errors.TransportError` when librdkafka rejects the configuration.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Callable

from confluent_kafka import KafkaError, KafkaException, Producer

from obshub.core import schema
from obshub.core.settings import KafkaConfig
from obshub.producer.errors import TransportError

log = logging.getLogger("producer.kafka")  # librdkafka's own log lines
alert = logging.getLogger("producer.publisher")  # errors an operator must fix (auth, TLS, ACLs)

_OPERATOR_ERRORS = {
    KafkaError._AUTHENTICATION,
    KafkaError._SSL,
    KafkaError.SASL_AUTHENTICATION_FAILED,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError._INVALID_ARG,
}
_ALERT_EVERY_S = 30.0

DeliveryCallback = Callable[[KafkaError | None], None]


class Publisher:
    """Publishes encoded batches to ``topic`` (default ``obshub.events.v1``).

    ``on_broker_down``: called (from :meth:`poll`) when librdkafka reports that every broker is down
    (``_ALL_BROKERS_DOWN``), so the caller can spool early instead of waiting for delivery timeouts.

    Counters: ``produced`` (batches enqueued), ``delivered`` / ``delivered_bytes`` (acknowledged by the
    broker), ``delivery_errors`` (reports with an error other than a purge), ``purged`` (messages the
    caller purged), ``backpressure_waits`` (times ``produce`` found the queue full), ``outstanding``
    (enqueued, report not yet served). ``fatal``: the fatal KafkaError if librdkafka raised one (the
    producer must then be replaced).
    """

    def __init__(
        self, kafka: KafkaConfig, topic: str = schema.TOPIC_EVENTS, on_broker_down: Callable[[], None] | None = None
    ):
        self.topic = topic
        self.max_block_s = kafka.max_block_ms / 1000
        self._on_broker_down = on_broker_down
        conf = kafka.librdkafka_config()
        conf["error_cb"] = self._error
        conf["logger"] = log
        try:
            self._producer = Producer(conf)
        except (KafkaException, ValueError, TypeError) as exc:
            raise TransportError(
                f"Failed to create the Kafka producer for {kafka.bootstrap}: {exc}",
                "check the --bootstrap and security options (librdkafka CONFIGURATION.md)",
            ) from exc
        self.produced = 0
        self.delivered = 0
        self.delivered_bytes = 0
        self.delivery_errors = 0
        self.purged = 0
        self.backpressure_waits = 0
        self.outstanding = 0
        self.fatal: KafkaError | None = None
        self.last_error: str = ""
        self._alerted: dict[int, float] = {}
        # [monotonic enqueue time, report served] per message, in produce order (oldest_outstanding_s)
        self._times: deque[list] = deque()

    def _error(self, err: KafkaError) -> None:
        self.last_error = err.str()
        if err.fatal():
            self.fatal = err
            alert.error("fatal Kafka producer error (the producer is replaced): %s", err.str())
        elif err.code() in _OPERATOR_ERRORS:
            now = time.monotonic()
            if now - self._alerted.get(err.code(), -_ALERT_EVERY_S) >= _ALERT_EVERY_S:
                self._alerted[err.code()] = now
                alert.error("Kafka: %s (batches are kept in the spool; check the security options)", err.str())
        if err.code() == KafkaError._ALL_BROKERS_DOWN and self._on_broker_down is not None:
            self._on_broker_down()

    def produce(self, key: bytes, value: bytes, on_done: DeliveryCallback) -> bool:
        """Enqueue one message; ``on_done(err)`` is called from a later :meth:`poll` with None on
        delivery or the KafkaError. Waits while the queue is full (back-pressure) up to ``max_block_ms``;
        returns False when it is still full, or when librdkafka refuses the message (a fatal producer
        error): nothing was enqueued and ``on_done`` will not be called."""
        size = len(value)
        entry = [0.0, False]

        def report(err, _msg):
            self.outstanding -= 1
            entry[1] = True
            if err is None:
                self.delivered += 1
                self.delivered_bytes += size
            elif err.code() in (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT):
                self.purged += 1
            else:
                self.delivery_errors += 1
                self.last_error = err.str()
            on_done(err)

        deadline = None
        while True:
            try:
                self._producer.produce(self.topic, value, key, on_delivery=report)
            except KafkaException as exc:  # a fatal producer state: the caller spools, then replaces us
                err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                if err is not None and err.fatal():
                    self.fatal = err
                self.last_error = str(exc)
                return False
            except BufferError:
                self.backpressure_waits += 1
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.max_block_s
                elif now >= deadline:
                    return False
                self._producer.poll(0.005)
                continue
            self.produced += 1
            self.outstanding += 1
            entry[0] = time.monotonic()
            self._times.append(entry)
            return True

    def oldest_outstanding_s(self, now: float | None = None) -> float:
        """Seconds since the oldest message whose report is not served yet was enqueued (``now``: a
        ``time.monotonic()`` value; default the current one); 0.0 when nothing is outstanding."""
        times = self._times
        while times and times[0][1]:
            times.popleft()
        if not times:
            return 0.0
        return max(0.0, (time.monotonic() if now is None else now) - times[0][0])

    def poll(self, timeout_s: float = 0.0) -> int:
        """Serve delivery reports and error callbacks, waiting up to ``timeout_s``; returns the number of
        events served."""
        return self._producer.poll(timeout_s)

    def purge_queued(self) -> None:
        """Fail (with ``_PURGE_QUEUE``) every message not yet sent to a broker; their reports come with the
        next :meth:`poll`. Used to keep order when the transport switches to the spool."""
        self._producer.purge(in_queue=True, in_flight=False, blocking=False)

    def purge_all(self) -> None:
        """Also abandon messages in flight (their fate is unknown: they may still be written, so a
        replay from the spool may duplicate them). Used at shutdown and before replacing the producer."""
        self._producer.purge(in_queue=True, in_flight=True, blocking=False)

    def close(self) -> None:
        """Serve the last reports; call after everything is delivered or purged."""
        self._producer.flush(0)
