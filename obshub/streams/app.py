"""The Faust application: ingest -> repartition by (job, step) -> fold per host -> close -> summary.

Faust has no stream-stream join, so the cross-node join is built from two agents and changelog-backed
tables (docs/STREAMS.md has the diagram, the state layout and the guarantees):

1. ``ingest`` reads agent batches (input topic, keyed by host): ``streams.ingest.Ingest`` decodes
   (``streams.wire``), tracks sequences in the ``agents`` table and reduces the batch to one accumulator
   per (job, step, host), sent to the internal topic ``<app>-steps`` keyed by ``job|step``. Hosts of a job
   are broadcast to every partition of the internal topic. Undecodable input goes to the DLQ unchanged
   (value and key) with the headers of ``schema.DLQ_HEADERS``.
2. ``fold`` reads ``<app>-steps``: ``streams.fold.Fold`` keeps each host's share of an open step under its
   own key, closes a step when every expected host reported STEP_END, summarises it
   (``streams.analysis.summarize``, JSON on the output topic keyed by job) and broadcasts the step time
   to every partition's history (the baseline).
3. ``expire`` (timer, every worker, its active partitions only) sends a ``close`` request into the
   partition of every step open longer than the window, so every table write happens inside the fold
   agent, in partition order.
4. ``watch`` (timer, every 0.5 s): hangs (``Fold.hangs``, docs/ANALYSIS.md "Hangs"): a hung step gets an
   interim summary (``closed_by = "hang"``, the ``hang`` field) on the output topic once a second while
   it hangs, and is not closed by its window; no new hang is declared while this worker is behind on its
   input or internal topic (a host's data waiting in Kafka is no silence). Steps that run far longer than
   usual (``Fold.running``, docs/ANALYSIS.md "Inside a running step") get an interim summary
   (``closed_by = "running"``) naming the hosts whose every busy connection is slow or lossy, every tick
   while it lasts and the worker is not behind; the fold agent also sends one as soon as new parts of such
   a step arrive (``Fold.running_arrived``, at most once per step per 100 ms).
5. ``progress`` (timer, every 0.5 s): the input partitions this worker has read to their end, as a
   ``read`` message to every partition of the internal topic. A step closes by its window only when every
   input partition was read past the window's end, so a worker failover (unread partitions) lists no live
   host as missing (``Fold.input_read_past``). Sent every tick only while something needs fresh reports
   (:class:`ReadReports`: new input read by this worker or, by the ``new`` flag of their reports, by
   another within the window and a few seconds, or an open step in this worker's fold); an idle worker
   sends one every ``READ_IDLE_EVERY_S`` (the retention sweep's read check).
6. Both agents check every record's offset against the next one expected (``streams.reread``): a range
   the Faust consumer skipped is read again and processed before the record that revealed it.

Guarantee: at-least-once processing (Faust flushes the producer before committing offsets) made
effectively exactly-once per (job, step) by the idempotent fold and the ``closed`` table; the one window
left is a crash after the summary reached the broker but before the ``closed`` changelog record did,
which can repeat one summary: consumers dedupe by (job, life, step) (``obshub tail steps`` does).
"""

from __future__ import annotations

import gc
import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import faust
from faust.types import TP

from obshub.core import kafka, schema
from obshub.core.settings import STREAMS
from obshub.core.topics import CHANGELOG_MAX_BYTES, replication_factor
from obshub.streams import analysis, faustkit, reread, wire
from obshub.streams.fold import Fold, WriteBack
from obshub.streams.ingest import Ingest
from obshub.streams.metrics import WorkerMetrics
from obshub.streams.topics import TABLES, partition_of

log = logging.getLogger("obshub.streams")

READ_MARGIN_NS = 1_000_000_000  # an input partition reported read to its end counts as read this long before
READ_IDLE_EVERY_S = STREAMS.read_idle_every_s  # 5 s: an idle worker's ``read`` report at most this often
TAKE_MAX = 2048  # messages an agent takes from its stream per round (when that many are waiting)
TAKE_WITHIN_S = 0.1  # ... or what arrived within this long (s)
BATCH_MAX_BYTES = 512 * 1024  # one internal batch message at most (the topic's default limit is 1 MB)


_as_current = faustkit.as_current  # Faust's internals: obshub/streams/faustkit.py


class _Outbox:
    """Internal messages of one agent round, per destination partition, sent as ``{"t": "batch", "msgs":
    [msgpack bytes, ...]}`` messages of at most ``BATCH_MAX_BYTES`` (``Fold.apply_batch`` applies them
    in order): one Kafka message per partition and round instead of one per host-step part."""

    def __init__(self, partitions: int):
        self.partitions = partitions
        self.msgs: dict[int, list[bytes]] = {}
        self.size: dict[int, int] = {}
        self.seen: set[bytes] = set()

    def add(self, p: int, value: dict, raw: bytes | None = None) -> None:
        raw = raw if raw is not None else wire.packb(value)
        self.msgs.setdefault(p, []).append(raw)
        self.size[p] = self.size.get(p, 0) + len(raw)

    def broadcast(self, value: dict) -> None:
        raw = wire.packb(value)
        if raw in self.seen:  # the same registration twice in one round changes nothing
            return
        self.seen.add(raw)
        for p in range(self.partitions):
            self.add(p, value, raw)

    async def send(self, rep) -> None:
        for p, msgs in sorted(self.msgs.items()):
            chunk: list[bytes] = []
            size = 0
            for raw in msgs:
                if chunk and size + len(raw) > BATCH_MAX_BYTES:
                    await rep.send(key=b"batch", value={"t": "batch", "msgs": chunk}, partition=p)
                    chunk, size = [], 0
                chunk.append(raw)
                size += len(raw)
            if chunk:
                await rep.send(key=b"batch", value={"t": "batch", "msgs": chunk}, partition=p)
        self.msgs.clear()
        self.size.clear()
        self.seen.clear()


