"""``obshub rules serve``: the rule engine as a service on Kafka.

Two loops, each with its own consumer group (so evaluation and delivery fail and recover separately):

* **engine** (main thread), group ``<prefix>-engine``: consume ``obshub.steps.v1`` (JSON) and
  ``obshub.events.v1`` (msgpack batches) -> ``Engine.process`` -> state changes produced to
  ``obshub.alerts.v1`` (key = fingerprint) -> flush the producer -> save the engine state -> commit the
  input offsets. Undecodable input goes to ``obshub.dlq.v1`` with the reason in the DLQ headers. Every
  second ``Engine.tick(now)``; every ``health_every_s`` a ``health`` record per input topic (own lag and
  idle time). Rule files are reloaded on change or SIGHUP, validated first; a broken file keeps the old
  rules and logs every problem as file:line:col.
* **notify** (thread), group ``<prefix>-notify``: consume ``obshub.alerts.v1`` -> ``Dispatcher`` ->
  sinks; offsets are committed only below the oldest change not yet delivered to all its sinks (or given
  up), so a restart re-delivers what was in flight: at-least-once.

State: ``<state_dir>/rules/engine.json`` and ``dispatch.json`` (written atomically), silences in
``silences.json``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from prometheus_client import Counter, Gauge

from obshub.core import kafka, registry, schema
from obshub.core.settings import RULES, Settings
from rules import fields
from rules.dispatch import Dispatcher
from rules.engine import Engine
from rules.errors import RuleValidationError
from rules.loader import expand_paths, load_ruleset
from rules.silences import SilenceStore
from rules.sinks.config import AlertingConfig, build_sinks

log = logging.getLogger("obshub.rules.service")
BUILTIN_DIR = Path(__file__).with_name("builtin")
MAX_FUTURE_S = 300

RECORDS = Counter("obshub_rules_records", "input records evaluated", ["signal"])
CHANGES = Counter("obshub_rules_alert_changes", "alert state changes published", ["rule", "status"])
DLQ = Counter("obshub_rules_dlq", "input messages sent to the DLQ (undecodable)", ["topic"])
ACTIVE = Gauge("obshub_rules_active_alerts", "alerts pending or firing now")
EVAL_ERRORS = Gauge("obshub_rules_eval_errors", "expression evaluations that failed (counted as no match)")
RELOADS = Counter("obshub_rules_reloads", "rule reloads by outcome", ["outcome"])


def state_dir(settings: Settings) -> Path:
    """Where the rule engine keeps its state: ``$OBSHUB_HOME/state/rules``."""
    return settings.state_dir / "rules"


def _atomic_write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, separators=(",", ":")))
    os.replace(tmp, path)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.error("ignoring unreadable state file %s: %s", path, exc)
        return None


def _log_assign(loop: str):
    def on_assign(_consumer, partitions) -> None:
        log.info("%s: assigned %d partition(s) of %s", loop, len(partitions),
                 ", ".join(sorted({p.topic for p in partitions})) or "-")
    return on_assign


def _commit(consumer: Consumer) -> None:
    """Synchronous commit of the consumed positions; 'nothing to commit' is not an error."""
    try:
        consumer.commit(asynchronous=False)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError._NO_OFFSET:
            raise


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

    def reset(self) -> None:
        """Forget everything (after a rebalance the consumer restarts from committed offsets)."""
        with self._lock:
            self.outstanding.clear()
            self.high.clear()
            self._committed.clear()


class RuleService:
    """The engine and notify loops. ``rule_paths`` default to the builtin pack; ``from_beginning``
    makes a new consumer group start at the earliest offsets (default: latest for inputs).
    ``max_replay_age_s``: changes older than this, read by a new notify group, are not delivered."""

    def __init__(self, settings: Settings, rule_paths: list[Path], config: AlertingConfig, *,
                 group_prefix: str = RULES.group_prefix, from_beginning: bool = False,
                 health_every_s: float = RULES.health_every_s, max_replay_age_s: float = RULES.max_replay_age_s,
                 log_path: str = "stderr"):
        self.settings, self.rule_paths, self.config = settings, list(rule_paths) or [BUILTIN_DIR], config
        self.group_prefix, self.from_beginning = group_prefix, from_beginning
        self.health_every_s, self.max_replay_age_ns = health_every_s, int(max_replay_age_s * 1e9)
        self.state = state_dir(settings)
        self.log_path = log_path
        self.stop = threading.Event()
        self.reload_requested = threading.Event()
        self.ruleset = load_ruleset(self.rule_paths)  # raises RuleValidationError: refuse to start broken
        self._mtimes = self._rule_mtimes()
        self.outbox: list[dict] = []
        self.engine = Engine(self.ruleset, self.outbox.append, external_url=config.external_url)
        snap = _read_json(self.state / "engine.json")
        if snap:
            self.engine.restore(snap)
        self.tracker = OffsetTracker()
        self.dispatcher = Dispatcher(build_sinks(config), config.route, self.ruleset.inhibit,
                                     SilenceStore(self.state / "silences.json"), config.delivery.policy(),
                                     self.tracker.ack)
        dsnap = _read_json(self.state / "dispatch.json")
        if dsnap:
            self.dispatcher.restore(dsnap)
        self.started = time.monotonic()
        self.last_seen: dict[str, float] = {}
        self.decode_errors = 0
        self.future_records = 0
        self._check_routes()

    def _check_routes(self) -> None:
        """Warn about rules routed to sinks that do not exist (their alerts would reach no sink)."""
        sinks = {s.name for s in self.dispatcher.sinks}
        for r in self.ruleset.rules.values():
            missing = sorted(set(r.routes) - sinks)
            if missing:
                log.warning("%s:%d: rule %s routes to unknown sink(s) %s (configured: %s)", r.file, r.line, r.id,
                            ", ".join(missing), ", ".join(sorted(sinks)))

    # -- reload ----------------------------------------------------------------------------------------------
    def _rule_mtimes(self) -> dict[str, float]:
        out = {}
        for p in expand_paths(self.rule_paths):
            try:
                out[str(p)] = p.stat().st_mtime
            except OSError:
                out[str(p)] = -1.0
        return out

    def maybe_reload(self) -> bool | None:
        """Reload when a rule file changed or SIGHUP arrived. True: new rules active; False: the new files
        were invalid and the old rules keep running (problems logged); None: nothing to do."""
        mtimes = self._rule_mtimes()
        if mtimes == self._mtimes and not self.reload_requested.is_set():
            return None
        self.reload_requested.clear()
        self._mtimes = mtimes
        try:
            new = load_ruleset(self.rule_paths)
        except RuleValidationError as exc:
            for p in exc.problems:
                log.error("reload rejected, keeping the previous %d rules: %s", len(self.ruleset.rules), p)
            RELOADS.labels("rejected").inc()
            return False
        RELOADS.labels("ok").inc()
        self.ruleset = new
        self.engine.replace_rules(new)
        self.dispatcher.inhibit = list(new.inhibit)
        self._check_routes()
        log.info("reloaded %d rules from %s", len(new.rules), ", ".join(new.files))
        return True

    # -- kafka -------------------------------------------------------------------------------------------------
    def _consumer(self, suffix: str, reset: str) -> Consumer:
        return Consumer(kafka.consumer_config(kafka.connection(self.settings), f"{self.group_prefix}-{suffix}", {
            "enable.auto.commit": False, "auto.offset.reset": reset, "enable.partition.eof": False,
            "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000}))

    def _decode(self, msg, dlq: Producer) -> list[tuple[str, dict]]:
        topic = msg.topic()
        try:
            if topic == schema.TOPIC_STEPS:
                data = json.loads(msg.value())
                if not isinstance(data, dict):
                    raise ValueError("a step summary is a JSON object")
                return [("steps", self._clamp(fields.step_record(data)))]
            batch = schema.decode_batch(msg.value())
            return [("events", self._clamp(fields.event_record(batch, ev))) for ev in batch.events]
        except (ValueError, TypeError) as exc:
            self.decode_errors += 1
            DLQ.labels(topic).inc()
            reason, field = str(exc), getattr(exc, "field", "")
            headers = dict(zip(schema.DLQ_HEADERS, (reason, field, topic, str(msg.partition()), str(msg.offset()))))
            dlq.produce(schema.TOPIC_DLQ, value=msg.value(), key=msg.key(), headers=list(headers.items()))
            log.warning("%s[%d]@%d not decodable, sent to %s: %s", topic, msg.partition(), msg.offset(),
                        schema.TOPIC_DLQ, reason)
            return []

    def _clamp(self, rec: dict) -> dict:
        """A record time more than ``MAX_FUTURE_S`` ahead of this host's clock (a host with a wrong clock)
        would move the engine's clock and resolve alerts early: such a record counts as 'now'."""
        now = time.time_ns()
        if rec["time_ns"] > now + MAX_FUTURE_S * 1_000_000_000:
            self.future_records += 1
            rec["time_ns"] = now
        return rec

    def _publish(self, producer: Producer) -> None:
        for rec in self.outbox:
            CHANGES.labels(rec["rule"], rec["status"]).inc()
            rec["engine"] = self.group_prefix  # which engine's notify loop delivers it (see run_notify)
            producer.produce(schema.TOPIC_ALERTS, key=rec["fingerprint"], value=json.dumps(rec).encode())
            log.info("alert %s %s %s", rec["status"], rec["rule"], rec["labels"])
        self.outbox.clear()
        left = producer.flush(30)
        if left:
            raise RuntimeError(f"{left} alert change(s) not acknowledged by Kafka within 30 s")

    def _health(self, consumer: Consumer) -> None:
        now = time.time_ns()
        lag: dict[str, int] = {}
        try:
            assigned = consumer.assignment()
            for tp in consumer.position(assigned):
                lo, hi = consumer.get_watermark_offsets(tp, timeout=2, cached=False)
                pos = tp.offset if tp.offset >= 0 else lo
                lag[tp.topic] = lag.get(tp.topic, 0) + max(0, hi - pos)
        except Exception as exc:  # health is best effort
            log.debug("lag measurement failed: %s", exc)
        uptime = time.monotonic() - self.started
        for topic in self.input_topics():
            seen = self.last_seen.get(topic)
            idle = time.monotonic() - seen if seen is not None else uptime
            self.engine.process("health", fields.health_record(topic, f"{self.group_prefix}-engine",
                                                               lag.get(topic, 0), idle, uptime, now))

    def input_topics(self) -> list[str]:
        """The input topics the current rules read (a pack without event rules does not decode events)."""
        signals = {r.signal for r in self.ruleset.rules.values()}
        signals |= {r.correlate.signal for r in self.ruleset.rules.values() if r.correlate}
        topics = [t for sig, t in (("steps", schema.TOPIC_STEPS), ("events", schema.TOPIC_EVENTS)) if sig in signals]
        return topics or [schema.TOPIC_STEPS]

    def run_engine(self) -> None:
        """The engine loop; returns when ``stop`` is set."""
        consumer = self._consumer("engine", "earliest" if self.from_beginning else "latest")
        topics = self.input_topics()
        consumer.subscribe(topics, on_assign=_log_assign("engine"))
        producer = Producer(kafka.producer_config(kafka.connection(self.settings),
                                                  {"enable.idempotence": True, "linger.ms": 5}))
        last_tick = last_health = 0.0
        try:
            while not self.stop.is_set():
                msgs = consumer.consume(num_messages=500, timeout=0.2)
                for m in msgs:
                    if m.error():
                        if m.error().code() != KafkaError._PARTITION_EOF:
                            log.warning("consumer error: %s", m.error())
                        continue
                    self.last_seen[m.topic()] = time.monotonic()
                    for signal_name, rec in self._decode(m, producer):
                        RECORDS.labels(signal_name).inc()
                        self.engine.process(signal_name, rec)
                mono = time.monotonic()
                if mono - last_tick >= 1.0:
                    self.engine.tick(time.time_ns())
                    ACTIVE.set(len(self.engine.active()))
                    EVAL_ERRORS.set(self.engine.eval_errors)
                    if self.maybe_reload() and self.input_topics() != topics:
                        topics = self.input_topics()
                        _commit(consumer)
                        consumer.subscribe(topics, on_assign=_log_assign("engine"))
                    last_tick = mono
                if mono - last_health >= self.health_every_s:
                    self._health(consumer)
                    last_health = mono
                if self.outbox:
                    self._publish(producer)
                if msgs or self.engine.dirty:
                    _atomic_write(self.state / "engine.json", self.engine.snapshot())
                    self.engine.dirty = False
                if msgs:
                    _commit(consumer)
        finally:
            if self.outbox:
                self._publish(producer)
            _atomic_write(self.state / "engine.json", self.engine.snapshot())
            consumer.close()

    def run_notify(self) -> None:
        """The notify loop; returns when ``stop`` is set."""
        consumer = self._consumer("notify", "earliest")
        consumer.subscribe([schema.TOPIC_ALERTS], on_assign=_log_assign("notify"),
                            on_revoke=lambda c, p: self.tracker.reset())
        last_commit = 0.0
        try:
            while not self.stop.is_set():
                for m in consumer.consume(num_messages=200, timeout=0.2):
                    if m.error():
                        continue
                    token = self.tracker.add(m.topic(), m.partition(), m.offset())
                    try:
                        change = json.loads(m.value())
                    except ValueError:
                        log.warning("skipping undecodable alert change at %s[%d]@%d", m.topic(), m.partition(), m.offset())
                        self.tracker.ack([token])
                        continue
                    if change.get("engine", self.group_prefix) != self.group_prefix:
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
                        consumer.commit(offsets=offsets, asynchronous=False)
                        _atomic_write(self.state / "dispatch.json", self.dispatcher.snapshot())
                    last_commit = time.monotonic()
        finally:
            offsets = self.tracker.committable()
            if offsets:
                try:
                    consumer.commit(offsets=offsets, asynchronous=False)
                except Exception as exc:
                    log.warning("final commit failed (changes will be re-delivered): %s", exc)
            _atomic_write(self.state / "dispatch.json", self.dispatcher.snapshot())
            consumer.close()

    def serve(self, metrics_port: int | None = None) -> None:
        """Run both loops until SIGTERM/SIGINT; SIGHUP reloads the rule files. Registers the component
        ``rules`` with the local stack while it runs. With ``metrics_port``, Prometheus metrics are
        served on http://127.0.0.1:<port>/metrics (0 = any free port, logged)."""
        if metrics_port is not None:
            from prometheus_client import start_http_server

            server, _ = start_http_server(metrics_port, addr="127.0.0.1")
            log.info("metrics on http://127.0.0.1:%d/metrics", server.server_port)
        signal.signal(signal.SIGHUP, lambda *_: self.reload_requested.set())
        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())
        signal.signal(signal.SIGINT, lambda *_: self.stop.set())
        registry.register_component(self.settings, "rules", os.getpid(),
                                 log=self.log_path, rules=len(self.ruleset.rules))
        notify = threading.Thread(target=self.run_notify, name="notify", daemon=True)
        notify.start()
        try:
            self.run_engine()
        finally:
            self.stop.set()
            notify.join(30)
            self.dispatcher.close()
            registry.unregister_component(self.settings, "rules")
