"""Ordered, at-least-once delivery of sealed batches: Kafka when it takes them, the on-disk spool when it
does not, and replay of the spool (in order, before any newer batch) when Kafka is back.

States::

    direct ──(delivery failed or timed out / queue full too long / all brokers down)──> draining
    draining ──(every outstanding report served: failed + held batches written to the spool in seq
                order)──> spooling
    spooling ──(spool replayed and acknowledged to the last record)──> direct

* **direct**: batches go to librdkafka as they are sealed.
* **draining**: a delivery failed. Everything still queued in librdkafka is purged (it fails too), so no
  later batch can overtake the failed one; new batches are held in memory until every outstanding report
  is in, then failed (sorted by seq) and held batches go to the spool.
* **spooling**: new batches are appended to the spool (behind the older ones). The spool is replayed with a
  window that starts at 1 batch (a probe: when Kafka is still down it waits out the delivery timeout) and
  doubles with each success up to ``max_window``; a failed replay rewinds the spool to its oldest
  unacknowledged record and retries after a backoff (0.5 s doubling to 5 s).

A delivery "fails" when librdkafka reports an error or when the oldest batch handed to it is not
acknowledged within ``delivery_timeout_ms``, as timed here (:meth:`Publisher.oldest_outstanding_s`).
librdkafka's own ``message.timeout.ms`` is off: it would fail an old message of a partition while newer
ones stay queued, and those newer ones were delivered first once a new leader served (a broker loss, the
agent's loop a little late to purge: seq 0-6, 13-48, 7-12 in one CI run). Now nothing leaves librdkafka's
queue except by delivery or by the transport's purge, which takes every queued batch at once (a batch in
flight comes back to the queue when its request fails, after at most ``request.timeout.ms``, and is purged
then; after another delivery timeout in draining, in-flight batches are abandoned too). The idempotent
producer's sequence numbers make the broker keep only a gap-free prefix of what was sent. One agent's
batches share one key (its host) and so one partition; so the first copy of each batch
in Kafka is in seq order, across broker losses and leader moves; a batch whose fate was unknown (in
flight when it was purged, or a replay interrupted by a new outage) may be written twice (at-least-once;
consumers drop repeats of ``(agent_id, seq)``). The stream worker still takes a batch that arrives after a
gap it had counted as lost (``obshub.streams.ingest``, ``obshub_streams_late_batches_total``): a spool
dropped whole segments, or another producer wrote the host's key.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable

from confluent_kafka import KafkaError

from obshub.core import schema
from obshub.core.settings import KafkaConfig
from obshub.producer.batcher import SealedBatch
from obshub.producer.publisher import Publisher
from obshub.producer.spool import Spool, SpoolPos

DIRECT, DRAINING, SPOOLING = "direct", "draining", "spooling"
_BACKOFF_MIN_S, _BACKOFF_MAX_S = 0.5, 5.0
_REPURGE_EVERY_S = 0.5
#: at :meth:`Transport.close`, once Kafka is known not to take batches (a delivery failed or every broker is
#: down: the transport is not ``direct``), the seconds without one delivery after which it stops waiting: an
#: agent started with no reachable broker took the whole ``--flush-timeout`` (15 s) to exit on Ctrl-C.
SHUTDOWN_STALL_S = 2.0


class _Replay:
    __slots__ = ("pos", "ok", "size")

    def __init__(self, pos: SpoolPos, size: int):
        self.pos, self.ok, self.size = pos, None, size


class Transport:
    """Delivers :class:`SealedBatch` es through a :class:`Publisher`, spooling to ``spool`` as needed.

    Call :meth:`send` for each sealed batch, :meth:`service` every loop turn (it serves delivery
    reports and drives the replay), :meth:`close` once at the end.

    Counters: ``sent`` (batches handed in), ``spooled`` (batches written to the spool), ``replayed``
    (spooled batches delivered), plus the publisher's and the spool's (``publisher``, ``spool``).
    """

    def __init__(self, kafka: KafkaConfig, spool: Spool, topic: str = schema.TOPIC_EVENTS, max_window: int = 64):
        self.kafka, self.spool, self.topic, self.max_window = kafka, spool, topic, max_window
        self._broker_down = False
        self.publisher = Publisher(kafka, topic, on_broker_down=self._mark_down)
        self.state = SPOOLING if spool.pending_batches else DIRECT
        self._failed: list[SealedBatch] = []
        self._held: list[SealedBatch] = []
        self._replay: deque[_Replay] = deque()
        self._replay_failed = False
        self._window = 1
        self._backoff = _BACKOFF_MIN_S
        self._next_try = 0.0
        self._last_purge = 0.0
        self._drain_since = 0.0
        self._timeout_s = kafka.delivery_timeout_ms / 1000
        self.timeouts = 0
        self.sent = 0
        self.spooled = 0
        self.replayed = 0
        self.replayed_bytes = 0
        self.fatal_resets = 0
        self.gave_up_after_s: float | None = None  # set by close() when it stopped waiting on a stalled Kafka

    def _mark_down(self) -> None:
        self._broker_down = True

    # -- input ---------------------------------------------------------------------------------------
    def send(self, batch: SealedBatch) -> None:
        """Hand in one sealed batch; it is delivered, or spooled, in seq order."""
        self.sent += 1
        if self.state == DIRECT:
            if not self.publisher.produce(batch.key, batch.value, self._direct_report(batch)):
                self._held.append(batch)
                self._enter_draining()
        elif self.state == DRAINING:
            self._held.append(batch)
        else:
            self._spool(batch.key, batch.value)

    def _direct_report(self, batch: SealedBatch):
        def done(err: KafkaError | None) -> None:
            if err is not None:
                self._failed.append(batch)
                if self.state == DIRECT:
                    self._enter_draining()

        return done

    def _spool(self, key: bytes, value: bytes) -> None:
        self.spool.append(key, value)
        self.spooled += 1

    def _enter_draining(self) -> None:
        self.state = DRAINING
        self._last_purge = 0.0  # purge at the next service(), outside librdkafka's callback
        self._drain_since = time.monotonic()

    # -- the loop ------------------------------------------------------------------------------------
    def service(self, timeout_s: float = 0.0) -> None:
        """Serve delivery reports (waiting up to ``timeout_s``), then advance the state machine."""
        self.publisher.poll(timeout_s)
        now = time.monotonic()
        if self.state != DRAINING and self.publisher.oldest_outstanding_s(now) >= self._timeout_s:
            self.timeouts += 1  # the delivery timeout: as a failed report (module docstring)
            if self.state == DIRECT:
                self._enter_draining()
            elif not self._replay_failed:
                self._replay_failed = True
                self._last_purge = 0.0
        if self._broker_down:
            self._broker_down = False
            if self.state == DIRECT:
                self._enter_draining()
            elif self.state == SPOOLING and any(r.ok is None for r in self._replay):
                self._replay_failed = True  # do not wait for the replayed batches to time out
                self._last_purge = 0.0
        if self.state == DRAINING:
            if self.publisher.outstanding and now - self._last_purge >= _REPURGE_EVERY_S:
                if now - self._drain_since >= self._timeout_s:  # in flight to a broker that never answers
                    self.publisher.purge_all()
                else:
                    self.publisher.purge_queued()
                self._last_purge = now
                self.publisher.poll(0)
            if self.publisher.outstanding == 0:
                for b in sorted(self._failed, key=lambda b: b.seq):
                    self._spool(b.key, b.value)
                for b in self._held:
                    self._spool(b.key, b.value)
                self._failed.clear()
                self._held.clear()
                self.state = SPOOLING
                self._window = 1
                self._next_try = now + self._backoff
                self._replace_if_fatal()
        if self.state == SPOOLING:
            self._drive_replay(now)

    def _replace_if_fatal(self) -> None:
        if self.publisher.fatal is not None and self.publisher.outstanding == 0:
            self.publisher.close()
            self.publisher = Publisher(self.kafka, self.topic, on_broker_down=self._mark_down)
            self.fatal_resets += 1

    def _drive_replay(self, now: float) -> None:
        while self._replay and self._replay[0].ok:
            r = self._replay.popleft()
            self.spool.ack(r.pos)
            self.replayed += 1
            self.replayed_bytes += r.size
        if self._replay_failed:
            if any(r.ok is None for r in self._replay):
                if now - self._last_purge >= _REPURGE_EVERY_S:
                    self.publisher.purge_queued()
                    self._last_purge = now
                return
            self._replay.clear()
            self.spool.rewind()
            self._replay_failed = False
            self._window = 1
            self._next_try = now + self._backoff
            self._backoff = min(_BACKOFF_MAX_S, self._backoff * 2)
            self._replace_if_fatal()
            return
        if not self._replay and self.spool.pending_batches == 0:
            self.state = DIRECT
            self._backoff = _BACKOFF_MIN_S
            return
        if now < self._next_try:
            return
        while len(self._replay) < self._window:
            rec = self.spool.read_next()
            if rec is None:
                break
            pos, key, value = rec
            entry = _Replay(pos, len(value))
            if not self.publisher.produce(key, value, self._replay_report(entry)):
                self._replay_failed = True
                self._replay.append(entry)
                entry.ok = False
                break
            self._replay.append(entry)

    def _replay_report(self, entry: _Replay):
        def done(err: KafkaError | None) -> None:
            entry.ok = err is None
            if err is None:
                self._window = min(self.max_window, self._window * 2)
                self._backoff = _BACKOFF_MIN_S
            else:
                self._replay_failed = True
                self._last_purge = 0.0

        return done

    # -- end -----------------------------------------------------------------------------------------
    @property
    def idle(self) -> bool:
        """True when nothing is outstanding, held or spooled: everything handed in was delivered."""
        return (
            self.state == DIRECT
            and self.publisher.outstanding == 0
            and not self._held
            and not self._failed
            and self.spool.pending_batches == 0
        )

    def close(
        self, timeout_s: float, abort: Callable[[], bool] = lambda: False, stall_s: float = SHUTDOWN_STALL_S
    ) -> tuple[int, int]:
        """Try for up to ``timeout_s`` (or until ``abort()`` is true) to deliver everything, spool
        included; then move whatever is left to the spool and close it. Once Kafka is known not to take
        batches (the state is not ``direct``), ``stall_s`` seconds without one delivery also end the wait
        (``gave_up_after_s`` then holds the seconds waited); a spool replay waiting out its backoff is
        tried at once. Returns ``(undelivered_batches, undelivered_bytes)``: what stays in the spool for
        the next start (0, 0 when all was delivered)."""
        now = time.monotonic()
        deadline, delivered, since = now + timeout_s, self.publisher.delivered, now
        self._next_try = min(self._next_try, now)
        while not self.idle and now < deadline and not abort():
            self.service(0.05)
            now = time.monotonic()
            if self.publisher.delivered != delivered:
                delivered, since = self.publisher.delivered, now
            elif self.state != DIRECT and now - since >= stall_s:
                self.gave_up_after_s = now - since
                break
        if not self.idle:
            self.publisher.purge_all()
            if self.state == DIRECT:
                self._enter_draining()
            end = time.monotonic() + 5.0
            while (self.publisher.outstanding or self.state == DRAINING) and time.monotonic() < end:
                self.publisher.purge_all()
                self.service(0.05)
            for b in sorted(self._failed, key=lambda b: b.seq) + self._held:  # reports that never came
                self._spool(b.key, b.value)
            self._failed.clear()
            self._held.clear()
            while self._replay and self._replay[0].ok:
                self.spool.ack(self._replay.popleft().pos)
        self.publisher.close()
        left = (self.spool.pending_batches, self.spool.pending_bytes)
        self.spool.close()
        return left