@dataclass
class WorkerConfig:
    """Everything one worker needs. Times in seconds; sizes in bytes.

    ``partitions``: partitions of the internal ``<app_id>-steps`` topic and of the fold tables (the
    parallelism of the join). ``window_s``: a step closes at most this long after its first data arrived
    (processing time). ``dlq_max_bytes``: a DLQ record keeps the original value up to this size (larger
    values are cut, with header ``obshub.truncated`` = original length) so a huge message cannot block it.
    ``job_retention_s``: a job's state (tables, changelogs, memory) is dropped this long after its last
    data, and an agent instance's sequence record this long after its last batch (docs/STREAMS.md
    "Retention"). ``read_idle_every_s``: an idle worker's ``read`` report at most this often (:class:`ReadReports`).
    """

    app_id: str = STREAMS.app_id
    bootstrap: str = STREAMS.bootstrap
    input_topic: str = schema.TOPIC_EVENTS
    output_topic: str = schema.TOPIC_STEPS
    dlq_topic: str = schema.TOPIC_DLQ
    partitions: int = STREAMS.partitions
    window_s: float = STREAMS.window_s
    state_dir: Path = Path("state")
    metrics_port: int = STREAMS.metrics_port
    dlq_max_bytes: int = STREAMS.dlq_max_bytes
    job_retention_s: float = STREAMS.job_retention_s
    read_idle_every_s: float = STREAMS.read_idle_every_s
    thresholds: analysis.Thresholds = field(default_factory=analysis.Thresholds)


def _send_error(metrics: WorkerMetrics):
    def on_error(exc: BaseException) -> None:  # Faust reports a failed produce only to sensors
        metrics.send_errors.inc()
        log.error("Failed to produce a message: %r", exc)

    return on_error


def _faust_app(cfg: WorkerConfig, metrics: WorkerMetrics) -> faust.App:
    """The Faust app object: in-memory tables recovered from compacted changelogs, no web server."""
    app = faust.App(
        cfg.app_id,
        **kafka.faust_kwargs(kafka.KafkaConnection(bootstrap=cfg.bootstrap)),
        store="memory://",
        datadir=str(cfg.state_dir / cfg.app_id),
        topic_partitions=cfg.partitions,
        topic_replication_factor=replication_factor(),
        table_standby_replicas=0,
        web_enabled=False,
        autodiscover=False,
        broker_session_timeout=6.0,
        broker_heartbeat_interval=1.0,
        broker_commit_interval=1.0,
        consumer_auto_offset_reset="earliest",
        producer_max_request_size=CHANGELOG_MAX_BYTES,  # the changelogs' max.message.bytes
        producer_max_batch_size=512 * 1024,  # bytes per partition and request: well under the 1 MB topic limit
        producer_linger=0.005,  # s: records sent within this long share one produce request
        consumer_max_fetch_size=16 * 1024 * 1024,
    )
    app.sensors.add(faustkit.SendErrors(_send_error(metrics)))
    faustkit.lean_sensors(app)
    faustkit.idempotent_producer(app)  # no duplicate from a produce retried after a broker loss (#32)
    return app


def _skipped(table, msg, which: str, bad) -> None:
    log.error(
        "skipped a changelog record of table %s that does not decode, %s[%d]@%d: %s (%s)",
        table.name,
        msg.topic,
        msg.partition,
        msg.offset,
        which,
        bad.reason,
    )
    if table.obshub_metrics is not None:
        table.obshub_metrics.changelog_skips.labels(table.name).inc()


class _Table(faustkit.RecoveringTable):
    """A table whose recovery skips changelog records that do not decode (``wire.Undecodable`` key or
    value): each is logged with its position and counted (``obshub_streams_changelog_skipped_total``),
    and recovery goes on, so one damaged record cannot keep the worker from becoming ready."""

    obshub_metrics: WorkerMetrics | None = None
    is_bad = staticmethod(lambda x: isinstance(x, wire.Undecodable))
    on_skip = staticmethod(_skipped)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # values: msgpack (reading older workers' JSON too); keys: the JSON text they always had (their
        # bytes are what compaction and tombstones match); neither raises on a damaged record
        self.key_serializer = wire.CHANGELOG_JSON
        self.value_serializer = wire.CHANGELOG


