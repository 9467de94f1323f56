"""The notify loop of ``obshub rules serve`` (a thread), consumer group ``<prefix>-notify``.

Consume ``obshub.alerts.v1`` -> ``Dispatcher`` -> sinks; offsets are committed only below the oldest
change not yet delivered to all its sinks (or given up on), so a restart re-delivers what was in
flight: at-least-once. A rebalance (``on_revoke``: the tracker forgets its offsets) resumes from the
committed offsets too, and the records read again that this process already delivered are acked, not
sent again (``Dispatcher.submit``). The dispatcher's state (firing alerts per group, for repeats) is
saved to ``dispatch.json`` with each commit. Unusable change records go to the DLQ (``rules.intake``).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from confluent_kafka import KafkaException, Producer, TopicPartition

from obshub.core import schema
from obshub.core.settings import RULES
from obshub.rules import intake
from obshub.rules.dispatch import Dispatcher
from obshub.rules.service_common import (
    CONSUMER_ERRORS,
    DLQ,
    atomic_write,
    consumer,
    flush,
    log,
    log_assign,
    producer,
    read_state,
)

if TYPE_CHECKING:
    from obshub.rules.service import RuleService

DISPATCH_FILE = "dispatch.json"


def dispatch_file(group_prefix: str) -> str:
    """The notify loop's state file name for rule engines of ``group_prefix`` (in ``state_dir``): the
    default prefix's ``dispatch.json``, another prefix's ``dispatch-<prefix>.json``. An engine of another
    prefix is another service (its own groups and alerts): it never restores, and so never re-sends, the
    firing alerts of another (a demo run found the earlier runs' alerts re-sent to its sinks)."""
    return DISPATCH_FILE if group_prefix == RULES.group_prefix else f"dispatch-{group_prefix}.json"


class OffsetTracker:
    """Offsets in flight per partition; ``committable`` gives, per partition, the offset below which
    every message is acked (Kafka commits 'the next offset to read')."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.outstanding: dict[tuple[str, int], set[int]] = {}
        self.high: dict[tuple[str, int], int] = {}
        self._committed: dict[tuple[str, int], int] = {}

    def add(self, topic: str, partition: int, offset: int) -> tuple[str, int, int]:
        with self._lock:
            tp = (topic, partition)
            self.outstanding.setdefault(tp, set()).add(offset)
            self.high[tp] = max(self.high.get(tp, -1), offset)
        return (topic, partition, offset)

    def ack(self, tokens: list[tuple[str, int, int]]) -> None:
        with self._lock:
            for topic, partition, offset in tokens:
                self.outstanding.get((topic, partition), set()).discard(offset)

    def committable(self) -> list[TopicPartition]:
        """TopicPartitions to commit that moved since the last call."""
        out = []
        with self._lock:
            for tp, high in self.high.items():
                pending = self.outstanding.get(tp)
                nxt = min(pending) if pending else high + 1
                if self._committed.get(tp) != nxt:
                    self._committed[tp] = nxt
                    out.append(TopicPartition(tp[0], tp[1], nxt))
        return out

    def retry(self, offsets: list[TopicPartition]) -> None:
        """A commit of ``offsets`` failed: offer them again on the next ``committable``."""
        with self._lock:
            for tp in offsets:
                self._committed.pop((tp.topic, tp.partition), None)

    def reset(self) -> None:
        """Forget everything (after a rebalance the consumer restarts from committed offsets)."""
        with self._lock:
            self.outstanding.clear()
            self.high.clear()
            self._committed.clear()


class NotifyLoop:
    """Delivery: the service's alert changes through a ``Dispatcher`` to the sinks (module docstring).
    ``dispatcher_factory(on_ack)`` builds the dispatcher (sinks, route, inhibition, silences)."""

    def __init__(self, svc: "RuleService", dispatcher_factory, max_replay_age_s: float = RULES.max_replay_age_s):
        self.svc = svc
        self.max_replay_age_ns = int(max_replay_age_s * 1e9)
        self.tracker = OffsetTracker()
        self.dispatcher: Dispatcher = dispatcher_factory(self.tracker.ack)
        self.decode_errors = 0
        self.state_path = svc.state / dispatch_file(svc.group_prefix)
        self.state_error = ""  # the last failure to write the state (logged once), "" once written
        dsnap = read_state(self.state_path)
        if dsnap:
            self.dispatcher.restore(dsnap)

    def save_state(self) -> bool:
        """Write the dispatcher's state (what was delivered, for a restart) to ``state_path``; True when
        written. A disk that is full or read-only (an OSError) is logged, once until the write works again,
        and the loop goes on delivering: the state is written again at the next commit. It ended the notify
        thread, so the engine kept evaluating and publishing alerts that no sink received (newuser20)."""
        try:
            atomic_write(self.state_path, self.dispatcher.snapshot())
        except OSError as exc:
            why = f"{exc.strerror or exc} ({exc.filename or self.state_path})"
            if why != self.state_error:
                log.error(
                    "notify: cannot write the delivery state %s: %s; alerts are still delivered and the write is "
                    "retried at each commit (free space in or fix $OBSHUB_HOME)",
                    self.state_path,
                    why,
                )
            self.state_error = why
            return False
        if self.state_error:
            log.warning("notify: the delivery state %s is written again", self.state_path)
        self.state_error = ""
        return True

    def _dead_letter(self, msg, exc: Exception, dlq: Producer) -> None:
        self.decode_errors += 1
        DLQ.labels(msg.topic()).inc()
        reason = intake.dead_letter(dlq, msg, exc, f"{self.svc.group_prefix}-notify")
        log.warning(
            "%s[%d]@%d not usable, sent to %s: %s", msg.topic(), msg.partition(), msg.offset(), schema.TOPIC_DLQ, reason
        )

    def run_notify(self) -> None:
        """The notify loop; returns when the service's ``stop`` is set."""
        svc = self.svc
        cons = consumer(svc.settings, f"{svc.group_prefix}-notify", "earliest", svc.watch)
        dlq = producer(svc.settings, svc.watch)
        cons.subscribe(
            [schema.TOPIC_ALERTS],
            on_assign=log_assign("notify", svc.watch),
            on_revoke=lambda c, p: self.tracker.reset(),
        )
        last_commit = 0.0
        try:
            while not svc.stop.is_set():
                for m in cons.consume(num_messages=200, timeout=0.2):
                    if m.error():
                        CONSUMER_ERRORS.labels(m.topic() or "-").inc()
                        log.warning("notify: consumer error on %s: %s", m.topic() or "-", m.error())
                        continue
                    token = self.tracker.add(m.topic(), m.partition(), m.offset())
                    try:
                        change = intake.decode_change(m.value())
                    except schema.SchemaError as exc:
                        self._dead_letter(m, exc, dlq)
                        if flush(dlq, svc.stop, svc.watch):
                            break  # stopping during an outage: not acked, so read again after a restart
                        self.tracker.ack([token])
                        continue
                    if change.get("engine", svc.group_prefix) != svc.group_prefix:
                        # another rule engine (its own --group-prefix) shares the topic: it delivers its own
                        self.tracker.ack([token])
                        continue
                    if time.time_ns() - int(change.get("updated_at_ns", 0)) > self.max_replay_age_ns:
                        self.tracker.ack([token])  # history replayed by a new group: not re-notified
                        continue
                    self.dispatcher.submit(change, token)
                self.dispatcher.tick(time.time_ns())
                if time.monotonic() - last_commit >= 0.5:
                    offsets = self.tracker.committable()
                    if offsets:
                        try:
                            cons.commit(offsets=offsets, asynchronous=False)
                            self.save_state()
                        except KafkaException as exc:  # broker away: offer the same offsets again next time
                            self.tracker.retry(offsets)
                            log.debug("commit failed, retried: %s", exc)
                    last_commit = time.monotonic()
        finally:
            offsets = self.tracker.committable()
            if offsets:
                try:
                    cons.commit(offsets=offsets, asynchronous=False)
                except KafkaException as exc:
                    log.warning("final commit failed (changes will be re-delivered): %s", exc)
            self.save_state()
            cons.close()
