"""The engine loop of ``obshub rules serve``: one loop and one commit path, for one engine or several.

Engines started with the same ``--group-prefix`` form the consumer group ``<prefix>-engine`` and split the
jobs between them; one engine alone owns every job. (The snapshot-file loop of earlier versions, and the
``--scale-out`` switch that chose between the two, are gone: measured side by side in
docs/ARCHITECTURE.md, "One rule-engine loop".)

Work is split by job. The steps topic is keyed by job (``obshub streams`` writes it so), so each of its
partitions holds a fixed set of jobs; the consumer group hands each engine some of those partitions. An
engine keeps one ``Engine`` (windows, alerts, correlation buffers) per partition it owns. Events are keyed
by host, not by job: every engine reads every events partition (a consumer of its own, positioned from its
state) and evaluates only the batches of jobs it owns, the job's partition being Kafka's default
partitioner on the job name (``partition_for``: murmur2, as the stream workers' producer and the Java
client place keys). Health records (the engine's own lag and idle time per input topic) are per process,
evaluated by a process-wide engine whose changes are produced outside the transactions.

Exactly once, per owned partition ``p`` (Kafka transactions, one transactional producer per partition,
``transactional.id = <prefix>-engine-<p>``, as Kafka Streams' first exactly-once mode does): the alert
changes caused by the records of ``p``, the dead letters of its unusable records, the snapshot of ``p``'s
engine (with the events offsets it has read) on the compacted topic ``<prefix>-state`` (partition ``p``,
key ``p``), and the steps offset of ``p`` are committed in one transaction, at least every
``checkpoint_every_s`` and whenever a change is waiting. An engine taking ``p`` over (a restart after a
crash, or another member of the group) first initialises the transactional producer of ``p``, which fences
a killed or stalled previous owner and aborts its open transaction, then reads the last committed snapshot
of ``p`` and resumes from the committed offsets: what the previous owner had evaluated but not committed
is evaluated again, and the changes it had produced but not committed were never visible to
``read_committed`` readers (the notify loops). A commit that times out while a broker is away is retried
(the loop keeps consuming into the open transaction, for at most ``COMMIT_GIVE_UP_S``); one that needs
an abort is aborted, and one whose producer is unusable (a fatal error: fenced, ``INVALID_TXN_STATE``)
gets a new producer; either way ``p``'s last committed state is reloaded and its input read again from the
committed offset, or from where the partition started when nothing was committed yet. Delivery stays at-least-once: a change whose delivery was in flight when its notify loop
died is delivered again (sinks deduplicate by key).

Unusable input (``rules.intake``) and records whose evaluation raised go to ``obshub.dlq.v1`` with the
reason in the DLQ headers, counted in ``obshub_rules_dlq_total{topic}``; consumer errors are logged and
counted in ``obshub_rules_consumer_errors_total{topic}``.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgpack
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from obshub.core import kafka, schema
from obshub.core.log import NullLogger
from obshub.core.topics import replication_factor, topic_config
from obshub.rules import fields, intake
from obshub.rules.engine import Engine
from obshub.rules.model import RuleSet
from obshub.rules.service_common import (
    ABORTS,
    ACTIVE,
    CHANGES,
    COMMIT_RETRIES,
    CONSUMER_ERRORS,
    DLQ,
    EVAL_ERRORS,
    RECORDS,
    SKIPPED,
    TEMPLATE_ERRORS,
    consumer,
    consumer_lag,
    flush,
    log,
    pin_start,
    producer,
    wait_for_broker,
)
from obshub.rules.web import runbook_url

if TYPE_CHECKING:
    from obshub.rules.service import RuleService

MAX_FUTURE_S = 300  # a record time further ahead of this host's clock counts as 'now' (a wrong clock)
STATE_MAX_BYTES = 64 * 1024 * 1024  # a 2,048-host job's windows are ~3 MB of msgpack before compression
TRANSACTION_TIMEOUT_MS = 10_000  # how long a dead owner's open transaction can hold readers back
COMMIT_WAIT_S = 2.0  # one wait for a transaction commit; a commit not done by then is retried (SIGTERM stays prompt)
# a transaction still not committed this long after it began was aborted by its coordinator (its timeout is
# TRANSACTION_TIMEOUT_MS) unless the commit had reached it: the partition is reloaded with a new producer,
# whose init_transactions waits for that commit or abort to complete
COMMIT_GIVE_UP_S = 3 * TRANSACTION_TIMEOUT_MS / 1000


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash (the Java client's ``Utils.murmur2``), as an unsigned 32-bit int."""
    m, length = 0x5BD1E995, len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    rest, tail = length % 4, length - length % 4
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def partition_for(key: str, partitions: int) -> int:
    """The partition Kafka's default partitioner gives ``key`` (UTF-8) among ``partitions``."""
    return (murmur2(key.encode("utf-8")) & 0x7FFFFFFF) % partitions