def _tables(app: faust.App, cfg: WorkerConfig, input_partitions: int, metrics: WorkerMetrics) -> dict:
    """The app's tables (``streams.topics.TABLES``): changelog values msgpack, keys the JSON text of the
    key string (``_Table``)."""
    schema_ = faust.Schema(key_serializer=wire.STR, value_serializer=wire.MSGPACK)
    out = {}
    for name, like in TABLES.items():
        table = _Table(
            app,
            name=name,
            beacon=app.tables.beacon,
            schema=schema_,
            partitions=input_partitions if like == "input" else cfg.partitions,
        )
        table.obshub_metrics = metrics
        out[name] = app.tables.add(table)
    return out


def _dlq_record(cfg: WorkerConfig, msg, exc: BaseException, stage: str = "") -> tuple[bytes, list]:
    """The DLQ value (the original, cut at ``dlq_max_bytes``) and headers for an unusable message: its own
    headers unchanged, then those of ``schema.DLQ_HEADERS``. ``exc``: the ``schema.SchemaError`` naming the
    field, or the exception the worker's ``stage`` failed with on it (reason ``<stage> failed: <type>:
    <message>``, no field)."""
    return _dlq_value(cfg, msg.value or b"", msg.headers or [], msg.topic, msg.partition, msg.offset, exc, stage)


def _dlq_value(cfg: WorkerConfig, value: bytes, own, topic: str, partition: int, offset: int, exc, stage=""):
    headers = list(own.items() if isinstance(own, Mapping) else own)
    if isinstance(exc, schema.SchemaError):
        reason, fld = str(exc), exc.field or ""
    else:
        reason, fld = f"{stage} failed: {type(exc).__name__}: {exc}", ""
    headers += [
        ("obshub.reason", reason.encode()),
        ("obshub.field", fld.encode()),
        ("obshub.source.topic", topic.encode()),
        ("obshub.source.partition", str(partition).encode()),
        ("obshub.source.offset", str(offset).encode()),
        ("obshub.consumer", cfg.app_id.encode()),
    ]
    if len(value) > cfg.dlq_max_bytes:
        headers.append(("obshub.truncated", str(len(value)).encode()))
        value = value[: cfg.dlq_max_bytes]
    return value, headers


class ReadReports:
    """When the ``progress`` timer sends its ``read`` report (module docstring, 5.): :meth:`due` answers
    per tick. Due when the input positions this worker has read to (``positions``: input partition ->
    next offset, only those read to their end) changed since the last report (new input, or another
    assignment), while new input was read by this worker or another (``others_new_s``: seconds since
    the fold last saw a report flagged ``new``) within ``active_s`` (the step window plus
    ``2 * READ_MARGIN_NS``: every step that input opened can close by its window, and the hang and
    running checks have reports a few seconds old), while ``open_steps`` (this worker's fold holds an
    open step: a hang, a step waiting for its window), or at most every ``idle_every_s`` otherwise (the
    retention sweep's read check: ``Fold.expired_jobs``). An idle worker then writes one report per
    ``idle_every_s`` instead of two a second. Times are time.monotonic() seconds."""

    def __init__(self, active_s: float, idle_every_s: float = READ_IDLE_EVERY_S):
        self.active_s, self.idle_every_s = active_s, idle_every_s
        self.positions: dict[int, int] | None = None
        self.new_at = -math.inf  # when this worker last read new input (monotonic s)
        self.sent_at = -math.inf

    def due(self, now: float, positions: dict[int, int], others_new_s: float, open_steps: bool) -> tuple[bool, bool]:
        """``(send, new)``: whether to send the report now, and whether it carries new input (its ``new``
        flag). Records the send when ``send``."""
        new = positions != self.positions
        if new:
            self.positions, self.new_at = dict(positions), now
        active = now - self.new_at < self.active_s or others_new_s < self.active_s or open_steps
        send = active or now - self.sent_at >= self.idle_every_s
        if send:
            self.sent_at = now
        return send, new


