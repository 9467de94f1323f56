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
import socket
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from prometheus_client import Counter, Gauge

from obshub.core import kafka, registry, schema
from obshub.core.settings import RULES, Settings
from rules import fields, intake
from rules.dispatch import Dispatcher
from rules.engine import Engine
from rules.errors import RuleValidationError
from rules.loader import expand_paths, load_ruleset
from rules.silences import SilenceStore
from rules.sinks.config import AlertingConfig, build_sinks
from rules.web import runbook_url

log = logging.getLogger("obshub.rules.service")
KAFKA_LOG = logging.getLogger("obshub.rules.kafka")  # librdkafka's lines go through logging (JSON logs too)
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
        self.running = threading.Event()  # both loops started (the readiness probe)
        self.http_port: int | None = None
        self.reload_requested = threading.Event()
        self.ruleset = load_ruleset(self.rule_paths)  # raises RuleValidationError: refuse to start broken
        self._mtimes = self._rule_mtimes()
        self.outbox: list[dict] = []
        self.engine = Engine(self.ruleset, self.outbox.append,
                             external_url=(config.external_url or f"http://{socket.getfqdn()}").rstrip("/") + "/rules")
        snap = _read_json(self.state / "engine.json")
        if snap:
            self.engine.restore(snap)
        self.tracker = OffsetTracker()
        self.dispatcher = Dispatcher(build_sinks(config), config.route, self.ruleset.inhibit,
                                     SilenceStore(self.state / "silences.json"), config.delivery.policy(),
                                     self.tracker.ack, passthrough=config.mode == "alertmanager")
        if config.mode == "alertmanager" and self.ruleset.inhibit:
            log.warning("mode alertmanager: the %d inhibit rule(s) of the rule files are not applied (write them "
                        "as inhibit_rules in Alertmanager's configuration)", len(self.ruleset.inhibit))
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
            "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000, "logger": KAFKA_LOG}))

    def _decode(self, msg, dlq: Producer) -> list[tuple[str, dict]]:
        """Records of one input message, or ``[]`` after sending it to the DLQ (rules.intake)."""
        try:
            return [(sig, self._clamp(rec)) for sig, rec in intake.decode(msg.topic(), msg.value())]
        except schema.SchemaError as exc:
            self._dead_letter(msg, exc, dlq, "engine")
            return []

    def _dead_letter(self, msg, exc: Exception, dlq: Producer, loop: str) -> None:
        self.decode_errors += 1
        DLQ.labels(msg.topic()).inc()
        reason = intake.dead_letter(dlq, msg, exc, f"{self.group_prefix}-{loop}")
        log.warning("%s[%d]@%d not usable, sent to %s: %s", msg.topic(), msg.partition(), msg.offset(),
                    schema.TOPIC_DLQ, reason)

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
            link = runbook_url(rec["annotations"].get("runbook", ""), self.config.runbook_base_url)
            if link:
                rec["annotations"].setdefault("runbook_url", link)
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
                                                  {"enable.idempotence": True, "linger.ms": 5, "logger": KAFKA_LOG}))
        last_tick = last_health = 0.0
        dead_flushed = self.decode_errors
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
                        try:
                            self.engine.process(signal_name, rec)
                        except Exception as exc:  # a record the checks let through must not stop the engine
                            log.exception("evaluating %s[%d]@%d failed", m.topic(), m.partition(), m.offset())
                            self._dead_letter(m, schema.SchemaError(
                                "", f"rule evaluation failed: {type(exc).__name__}: {exc}"), producer, "engine")
                            break
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
                    if self.decode_errors != dead_flushed:  # dead letters are on the DLQ before we commit past them
                        if producer.flush(30):
                            raise RuntimeError("dead letters not acknowledged by Kafka within 30 s")
                        dead_flushed = self.decode_errors
                    _commit(consumer)
        finally:
            if self.outbox:
                self._publish(producer)
            _atomic_write(self.state / "engine.json", self.engine.snapshot())
            consumer.close()

    def run_notify(self) -> None:
        """The notify loop; returns when ``stop`` is set."""
        consumer = self._consumer("notify", "earliest")
        dlq = Producer(kafka.producer_config(kafka.connection(self.settings),
                                             {"enable.idempotence": True, "linger.ms": 5}, quiet=True))
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
                        change = intake.decode_change(m.value())
                    except schema.SchemaError as exc:
                        self._dead_letter(m, exc, dlq, "notify")
                        if dlq.flush(30):
                            raise RuntimeError("a dead letter was not acknowledged by Kafka within 30 s") from None
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

    def serve(self, metrics_port: int | None = None, metrics_addr: str = "0.0.0.0") -> None:
        """Run both loops until SIGTERM/SIGINT; SIGHUP reloads the rule files. Registers the component
        ``rules`` with the local stack while it runs. With ``metrics_port``, Prometheus metrics are
        served on http://<metrics_addr>:<port>/metrics (0 = any free port, logged)."""
        if metrics_port is not None:
            from rules import web

            server = web.serve(web.RulesWeb(self, ready=lambda: self.running.is_set()), metrics_port, metrics_addr)
            self.http_port = server.server_port
            if not self.config.external_url:
                self.engine.external_url = f"http://{socket.getfqdn()}:{self.http_port}/rules"
            log.info("metrics on http://%s:%d/metrics, rules and alerts on /rules (generatorURL %s)", metrics_addr,
                     self.http_port, self.engine.external_url)
        signal.signal(signal.SIGHUP, lambda *_: self.reload_requested.set())
        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())
        signal.signal(signal.SIGINT, lambda *_: self.stop.set())
        registry.register_component(self.settings, "rules", os.getpid(),
                                 log=self.log_path, rules=len(self.ruleset.rules))
        notify = threading.Thread(target=self.run_notify, name="notify", daemon=True)
        notify.start()
        self.running.set()
        try:
            self.run_engine()
        finally:
            self.stop.set()
            notify.join(30)
            self.dispatcher.close()
            registry.unregister_component(self.settings, "rules")