@dataclass
class _Part:
    """One owned steps partition: its engine, transactional producer and progress."""

    p: int
    producer: Producer  # None only for the in-memory engine of a loop not yet running (engine_for)
    engine: Engine
    outbox: list[dict]
    events: dict[int, int] = field(default_factory=dict)  # events partition -> next offset to read
    next_offset: int | None = None  # steps offset to commit
    dirty: bool = False
    in_txn: bool = False
    committing: bool = False  # commit_transaction was called and must be retried before anything else
    retries: int = 0  # commit attempts that timed out in a row (one warning per streak)
    txn_since: float = 0.0  # monotonic time the open transaction began
    dead: list = field(default_factory=list)  # (message, error) for the DLQ, produced in the next transaction
    last_commit: float = 0.0


class _Engines:
    """What the web pages and ``RuleService`` read as ``engine``: the engines of one process (one per
    owned partition and the health engine) as one: their alerts, one external URL set on all, records
    evaluated where their job belongs."""

    def __init__(self, loop: "EngineLoop"):
        self.loop = loop

    def active(self) -> list:
        out = []
        for e in self.loop.engines():
            out += e.active()
        return sorted(out, key=lambda i: (i.rule, sorted(i.labels.items())))

    @property
    def ruleset(self) -> RuleSet:
        return self.loop.svc.ruleset

    @property
    def external_url(self) -> str:
        return self.loop.external_url

    @external_url.setter
    def external_url(self, url: str) -> None:
        self.loop.external_url = url
        for e in self.loop.engines():
            e.external_url = url

    def replace_rules(self, ruleset: RuleSet) -> None:
        self.loop.replace_rules(ruleset)

    def process(self, signal: str, record: dict) -> None:
        """Evaluate one record: a health record in the process-wide engine, any other in the engine of
        its job's partition (``EngineLoop.engine_for``)."""
        if signal == "health":
            self.loop.health_engine.process(signal, record)
        else:
            self.loop.engine_for(record.get("job", "")).process(signal, record)


def _split(ruleset: RuleSet) -> tuple[RuleSet, RuleSet]:
    """(rules of the partition engines, health rules of the process)."""
    job = {k: r for k, r in ruleset.rules.items() if r.signal != "health"}
    health = {k: r for k, r in ruleset.rules.items() if r.signal == "health"}
    return RuleSet(job, ruleset.inhibit, ruleset.files), RuleSet(health, ruleset.inhibit, ruleset.files)