def _add_ingest(app, cfg: WorkerConfig, m: WorkerMetrics, tables: dict, rep, rate: dict, fold: Fold) -> None:
    """The ``ingest`` agent: input topic -> ``Ingest`` -> internal topic (and the DLQ)."""
    src = app.topic(cfg.input_topic, key_serializer="raw", value_serializer="raw")
    dlq = app.topic(cfg.dlq_topic, key_serializer="raw", value_serializer="raw")
    ing = Ingest(tables["agents"])
    conn = kafka.KafkaConnection(bootstrap=cfg.bootstrap)
    sought = reread.track_seeks(app)

    def start(p: int) -> int | None:  # what any worker processed; else where this generation's seek went
        nxt = reread.next_input_offset(tables["agents"], tables["inputs"], p)
        return nxt if nxt is not None else sought(TP(cfg.input_topic, p))

    guard = reread.OffsetGuard("ingest", m.consumer_skips.inc, start, m.housekeeping_errors.labels("offset_check").inc)

    counts = {"batches": 0, "events": 0, "sent_ns": 0}  # of the round, added to the metrics once per round

    async def one(msg, box: _Outbox) -> None:
        r = ing.handle(msg.value, msg.topic, msg.partition, msg.offset)
        if r.error is not None:
            tables["inputs"][str(msg.partition)] = msg.offset + 1  # what was processed, for OffsetGuard
            value, headers = _dlq_record(cfg, msg, r.error)
            await dlq.send(key=msg.key, value=value, headers=headers)
            m.dlq.labels(r.error.field or "message").inc()
            log.warning("DLQ %s[%d]@%d: %s", msg.topic, msg.partition, msg.offset, r.error)
            return
        if r.dup:
            m.dups.inc()
            return
        if r.replay:
            m.replayed.inc()
        if r.late:
            m.late_batches.inc()
        if r.lost:
            m.lost.inc(r.lost)
        counts["batches"] += 1
        counts["events"] += r.events
        if r.sent_ns > counts["sent_ns"]:
            counts["sent_ns"] = r.sent_ns
        for what, key, value in r.sends:
            if what == "broadcast":
                box.broadcast(value)
            else:
                box.add(partition_of(key.encode(), cfg.partitions), value)

    done: dict = {}  # input TP -> next offset after the last message fully processed by this process
    agents = tables["agents"]
    retention_ns = int(cfg.job_retention_s * 1e9)
    sweep_ns = retention_sweep_ns(cfg.job_retention_s)
    swept = {"at": time.time_ns()}

    def drop_agents(last: dict) -> None:
        # retention: sequence records of agent instances without a batch for retention_ns, of the input
        # partitions this round read (the delete is a tombstone in that partition's changelog)
        now = time.time_ns()
        if now - swept["at"] < sweep_ns:
            return
        swept["at"] = now
        gone = ing.expired_agents(retention_ns, set(last), now)
        for aid in gone:
            st = agents.get(aid)
            if st is not None:
                _as_current(last[st["partition"]])
                del agents[aid]
        if gone:
            n = len(gone)
            log.info("dropped %d agent instance record(s) without a batch for %.0f s", n, cfg.job_retention_s)

    @app.agent(src, name="ingest")
    async def ingest(stream):
        # One round = up to TAKE_MAX input messages: their parts leave as one internal message per fold
        # partition, and each agent's sequence record is written once (Faust acks the round's messages
        # after this body, and commits only after the producer flushed what the round sent).
        box = _Outbox(cfg.partitions)
        async for events in stream.take_events(TAKE_MAX, within=TAKE_WITHIN_S):
            ing.agents = cache = WriteBack(agents)
            last = {}  # input partition -> the round's last event from it (the agents table's partition)
            for event in events:
                msg = event.message
                last[msg.partition] = event
                try:
                    _as_current(event)  # the inputs table's writes go to this record's partition
                    gap = guard.check(msg.tp, msg.offset, msg.generation_id)
                    if gap is not None:  # skipped by the consumer: processed first (obshub/streams/reread.py)
                        for rec in await reread.read_range(conn, msg.topic, msg.partition, *gap):
                            _as_current(event)
                            await one(rec, box)
                    _as_current(event)
                    await one(msg, box)
                except Exception as exc:  # a bug must not stop the worker: logged, counted, dead-lettered
                    log.exception("ingest failed on %s[%d]@%d", msg.topic, msg.partition, msg.offset)
                    m.processing_errors.labels("ingest").inc()
                    tables["inputs"][str(msg.partition)] = msg.offset + 1  # processed: the consumer moves past it
                    value, headers = _dlq_record(cfg, msg, exc, "ingest")
                    await dlq.send(key=msg.key, value=value, headers=headers)
            ing.agents = agents
            if counts["batches"]:
                m.batches.inc(counts["batches"])
                m.events.inc(counts["events"])
                rate["events"] += counts["events"]
                if counts["sent_ns"]:
                    m.lag_s.set(max(0.0, time.time() - counts["sent_ns"] / 1e9))
                counts.update(batches=0, events=0, sent_ns=0)
            for aid, st in cache.dirty.items():
                _as_current(last.get(st["partition"], events[-1]))
                agents[aid] = st
            cache.dirty.clear()
            try:
                drop_agents(last)
            except Exception:  # retention is housekeeping: never stop ingest (logged, counted)
                m.housekeeping_errors.labels("retention").inc()
                log.exception("dropping expired agent records failed")
            await box.send(rep)
            for event in events:
                done[event.message.tp] = event.message.offset + 1

    reports = ReadReports(cfg.window_s + 2 * READ_MARGIN_NS / 1e9, cfg.read_idle_every_s)

    @app.timer(0.5)
    async def progress():
        # Which input partitions this worker has read to their end, and when (docs/STREAMS.md, "What a
        # worker failover does"): broadcast to every fold partition, so a step is closed by its window
        # with hosts missing only once every input partition was read past the window's end.
        now = time.time_ns() - READ_MARGIN_NS  # the high-water mark is as old as the last fetch response
        read, positions = [], {}
        try:
            for tp in app.assignor.assigned_actives():
                if tp.topic != cfg.input_topic:
                    continue
                hw = app.consumer.highwater(tp)
                pos = max(done.get(tp, 0), app.consumer._committed_offset.get(tp) or 0)
                if hw is not None and pos >= hw:
                    read.append([tp.partition, now])
                    positions[tp.partition] = pos
        except Exception:  # best effort (counted): without a report the fold holds window closes a little longer
            m.housekeeping_errors.labels("progress").inc()
            log.debug("input progress unavailable", exc_info=True)
            return
        if not read:
            return
        mono = time.monotonic()
        send, new = reports.due(mono, positions, mono - fold.read_new_at, bool(len(fold.steps)))
        if send:
            for p in range(cfg.partitions):
                await rep.send(key=b"read", value={"t": "read", "read": read, "new": new}, partition=p)


