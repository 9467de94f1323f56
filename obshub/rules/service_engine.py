"""The engine loop of ``obshub rules serve`` (main thread), consumer group ``<prefix>-engine``.

Consume ``obshub.steps.v1`` (JSON) and ``obshub.events.v1`` (msgpack batches) -> ``Engine.process`` ->
state changes produced to ``obshub.alerts.v1`` (key = fingerprint) and flushed at once. At most every
``checkpoint_every_s`` (and when stopping): save the engine state (``engine.msgpack``), then commit the
input offsets, so a restart resumes from a state that covers everything committed (at-least-once: what
was evaluated after the last checkpoint is evaluated again). Unusable input goes to ``obshub.dlq.v1``
with the reason in the DLQ headers (``rules.intake``), flushed before the offsets move past it. Every
second ``Engine.tick(now)`` and a rule-file reload check; every ``health_every_s`` a ``health`` record
per input topic (own lag and idle time).
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from confluent_kafka import Consumer, KafkaError, Producer

from obshub.core import schema
from obshub.rules import fields, intake
from obshub.rules.engine import Engine
from obshub.rules.service_common import (
    ACTIVE,
    CHANGES,
    DLQ,
    EVAL_ERRORS,
    RECORDS,
    SKIPPED,
    atomic_write,
    commit,
    consumer,
    consumer_lag,
    flush,
    log,
    log_assign,
    producer,
    read_state,
)
from obshub.rules.web import runbook_url

if TYPE_CHECKING:
    from obshub.rules.service import RuleService

MAX_FUTURE_S = 300
STATE_FILE = "engine.msgpack"
OLD_STATE_FILE = "engine.json"  # written by earlier versions; read once when no msgpack state exists


class EngineLoop:
    """Evaluation: the ``Engine`` of the service ``svc`` fed from Kafka (see the module docstring)."""

    def __init__(self, svc: "RuleService", engine: Engine, checkpoint_every_s: float = 1.0):
        self.svc, self.engine, self.checkpoint_every_s = svc, engine, checkpoint_every_s
        self.outbox: list[dict] = []
        self.started = time.monotonic()
        self.last_seen: dict[str, float] = {}
        self.decode_errors = 0
        self.future_records = 0
        self.undelivered = 0  # alert changes or dead letters not acknowledged when stopping in an outage
        self._kinds_of: object = None
        self._kinds: frozenset[int] | None = None
        snap = read_state(svc.state / STATE_FILE) or read_state(svc.state / OLD_STATE_FILE)
        if snap:
            engine.restore(snap)

    def write_snapshot(self) -> None:
        """Write the engine's snapshot to the state folder (atomically)."""
        atomic_write(self.svc.state / STATE_FILE, self.engine.snapshot())
        (self.svc.state / OLD_STATE_FILE).unlink(missing_ok=True)
        self.engine.dirty = False

    # -- input -----------------------------------------------------------------------------------------------
    def event_kinds(self) -> frozenset[int] | None:
        """The event kinds the current rules read (``intake.event_kinds``, recomputed after a reload)."""
        if self._kinds_of is not self.svc.ruleset:
            self._kinds_of, self._kinds = self.svc.ruleset, intake.event_kinds(self.svc.ruleset)
        return self._kinds

    def _decode(self, msg, dlq: Producer) -> list[tuple[str, dict]]:
        """Records of one input message, or ``[]`` after sending it to the DLQ (rules.intake). Of an event
        batch only the events of kinds a rule reads become records; the others are counted as skipped."""
        try:
            if msg.topic() == schema.TOPIC_STEPS:
                return [("steps", self._clamp(intake.decode_step(msg.value())))]
            batch = intake.decode_event_batch(msg.value(), self.event_kinds())
        except schema.SchemaError as exc:
            self._dead_letter(msg, exc, dlq)
            return []
        skipped = batch.events - len(batch.records)
        if skipped:
            SKIPPED.inc(skipped)
            RECORDS.labels("events").inc(skipped)
        return [("events", self._clamp(rec)) for rec in batch.records]

    def _dead_letter(self, msg, exc: Exception, dlq: Producer) -> None:
        self.decode_errors += 1
        DLQ.labels(msg.topic()).inc()
        reason = intake.dead_letter(dlq, msg, exc, f"{self.svc.group_prefix}-engine")
        log.warning(
            "%s[%d]@%d not usable, sent to %s: %s", msg.topic(), msg.partition(), msg.offset(), schema.TOPIC_DLQ, reason
        )

    def _clamp(self, rec: dict) -> dict:
        """A record time more than ``MAX_FUTURE_S`` ahead of this host's clock (a host with a wrong clock)
        would move the engine's clock and resolve alerts early: such a record counts as 'now'."""
        now = time.time_ns()
        if rec["time_ns"] > now + MAX_FUTURE_S * 1_000_000_000:
            self.future_records += 1
            rec["time_ns"] = now
        return rec

    # -- output ----------------------------------------------------------------------------------------------
    def _publish(self, prod: Producer) -> None:
        for rec in self.outbox:
            CHANGES.labels(rec["rule"], rec["status"]).inc()
            rec["engine"] = self.svc.group_prefix  # which engine's notify loop delivers it (see run_notify)
            link = runbook_url(rec["annotations"].get("runbook", ""), self.svc.config.runbook_base_url)
            if link:
                rec["annotations"].setdefault("runbook_url", link)
            prod.produce(schema.TOPIC_ALERTS, key=rec["fingerprint"], value=json.dumps(rec).encode())
            log.info("alert %s %s %s", rec["status"], rec["rule"], rec["labels"])
        self.outbox.clear()
        self._flush(prod)

    def _flush(self, prod: Producer) -> bool:
        """Wait for the broker's acknowledgements (through an outage); False when stopping with some
        still missing: then neither the state is saved nor offsets committed, so a restart evaluates
        their input again."""
        left = flush(prod, self.svc.stop, self.svc.watch)
        if left:
            self.undelivered = left
            log.error(
                "stopping with %d message(s) not acknowledged by Kafka (broker unreachable); the engine "
                "state is not saved, a restart evaluates their input again",
                left,
            )
        return not left

    def _health(self, cons: Consumer) -> None:
        now = time.time_ns()
        lag: dict[str, int] = {}
        try:
            consumer_lag(cons, lag)
        except Exception as exc:  # health is best effort
            log.debug("lag measurement failed: %s", exc)
        uptime = time.monotonic() - self.started
        for topic in self.input_topics():
            seen = self.last_seen.get(topic)
            idle = time.monotonic() - seen if seen is not None else uptime
            self.engine.process(
                "health",
                fields.health_record(topic, f"{self.svc.group_prefix}-engine", lag.get(topic, 0), idle, uptime, now),
            )

    def input_topics(self) -> list[str]:
        """The input topics the current rules read (a pack without event rules does not decode events)."""
        rules = self.svc.ruleset.rules.values()
        signals = {r.signal for r in rules} | {r.correlate.signal for r in rules if r.correlate}
        topics = [t for sig, t in (("steps", schema.TOPIC_STEPS), ("events", schema.TOPIC_EVENTS)) if sig in signals]
        return topics or [schema.TOPIC_STEPS]

    # -- the loop --------------------------------------------------------------------------------------------
    def run_engine(self) -> None:
        """The engine loop; returns when the service's ``stop`` is set."""
        svc = self.svc
        cons = consumer(
            svc.settings, f"{svc.group_prefix}-engine", "earliest" if svc.from_beginning else "latest", svc.watch
        )
        topics = self.input_topics()
        cons.subscribe(
            topics, on_assign=log_assign("engine", svc.watch, settings=svc.settings, earliest=svc.from_beginning)
        )
        prod = producer(svc.settings, svc.watch)
        last_tick = last_health = last_checkpoint = 0.0
        uncommitted = False
        dead_flushed = self.decode_errors
        try:
            while not svc.stop.is_set():
                msgs = cons.consume(num_messages=500, timeout=0.2)
                for m in msgs:
                    if m.error():
                        if m.error().code() != KafkaError._PARTITION_EOF:
                            log.warning("consumer error: %s", m.error())
                        continue
                    uncommitted = True
                    self.last_seen[m.topic()] = time.monotonic()
                    for signal_name, rec in self._decode(m, prod):
                        RECORDS.labels(signal_name).inc()
                        try:
                            self.engine.process(signal_name, rec)
                        except Exception as exc:  # a record the checks let through must not stop the engine
                            log.exception("evaluating %s[%d]@%d failed", m.topic(), m.partition(), m.offset())
                            self._dead_letter(
                                m, schema.SchemaError("", f"rule evaluation failed: {type(exc).__name__}: {exc}"), prod
                            )
                            break
                mono = time.monotonic()
                if mono - last_tick >= 1.0:
                    self.engine.tick(time.time_ns())
                    ACTIVE.set(len(self.engine.active()))
                    EVAL_ERRORS.set(self.engine.eval_errors)
                    if svc.maybe_reload() and self.input_topics() != topics:
                        topics = self.input_topics()
                        self.write_snapshot()
                        commit(cons)
                        cons.subscribe(
                            topics,
                            on_assign=log_assign(
                                "engine", svc.watch, settings=svc.settings, earliest=svc.from_beginning
                            ),
                        )
                    last_tick = mono
                if mono - last_health >= svc.health_every_s:
                    self._health(cons)
                    last_health = mono
                if msgs:
                    svc.watch.up()
                if self.outbox:
                    self._publish(prod)
                if self.undelivered:
                    break
                if (uncommitted or self.engine.dirty) and mono - last_checkpoint >= self.checkpoint_every_s:
                    self.write_snapshot()
                    if uncommitted:
                        if self.decode_errors != dead_flushed:  # dead letters are on the DLQ before we commit past them
                            if not self._flush(prod):
                                break
                            dead_flushed = self.decode_errors
                        commit(cons)
                        uncommitted = False
                    last_checkpoint = mono
        finally:
            if self.outbox and not self.undelivered:
                self._publish(prod)
            if not self.undelivered:  # undelivered changes end the loop without a snapshot or a commit
                self.write_snapshot()
                if uncommitted and self._flush(prod):
                    try:
                        commit(cons)
                    except Exception as exc:
                        log.warning("final commit failed (the last records will be evaluated again): %s", exc)
            cons.close()