class EngineLoop:
    """The engine loop of ``svc`` (module docstring). ``external_url`` prefixes generator URLs;
    ``checkpoint_every_s``: each owned partition's transaction is committed at least this often while it
    has new input (at once when an alert change waits)."""

    def __init__(self, svc: "RuleService", external_url: str, checkpoint_every_s: float = 1.0):
        self.svc, self.external_url, self.checkpoint_every_s = svc, external_url, checkpoint_every_s
        self.parts: dict[int, _Part] = {}
        self.health_outbox: list[dict] = []
        self.health_engine = Engine(_split(svc.ruleset)[1], self.health_outbox.append, external_url=external_url)
        self.engine = _Engines(self)
        self.state_topic = f"{svc.group_prefix}-state"
        self.started = time.monotonic()
        self.last_seen: dict[str, float] = {}
        self.decode_errors = 0
        self.n_steps = 0
        self.n_events = 0
        self._cons: Consumer | None = None
        self._events: Consumer | None = None
        self._reopen: set[int] = set()  # owned partitions whose engine could not be opened yet (broker away)
        self._start: dict[int, int] = {}  # steps partition -> offset it started at when assigned (pin_start)
        self._kinds_of: object = None
        self._kinds: frozenset[int] | None = None

    # -- engines -------------------------------------------------------------------------------------------
    @property
    def outbox(self) -> list[dict]:
        """Alert changes evaluated but not yet produced (health engine first, then per partition)."""
        out = list(self.health_outbox)
        for part in list(self.parts.values()):
            out += part.outbox
        return out

    def engines(self) -> list[Engine]:
        """Every engine of this process: one per owned steps partition, then the health engine."""
        return [part.engine for part in list(self.parts.values())] + [self.health_engine]

    def _new_engine(self, outbox: list[dict]) -> Engine:
        return Engine(
            _split(self.svc.ruleset)[0],
            outbox.append,
            external_url=self.external_url,
            retention_ns=int(self.svc.settings.rules_job_retention_s * 1e9),
        )

    def engine_for(self, job: str) -> Engine:
        """The engine that evaluates ``job``'s records: that of its steps partition. Before the loop has
        joined its group (a service built but not run: reload checks, tests) every job is evaluated in
        one in-memory engine, dropped when the loop starts. Raises KeyError when another engine of the
        group owns the job."""
        p = partition_for(job, self.n_steps) if self.n_steps else 0
        part = self.parts.get(p)
        if part is None:
            if self._cons is not None:
                raise KeyError(f"job {job!r} (partition {p} of {schema.TOPIC_STEPS}) is owned by another engine")
            outbox: list[dict] = []
            part = self.parts[p] = _Part(p, None, self._new_engine(outbox), outbox)  # type: ignore[arg-type]
        return part.engine

    def replace_rules(self, ruleset: RuleSet) -> None:
        job, health = _split(ruleset)
        for part in self.parts.values():
            part.engine.replace_rules(job)
            part.dirty = True
        self.health_engine.replace_rules(health)

    def event_kinds(self) -> frozenset[int] | None:
        """The event kinds the current rules read (``intake.event_kinds``, recomputed after a reload)."""
        if self._kinds_of is not self.svc.ruleset:
            self._kinds_of, self._kinds = self.svc.ruleset, intake.event_kinds(self.svc.ruleset)
        return self._kinds

    def reads_events(self) -> bool:
        rules = self.svc.ruleset.rules.values()
        return any(r.signal == "events" or (r.correlate and r.correlate.signal == "events") for r in rules)

    # -- kafka set-up --------------------------------------------------------------------------------------
    def _conn(self) -> kafka.KafkaConnection:
        return kafka.connection(self.svc.settings)

    def _ensure_state_topic(self) -> None:
        admin = AdminClient(kafka.admin_config(self._conn(), {"logger": NullLogger()}))
        waited = 0.0
        while True:
            md = admin.list_topics(timeout=10)
            steps = md.topics.get(schema.TOPIC_STEPS)
            if steps is not None and steps.error is None and steps.partitions:
                break
            if self.svc.stop.is_set():
                raise RuntimeError("stopped while waiting for the steps topic")
            if waited % 30 == 0:
                log.warning("engine: topic %s does not exist yet (`obshub up` creates it); waiting", schema.TOPIC_STEPS)
            time.sleep(1.0)
            waited += 1.0
        self.n_steps = len(steps.partitions)
        events = md.topics.get(schema.TOPIC_EVENTS)
        self.n_events = len(events.partitions) if events is not None and events.error is None else 0
        have = md.topics.get(self.state_topic)
        if have is not None and have.error is None and have.partitions:
            if len(have.partitions) != self.n_steps:
                raise RuntimeError(
                    f"{self.state_topic} has {len(have.partitions)} partitions, {schema.TOPIC_STEPS} "
                    f"{self.n_steps}: the engine state is per steps partition (delete it to start over)"
                )
            return
        fut = admin.create_topics(
            [
                NewTopic(
                    self.state_topic,
                    num_partitions=self.n_steps,
                    replication_factor=replication_factor(),
                    config={
                        **topic_config(self.state_topic),
                        "max.message.bytes": str(STATE_MAX_BYTES),
                        "segment.ms": "600000",
                    },
                )
            ]
        )[self.state_topic]
        try:
            fut.result(30)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise

    def _producer(self, p: int) -> Producer:
        prod = producer(
            self.svc.settings,
            self.svc.watch,
            {
                "transactional.id": f"{self.svc.group_prefix}-engine-{p}",
                "compression.type": "lz4",
                "message.max.bytes": STATE_MAX_BYTES,
                "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
            },
        )
        prod.init_transactions(60)  # fences the previous owner of p and aborts its open transaction
        return prod

    def _load_state(self, p: int) -> dict | None:
        """The last committed snapshot of partition ``p`` (read_committed), or None."""
        c = Consumer(
            kafka.consumer_config(
                self._conn(),
                f"{self.svc.group_prefix}-state-{uuid.uuid4().hex}",
                {
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                    "logger": NullLogger(),
                    "fetch.message.max.bytes": STATE_MAX_BYTES,
                    "receive.message.max.bytes": STATE_MAX_BYTES + 65536,
                },
            )
        )
        try:
            lo, hi = c.get_watermark_offsets(TopicPartition(self.state_topic, p), timeout=10, cached=False)
            if hi <= lo:
                return None
            start, found = max(lo, hi - 32), None
            while True:
                c.assign([TopicPartition(self.state_topic, p, start)])
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    m = c.poll(0.2)
                    if m is not None and not m.error() and m.key() == str(p).encode():
                        found = m.value()
                    pos = c.position([TopicPartition(self.state_topic, p)])[0].offset
                    if m is None and pos >= hi:
                        break
                if found is not None or start == lo:
                    break
                start = max(lo, start - 4 * (hi - start))
            return msgpack.unpackb(found, raw=False, strict_map_key=False) if found is not None else None
        finally:
            c.close()

    # -- rebalance -----------------------------------------------------------------------------------------
    def _open(self, p: int) -> None:
        outbox: list[dict] = []
        part = _Part(p, self._producer(p), self._new_engine(outbox), outbox)
        state = self._load_state(p)
        if state:
            part.engine.restore(state["engine"])
            part.events = {int(q): int(o) for q, o in state.get("events", {}).items()}
        if self._events is not None:
            for q in range(self.n_events):
                if q not in part.events:
                    lo, hi = self._events.get_watermark_offsets(
                        TopicPartition(schema.TOPIC_EVENTS, q), timeout=10, cached=False
                    )
                    part.events[q] = lo if self.svc.from_beginning else hi
        self.parts[p] = part
        log.info(
            "engine: took over partition %d of %s (%s)",
            p,
            schema.TOPIC_STEPS,
            f"state of {len(part.engine.instances)} alert(s) restored" if state else "no saved state",
        )

    def _on_assign(self, cons: Consumer, partitions) -> None:
        if partitions:
            for tp in pin_start(cons, partitions, self.svc.settings, self.svc.from_beginning):
                if tp.topic == schema.TOPIC_STEPS and tp.offset >= 0:
                    self._start[tp.partition] = tp.offset  # where _reload goes back to before a first commit
        for tp in partitions:
            if tp.topic == schema.TOPIC_STEPS and tp.partition not in self.parts:
                try:
                    self._open(tp.partition)
                except KafkaException as exc:  # a broker away: its records wait (skipped, then read again)
                    self._reopen_later(tp.partition, exc)
        self._assign_events()

    def _on_revoke(self, cons: Consumer, partitions) -> None:
        for tp in partitions:
            if tp.topic == schema.TOPIC_STEPS:
                self._reopen.discard(tp.partition)
            part = self.parts.pop(tp.partition, None) if tp.topic == schema.TOPIC_STEPS else None
            if part is None:
                continue
            try:
                self._commit(part, cons, force=True, reopen=False)
            except KafkaException as exc:  # the next owner resumes from the last committed transaction
                log.warning("engine: final commit of partition %d failed: %s", part.p, exc)
            part.producer.flush(10)
            log.info("engine: gave up partition %d of %s", part.p, schema.TOPIC_STEPS)
        self._assign_events()

    def _start_events_consumer(self) -> None:
        """The events consumer: a group of its own (positions come from the engines' state, never from
        group commits), assigned explicitly by ``_assign_events``."""
        svc = self.svc
        self._events = consumer(
            svc.settings,
            f"{svc.group_prefix}-engine-events-{uuid.uuid4().hex}",
            "earliest" if svc.from_beginning else "latest",
            svc.watch,
        )

    def _start_events(self) -> None:
        """Start reading events (rules that read them were loaded): every owned partition from now."""
        self._start_events_consumer()
        for part in self.parts.values():
            for q in range(self.n_events):
                if q not in part.events:
                    part.events[q] = self._events.get_watermark_offsets(
                        TopicPartition(schema.TOPIC_EVENTS, q), timeout=10, cached=False
                    )[1]
        self._assign_events()

    def _assign_events(self) -> None:
        if self._events is None:
            return
        if not self.parts:
            self._events.unassign()
            return
        starts = {q: min(part.events.get(q, 0) for part in self.parts.values()) for q in range(self.n_events)}
        self._events.assign([TopicPartition(schema.TOPIC_EVENTS, q, o) for q, o in starts.items()])

    # -- transactions --------------------------------------------------------------------------------------
    def _begin(self, part: _Part) -> None:
        if not part.in_txn:
            part.producer.begin_transaction()
            part.in_txn = True
            part.txn_since = time.monotonic()

    def _commit(self, part: _Part, cons: Consumer, force: bool = False, reopen: bool = True) -> None:
        """Commit ``part``'s alert changes, dead letters, snapshot and steps offset in one transaction.
        A commit that timed out is retried by the next call; a transaction that cannot complete is
        aborted and, with ``reopen``, the partition goes back to its last committed state and offsets."""
        if not (part.outbox or part.dead or part.dirty or part.in_txn):
            return
        if not force and not part.outbox and time.monotonic() - part.last_commit < self.checkpoint_every_s:
            return
        if not force and part.committing and time.monotonic() - part.last_commit < 1.0:
            return  # a commit that timed out (broker away) is retried once a second
        prod = part.producer
        t0 = time.monotonic()
        try:
            if not part.committing:
                self._begin(part)
                for msg, exc in part.dead:
                    intake.dead_letter(prod, msg, exc, f"{self.svc.group_prefix}-engine")
                part.dead.clear()
                for rec in part.outbox:
                    self._produce_change(prod, rec)
                part.outbox.clear()
                state = {
                    "v": 1,
                    "partition": part.p,
                    "engine": part.engine.snapshot(),
                    "events": {str(q): o for q, o in part.events.items()},
                }
                prod.produce(
                    self.state_topic,
                    key=str(part.p).encode(),
                    partition=part.p,
                    value=msgpack.packb(state, use_bin_type=True),
                )
                if part.next_offset is not None:
                    prod.send_offsets_to_transaction(
                        [TopicPartition(schema.TOPIC_STEPS, part.p, part.next_offset)],
                        cons.consumer_group_metadata(),
                        COMMIT_WAIT_S,
                    )
                part.committing = True
            prod.commit_transaction(COMMIT_WAIT_S)
        except KafkaException as exc:
            err = exc.args[0]
            # librdkafka's classes: retriable (call the same API again), abortable (abort, then a new
            # transaction), fatal (PRODUCER_FENCED, INVALID_TXN_STATE, ...: the producer is unusable). An
            # error with no class (a local state error) is treated as fatal: a new producer is always safe.
            abortable = err.txn_requires_abort() and not err.fatal()
            fatal = not abortable and not err.retriable() or err.fatal()
            if err.retriable() and not fatal and not abortable:
                if time.monotonic() - part.txn_since < COMMIT_GIVE_UP_S:  # a broker away: the same commit again
                    part.last_commit = time.monotonic()
                    COMMIT_RETRIES.inc()
                    part.retries += 1
                    (log.warning if part.retries == 1 else log.debug)(
                        "engine: commit of partition %d not done yet, retried every second: %s", part.p, err
                    )
                    return
                fatal = True  # the coordinator has aborted it by now: a new producer finds out what is committed
            if not fatal:  # abortable (a produce failed, the coordinator timed the transaction out)
                try:
                    prod.abort_transaction(COMMIT_WAIT_S)
                except KafkaException as abort_exc:  # a broker still away: the next init_transactions aborts it
                    log.debug("engine: abort of partition %d failed: %s", part.p, abort_exc)
            part.in_txn = part.committing = False
            ABORTS.inc()
            log.warning(
                "engine: transaction of partition %d aborted (%s)%s; %s",
                part.p,
                err,
                ": the producer is unusable, a new one fences it" if fatal else "",
                "reloading its last committed state" if reopen else "its next owner resumes from the last commit",
            )
            if reopen:
                self._reload(part.p, cons)
            return
        part.in_txn, part.committing, part.dirty, part.last_commit = False, False, False, time.monotonic()
        part.retries = 0
        if part.last_commit - t0 > 1.0:
            log.warning(
                "engine: the transaction of partition %d took %.1f s (evaluation waits meanwhile)",
                part.p,
                part.last_commit - t0,
            )

    def _reload(self, p: int, cons: Consumer) -> None:
        """After an aborted transaction: back to the last committed state and offsets of partition ``p``
        (a new transactional producer, which fences the old one); with no committed offset yet, back to the
        offset ``p`` started at when it was assigned (``OFFSET_BEGINNING`` with ``from_beginning`` when that
        is unknown), so no record evaluated in the lost transaction is skipped. When the broker does not answer, ``p``
        has no engine meanwhile (its records are read past and read again) and is retried every second."""
        self.parts.pop(p, None)
        try:
            self._open(p)
            committed = cons.committed([TopicPartition(schema.TOPIC_STEPS, p)], timeout=10)[0]
            if committed.offset >= 0:
                cons.seek(committed)
            elif p in self._start:  # nothing committed yet: back to where the partition started
                cons.seek(TopicPartition(schema.TOPIC_STEPS, p, self._start[p]))
            elif self.svc.from_beginning:
                cons.seek(TopicPartition(schema.TOPIC_STEPS, p, OFFSET_BEGINNING))
            else:
                log.warning(
                    "engine: partition %d has no committed offset and its start is unknown: the records read "
                    "in the lost transaction are not evaluated again",
                    p,
                )
        except KafkaException as exc:
            self.parts.pop(p, None)
            self._reopen_later(p, exc)
            return
        self._reopen.discard(p)
        self._assign_events()

    def _reopen_later(self, p: int, exc: KafkaException) -> None:
        if p not in self._reopen:
            log.warning(
                "engine: partition %d of %s not opened yet (%s); retried every second", p, schema.TOPIC_STEPS, exc
            )
        self._reopen.add(p)

    def _produce_change(self, prod: Producer, rec: dict) -> None:
        CHANGES.labels(rec["rule"], rec["status"]).inc()
        rec["engine"] = self.svc.group_prefix
        link = runbook_url(rec["annotations"].get("runbook", ""), self.svc.config.runbook_base_url)
        if link:
            rec["annotations"].setdefault("runbook_url", link)
        prod.produce(schema.TOPIC_ALERTS, key=rec["fingerprint"], value=json.dumps(rec).encode())
        log.info("alert %s %s %s", rec["status"], rec["rule"], rec["labels"])

    # -- input ---------------------------------------------------------------------------------------------
    def _dead_letter(self, part: _Part, msg, exc: Exception) -> None:
        self.decode_errors += 1
        DLQ.labels(msg.topic()).inc()
        part.dead.append((msg, exc))  # produced with the next transaction (also when one is being committed)
        part.dirty = True
        reason = str(exc) or type(exc).__name__
        log.warning(
            "%s[%d]@%d not usable, sent to %s: %s", msg.topic(), msg.partition(), msg.offset(), schema.TOPIC_DLQ, reason
        )

    def _evaluate(self, part: _Part, msg, records: list[tuple[str, dict]]) -> None:
        limit = time.time_ns() + MAX_FUTURE_S * 1_000_000_000
        for signal_name, rec in records:
            if rec["time_ns"] > limit:  # a host with a wrong clock must not move the engine's clock
                rec["time_ns"] = time.time_ns()
            RECORDS.labels(signal_name).inc()
            try:
                part.engine.process(signal_name, rec)
            except Exception as exc:  # noqa: BLE001 - a record the checks let through must not stop the engine: logged, dead-lettered, counted in obshub_rules_dlq
                log.exception("evaluating %s[%d]@%d failed", msg.topic(), msg.partition(), msg.offset())
                self._dead_letter(
                    part, msg, schema.SchemaError("", f"rule evaluation failed: {type(exc).__name__}: {exc}")
                )
                break
        part.dirty = True

    def _step_message(self, m) -> None:
        part = self.parts.get(m.partition())
        if part is None:
            return
        try:
            records = intake.decode(m.topic(), m.value())
        except schema.SchemaError as exc:
            self._dead_letter(part, m, exc)
            records = []
        self._evaluate(part, m, records)
        part.next_offset = m.offset() + 1

    def _event_message(self, m) -> None:
        q, off = m.partition(), m.offset()
        want = [part for part in self.parts.values() if part.events.get(q, 0) <= off]
        if not want:
            return
        for part in want:
            part.events[q] = off + 1
        try:
            batch = intake.decode_event_batch(m.value(), self.event_kinds())
        except schema.SchemaError as exc:
            owner = self.parts.get(q % self.n_steps)  # one engine dead-letters an undecodable batch
            if owner is not None and owner in want:
                self._dead_letter(owner, m, exc)
            return
        owner = self.parts.get(partition_for(batch.job, self.n_steps))
        if owner is None or owner not in want:
            return
        skipped = batch.events - len(batch.records)
        if skipped:  # of kinds no rule reads: counted, never decoded
            SKIPPED.inc(skipped)
            RECORDS.labels("events").inc(skipped)
        if batch.records:
            self._evaluate(owner, m, [("events", rec) for rec in batch.records])

    def _health(self) -> None:
        now = time.time_ns()
        lag: dict[str, int] = {}
        for cons in (self._cons, self._events):
            if cons is None:
                continue
            try:
                consumer_lag(cons, lag)
            except (KafkaException, RuntimeError) as exc:  # health is best effort (RuntimeError: closed)
                log.debug("lag measurement failed: %s", exc)
        uptime = time.monotonic() - self.started
        topics = [schema.TOPIC_STEPS] + ([schema.TOPIC_EVENTS] if self._events is not None else [])
        for topic in topics:
            seen = self.last_seen.get(topic)
            idle = time.monotonic() - seen if seen is not None else uptime
            self.health_engine.process(
                "health",
                fields.health_record(topic, f"{self.svc.group_prefix}-engine", lag.get(topic, 0), idle, uptime, now),
            )

    def _publish_health(self, prod: Producer) -> None:
        for rec in self.health_outbox:
            self._produce_change(prod, rec)
        self.health_outbox.clear()
        left = flush(prod, self.svc.stop, self.svc.watch)  # through an outage; bounded once stopping
        if left:
            log.error("stopping with %d health alert change(s) not acknowledged by Kafka", left)

    def _consumer_error(self, m) -> None:
        """A consumer error instead of a message: counted and logged (the client retries by itself)."""
        if m.error().code() == KafkaError._PARTITION_EOF:
            return
        CONSUMER_ERRORS.labels(m.topic() or "-").inc()
        log.warning("engine: consumer error on %s: %s", m.topic() or "-", m.error())

    # -- the loop ------------------------------------------------------------------------------------------
    def run_engine(self) -> None:
        """The engine loop; returns when the service's ``stop`` is set (committing what it owns)."""
        svc = self.svc
        if not wait_for_broker(svc.settings.bootstrap_servers, svc.stop, svc.watch):
            return  # stopped before the broker ever answered
        self.parts.clear()  # records evaluated before the loop ran (engine_for) belong to no partition
        self._ensure_state_topic()
        reset = "earliest" if svc.from_beginning else "latest"
        if self.reads_events():
            self._start_events_consumer()
        cons = self._cons = consumer(
            svc.settings, f"{svc.group_prefix}-engine", reset, svc.watch, {"partition.assignment.strategy": "range"}
        )
        cons.subscribe(
            [schema.TOPIC_STEPS], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_revoke
        )
        health = producer(svc.settings, svc.watch)
        last_tick = last_health = 0.0
        try:
            while not svc.stop.is_set():
                for m in cons.consume(num_messages=500, timeout=0.1):
                    if m.error():
                        self._consumer_error(m)
                        continue
                    self.last_seen[m.topic()] = time.monotonic()
                    self._step_message(m)
                if self._events is not None and self.parts:
                    for m in self._events.consume(num_messages=500, timeout=0.1):
                        if m.error():
                            self._consumer_error(m)
                            continue
                        self.last_seen[m.topic()] = time.monotonic()
                        self._event_message(m)
                mono = time.monotonic()
                if mono - last_tick >= 1.0:
                    now = time.time_ns()
                    for e in self.engines():
                        e.tick(now)
                    ACTIVE.set(len(self.engine.active()))
                    EVAL_ERRORS.set(sum(e.eval_errors for e in self.engines()))
                    TEMPLATE_ERRORS.set(sum(e.template_errors for e in self.engines()))
                    for p in sorted(self._reopen):
                        self._reload(p, cons)
                    if svc.maybe_reload() and self._events is None and self.reads_events():
                        self._start_events()
                    last_tick = mono
                if mono - last_health >= svc.health_every_s:
                    self._health()
                    last_health = mono
                if self.health_outbox:
                    self._publish_health(health)
                for part in list(self.parts.values()):
                    part.dirty = part.dirty or part.engine.dirty
                    part.engine.dirty = False
                    self._commit(part, cons)
        finally:
            if svc.resolve_on_exit:  # an engine that stops for good: its alerts end with it
                resolved = 0
                for part in list(self.parts.values()):
                    part.engine.now_ns = max(part.engine.now_ns, time.time_ns())
                    resolved += part.engine.resolve_all()
                    part.dirty = True
                log.info("engine: resolved %d firing alert(s) at exit (--resolve-on-exit)", resolved)
            for part in list(self.parts.values()):
                try:
                    self._commit(part, cons, force=True, reopen=False)
                except KafkaException as exc:  # the next owner resumes from the last committed transaction
                    log.warning("engine: final commit of partition %d failed: %s", part.p, exc)
            if self.health_outbox:
                self._publish_health(health)
            cons.close()
            if self._events is not None:
                self._events.close()