def _add_fold(app, cfg: WorkerConfig, m: WorkerMetrics, fold: Fold, rep, folded) -> None:
    """The ``fold`` agent: internal topic -> ``Fold`` -> summaries (output topic) and broadcasts.
    ``folded``: the table of the next internal offset to process per partition (``streams.reread``)."""
    out = app.topic(cfg.output_topic, key_serializer="raw", value_serializer="raw")
    conn = kafka.KafkaConnection(bootstrap=cfg.bootstrap)
    sought = reread.track_seeks(app)

    def start(p: int) -> int | None:  # what any worker folded; else where this generation's seek went
        v = folded.get(str(p))
        return int(v) if v is not None else sought(TP(rep.get_topic_name(), p))

    guard = reread.OffsetGuard("fold", m.consumer_skips.inc, start, m.housekeeping_errors.labels("offset_check").inc)
    codec = faust.serializers.codecs.get_codec(wire.MSGPACK)

    dlq = app.topic(cfg.dlq_topic, key_serializer="raw", value_serializer="raw")
    failed: list[tuple] = []  # (internal message, exception) the fold skipped in the current unit
    fold.on_error = lambda value, exc: failed.append((value, exc))

    async def dead_letter(stage: str, value, p: int, offset: int, exc: BaseException) -> None:
        """An internal message (or a summary) the fold failed on: counted and sent to the DLQ as msgpack,
        naming the internal partition and the offset of the round's last message from it."""
        m.processing_errors.labels(stage).inc()
        raw = value if isinstance(value, (bytes, bytearray)) else wire.packb(value)
        body, headers = _dlq_value(cfg, bytes(raw), [], rep.get_topic_name(), p, offset, exc, stage)
        try:
            await dlq.send(key=b"fold", value=body, headers=headers)
        except Exception:  # the DLQ itself unreachable: the failure was logged and counted above
            m.housekeeping_errors.labels("dead_letter").inc()
            log.exception("could not dead-letter a message of partition %d", p)

    async def send_closed(job: str, summary: dict) -> None:  # the summary of a closed step: JSON, send, metrics
        body = json.dumps(summary, sort_keys=True, separators=(",", ":")).encode()
        await out.send(key=job.encode(), value=body)
        m.results.observe(summary)

    @app.agent(rep, name="fold")
    async def fold_agent(stream):
        # One round = up to TAKE_MAX internal messages. The messages of one partition are applied as one
        # unit (Fold.apply_round: each table key written once per round, to that partition's changelog);
        # the history entries of the steps the round closed leave as one internal message per partition.
        box = _Outbox(cfg.partitions)
        async for events in stream.take_events(TAKE_MAX, within=TAKE_WITHIN_S):
            per: dict[int, list] = {}  # partition -> its values in offset order (re-read ranges first)
            for event in events:
                msg = event.message
                try:
                    gap = guard.check(msg.tp, msg.offset, msg.generation_id)
                    values = per.setdefault(msg.partition, [])
                    if gap is not None:
                        for rec in await reread.read_range(conn, msg.topic, msg.partition, *gap):
                            value = codec.loads(rec.value)
                            if isinstance(value, dict):
                                values.append(value)
                    values.append(event.value)
                except Exception as exc:  # logged, counted, dead-lettered; the round goes on
                    log.exception("fold failed on %s[%d]@%d", msg.topic, msg.partition, msg.offset)
                    await dead_letter("fold", event.value, msg.partition, msg.offset, exc)
            last = {e.message.partition: e for e in events}  # each partition's last message
            for p, values in per.items():
                _as_current(last[p])  # the unit's table writes go to this partition's changelog
                at = last[p].message.offset
                try:
                    emits = fold.apply_round(values, p)
                except Exception as exc:  # the unit as a whole (its table writes): every message dead-lettered
                    log.exception("fold failed on a round of partition %d", p)
                    for value in values:
                        await dead_letter("fold", value, p, at, exc)
                    continue
                finally:
                    for value, exc in failed:  # single messages the fold skipped (Fold.on_error)
                        await dead_letter("fold", value, p, at, exc)
                    failed.clear()
                for what, job, v in emits:
                    try:
                        if what == "summary":
                            await send_closed(job, v)
                        elif what == "running":  # a long step's running check on new parts (Fold.running_arrived)
                            await out.send(
                                key=job.encode(), value=json.dumps(v, sort_keys=True, separators=(",", ":")).encode()
                            )
                            m.summaries.labels("running").inc()
                        else:
                            box.broadcast(v)
                    except Exception as exc:  # logged, counted, the summary or entry dead-lettered
                        log.exception("fold failed to send a %s of job %s (partition %d)", what, job, p)
                        await dead_letter("fold" if what == "broadcast" else "summary", v, p, at, exc)
            await box.send(rep)
            for event in last.values():
                _as_current(event)
                folded[str(event.message.partition)] = event.message.offset + 1


def retention_sweep_ns(retention_s: float) -> int:
    """How often (ns) the worker looks for jobs and agent instances past ``retention_s``: a tenth of it,
    between 1 s and 60 s (a job's state is gone at most this long after its retention)."""
    return int(min(60.0, max(1.0, retention_s / 10)) * 1e9)


_LIBC: list = []  # the C library's handle, looked up once ([None] when it has no malloc_trim)


def trim_heap() -> bool:
    """Give the C heap's free pages back to the system (glibc ``malloc_trim(0)``); a no-op elsewhere.
    Returns whether it ran. Called after a retention sweep forgot jobs: the memory of a dropped job's
    state is freed in Python but stays in the process's heap (the allocator keeps what it once held in
    each arena: librdkafka's, aiokafka's and the event loop's threads allocate in their own), so without
    it RSS follows the highest state ever held, not the live jobs (bench/soak.py measures it). Costs a
    walk of the heap, about a millisecond per 100 MB, once per sweep (at most every ``retention / 10``)."""
    if not _LIBC:
        import ctypes

        # the process's own symbols (the C library Python runs on) first: ``ctypes.util.find_library``
        # spawns ``ldconfig -p`` (and gcc/ld when that fails), child processes that inherit the worker's
        # blocked SIGTERM/SIGINT (obshub/core/stopping.py); "libc.so.6" where the process has no malloc_trim
        libc = None
        for name in (None, "libc.so.6"):
            try:
                lib = ctypes.CDLL(name)
            except OSError:
                continue
            if hasattr(lib, "malloc_trim"):
                libc = lib
                break
        _LIBC.append(libc)
    if _LIBC[0] is None:
        return False
    _LIBC[0].malloc_trim(0)
    return True


def _add_expiry(app, cfg: WorkerConfig, m: WorkerMetrics, fold: Fold, rep, rate: dict, tables: dict) -> None:
    """The ``expire`` timer: close requests for steps past the window, and the gauges."""
    window_ns = int(cfg.window_s * 1e9)
    requested: dict[str, int] = {}
    last = {"t": time.monotonic(), "events": 0, "swept": 0}
    sweep_ns = retention_sweep_ns(cfg.job_retention_s)

    async def caught_up(actives) -> bool:
        # a job's data waiting in Kafka is no silence: no retention sweep while this worker is behind on
        # its input or internal topic, or has not read every input partition to its end lately
        if not fold.input_read_since(time.time_ns() - 3 * READ_MARGIN_NS):
            return False
        try:
            for tp in actives:
                if tp.topic in (cfg.input_topic, rep.get_topic_name()):
                    hw, pos = app.consumer.highwater(tp), await app.consumer.position(tp)
                    if hw is None or pos is None or hw - pos > 0:
                        return False
        except Exception:  # unknown progress (counted): sweep later
            m.housekeeping_errors.labels("lag").inc()
            log.debug("consumer positions unavailable; retention sweep later", exc_info=True)
            return False
        return True

    @app.timer(max(0.5, min(1.0, cfg.window_s / 4)))
    async def expire():
        actives = app.assignor.assigned_actives()
        now = time.time_ns()
        n_open = 0
        for key, st in fold.open_steps():
            p = st["p"]
            if TP(rep.get_topic_name(), p) not in actives:
                continue
            n_open += 1
            if key in fold.hung and now - st["opened_ns"] < cfg.thresholds.hang_hold_ns:
                continue  # a hung step stays open while it hangs (the watch timer reports it)
            if (
                now - st["opened_ns"] >= window_ns
                and now - requested.get(key, 0) >= window_ns
                and fold.input_read_past(st)
            ):
                requested[key] = now
                await rep.send(key=key.encode(), value={"t": "close", "key": key}, partition=p)
        for key in [k for k, t in requested.items() if now - t > 10 * window_ns]:
            del requested[key]
        if now - last["swept"] >= sweep_ns and await caught_up(actives):  # retention (fold.expired_jobs)
            last["swept"] = now
            mine = {tp.partition for tp in actives if tp.topic == rep.get_topic_name()}
            for job, p in fold.expired_jobs(mine, now):
                await rep.send(key=f"{job}|drop".encode(), value={"t": "drop", "job": job}, partition=p)
            if fold.forget_jobs(now):
                # the forgotten jobs' state holds reference cycles that only a full collection frees, and
                # GC_THRESHOLD makes full collections rare: collect them here, then give the pages back
                gc.collect()
                trim_heap()
        m.open_steps.set(n_open)
        for name, table in tables.items():
            m.table_keys.labels(name).set(len(table))
        m.jobs_tracked.set(len(fold.active_ns))
        dt = time.monotonic() - last["t"]
        if dt >= 1.0:
            m.events_rate.set((rate["events"] - last["events"]) / dt)
            last["t"], last["events"] = time.monotonic(), rate["events"]
        try:
            lag = 0
            for tp in actives:
                if tp.topic == cfg.input_topic:
                    hw = app.consumer.highwater(tp)
                    pos = await app.consumer.position(tp)
                    if hw is not None and pos is not None:
                        lag += max(0, hw - pos)
            m.consumer_lag.set(lag)
        except Exception:  # lag is best effort (counted); never let a metric stop expiry
            m.housekeeping_errors.labels("lag").inc()
            log.debug("consumer lag unavailable", exc_info=True)


def _add_watch(app, cfg: WorkerConfig, m: WorkerMetrics, fold: Fold, rep) -> None:
    """The ``watch`` timer: interim records of hung steps (module docstring, 4.)."""
    out = app.topic(cfg.output_topic, key_serializer="raw", value_serializer="raw")
    sent: dict[str, int] = {}  # job -> when its last interim record was sent (ns)

    async def behind(actives) -> bool:
        try:
            for tp in actives:
                if tp.topic in (cfg.input_topic, rep.get_topic_name()):
                    hw, pos = app.consumer.highwater(tp), await app.consumer.position(tp)
                    if hw is not None and pos is not None and hw - pos > 0:
                        return True
        except Exception:  # the lag is best effort (counted); without it the check runs
            m.housekeeping_errors.labels("lag").inc()
            log.debug("consumer lag unavailable", exc_info=True)
        return False

    @app.timer(0.5)
    async def watch():
        actives = app.assignor.assigned_actives()
        mine = {tp.partition for tp in actives if tp.topic == rep.get_topic_name()}
        now = time.time_ns()
        for sk, summary, first in fold.hangs(mine):
            job = summary["job"]
            if first and (not fold.input_read_since(now - 3 * READ_MARGIN_NS) or await behind(actives)):
                fold.hung.pop(sk, None)
                fold.was_hung.discard(sk)
                continue
            if now - sent.get(job, 0) < 1_000_000_000:
                continue
            sent[job] = now
            for j in [j for j, t in sent.items() if now - t > 60_000_000_000]:  # ended hangs
                del sent[j]
            await out.send(key=job.encode(), value=json.dumps(summary, sort_keys=True, separators=(",", ":")).encode())
            m.summaries.labels("hang").inc()
            if first:
                h = summary["hang"]
                log.warning(
                    "step %s hangs: %s never arrived at %s pg=%s seq=%s (%d ranks wait)",
                    sk,
                    ", ".join(
                        x["host"] + (f" rank {x['rank']}" if x.get("rank") is not None else "") for x in h["hosts"]
                    ),
                    h["op"],
                    h["pg"],
                    h["coll_seq"],
                    h.get("waiting_ranks", len(h["waiting"])),
                )
        # network evidence of steps still running (docs/ANALYSIS.md "Inside a running step"): every tick,
        # while every input partition was read to its end in the last seconds (a backlog makes steps look
        # long); not the instant lag check of a new hang, which a busy input fails at most ticks
        found = fold.running(mine)
        if found and fold.input_read_since(now - 3 * READ_MARGIN_NS):
            for sk, summary in found:
                await out.send(
                    key=summary["job"].encode(),
                    value=json.dumps(summary, sort_keys=True, separators=(",", ":")).encode(),
                )
                m.summaries.labels("running").inc()
                log.info(
                    "step %s runs long: network evidence %s",
                    sk,
                    {h: v["network"] for h, v in summary["evidence"]["hosts"].items()},
                )


GC_THRESHOLD = (500_000, 20, 100)  # net allocations before a young collection; young / middle collections per older


def tune_gc() -> None:
    """Garbage collection for a worker process: what was allocated so far (modules, the app) is frozen
    out of the collector's scans (``gc.freeze``), and a young collection runs after 500,000 net
    allocations (allocations less deallocations of tracked objects) instead of 700. A worker allocates a
    few dicts per event and part, nearly all freed by reference counting within the step; with the default
    thresholds its full collections, each a walk over every tracked object of its tables, cost about a
    quarter of the join's CPU at 2,048 hosts (``bench/fold_width.py`` in-process: 285 ms of collections in 9
    steps; 64 ms at 50,000). At 50,000 the young and middle collections still walked a step's live parts
    about 10 ms a step at 2,048 hosts x 8 ranks and slowed the close beside them (``bench.width --inproc``:
    fold 106-118 ms a step at 50,000, 90-92 at 500,000, side by side, 2026-12-06); at 500,000 a running job's
    net allocations stay under the threshold and no collection runs in its steps. Reference cycles are
    still collected, later: at most 500,000 tracked objects of cyclic garbage wait for a young collection
    (at some 200 bytes each, up to about 100 MB in the worst case of every new object being
    cyclic garbage), and the retention sweep collects in full after forgetting jobs."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


def build_app(
    cfg: WorkerConfig,
    input_partitions: int,
    metrics: WorkerMetrics | None = None,
    on_ready: Callable[[float], None] | None = None,
) -> faust.App:
    """Create the Faust app with its topics, tables, agents and timer. ``input_partitions`` must be the
    input topic's partition count (the ``agents`` table is co-partitioned with it). ``on_ready(seconds)``
    is called once, when the worker first reads its inputs: its tables recovered (:func:`_add_readiness`)."""
    started = time.monotonic()
    m = metrics or WorkerMetrics(job_idle_s=cfg.job_retention_s)
    app = _faust_app(cfg, m)
    tables = _tables(app, cfg, input_partitions, m)
    rep = app.topic(
        f"{cfg.app_id}-steps",
        partitions=cfg.partitions,
        internal=True,
        key_serializer="raw",
        value_serializer=wire.MSGPACK,
    )
    fold = Fold(
        tables,
        window_ns=int(cfg.window_s * 1e9),
        th=cfg.thresholds,
        on_late=m.late.inc,
        on_summary=lambda by: m.summaries.labels(by).inc(),
        input_partitions=input_partitions,
        retention_ns=int(cfg.job_retention_s * 1e9),
    )

    async def forget() -> None:  # the tables were recovered: recount what the fold derives from them
        fold.forget()

    tables["parts"].on_recover(forget)
    rate = {"events": 0}  # events ingested by this process, for the events/s gauge
    _add_ingest(app, cfg, m, tables, rep, rate, fold)
    _add_fold(app, cfg, m, fold, rep, tables["folded"])
    _add_expiry(app, cfg, m, fold, rep, rate, tables)
    _add_watch(app, cfg, m, fold, rep)
    _add_broker_watch(app, cfg)
    _add_readiness(app, m, started, on_ready)
    app.obshub_tables = tables
    return app


def _add_readiness(app: faust.App, m: WorkerMetrics, started: float, on_ready: Callable[[float], None] | None) -> None:
    """Say when the worker is ready: when it reads its inputs, not when its consumer group is Stable.

    Why: a starting worker first recovers every table from its changelog (Faust reads the whole active
    segment: every write of up to one ``--job-retention-s``, docs/STREAMS.md "Retention"), and reads no
    input meanwhile. A demo worker that recovered 20 earlier runs took 10-20 s, while its group was already
    Stable: a job started then had its first 10-20 s of steps closed at once, out of step order, each with a
    baseline of the steps that happened to close before it (often none). Faust starts an app's tasks only
    once the first recovery completed (``App.on_started``), so this task's start is the moment: gauge
    ``obshub_streams_ready`` goes 0 -> 1, ``obshub_streams_start_to_ready_seconds`` gets the time since
    :func:`build_app` (s), an info line says it, and ``on_ready(seconds)`` runs (the CLI marks its
    ``obshub status`` record ready). A later rebalance's recovery does not reset it."""

    @app.task
    async def ready() -> None:
        took = time.monotonic() - started
        m.ready.set(1)
        m.start_to_ready.set(took)
        log.info("reading inputs: tables recovered, %.1f s after start", took)
        if on_ready is not None:
            on_ready(took)


class _BrokerRetryFilter(logging.Filter):
    """Drops aiokafka's per-retry lines about one broker it cannot reach ("Unable connect to node with id
    2", "Failed fetch messages from 2: NodeNotReadyError", "Got error produce response: ...Connection...":
    about 20 a second while a broker is gone; 273 in a 15 s loss plus a controller loss). The worker's
    ``BrokerWatch`` says it once instead: one line per broker that leaves the cluster, one per broker back,
    one when the whole cluster cannot be reached. ``dropped``: lines dropped so far."""

    PREFIXES = ("Unable connect to node with id", "Failed fetch messages from", "Got error produce response")
    MARKS = ("KafkaConnectionError", "NodeNotReadyError", "Connect call failed", "NotLeaderForPartition")

    def __init__(self) -> None:
        super().__init__()
        self.dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith(self.PREFIXES):
            text = record.getMessage()
            if any(mark in text for mark in self.MARKS):
                self.dropped += 1
                return False
        return True


def _add_broker_watch(app: faust.App, cfg: WorkerConfig) -> None:
    """Broker health of the worker: aiokafka's per-retry connection lines are dropped
    (:class:`_BrokerRetryFilter`) and a :class:`obshub.core.reach.BrokerWatch` thread, started with the
    worker, logs one line per broker lost / back and one when the whole cluster is unreachable / back."""
    import threading

    from obshub.core.reach import BrokerWatch

    quiet = _BrokerRetryFilter()
    for name in ("aiokafka", "aiokafka.consumer.fetcher", "aiokafka.producer.sender"):
        logging.getLogger(name).addFilter(quiet)
    watch = BrokerWatch(cfg.bootstrap, log, "the stream worker")
    stop = threading.Event()
    app.obshub_broker_watch = watch

    @app.task
    async def broker_members() -> None:  # the watch thread lives as long as the worker's tasks
        import asyncio

        watch.watch_members(kafka.admin_config(kafka.KafkaConnection(bootstrap=cfg.bootstrap)), stop)
        try:
            while True:
                await asyncio.sleep(3600)
        finally:
            stop.set()
