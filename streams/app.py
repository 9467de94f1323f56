"""The Faust application: ingest -> repartition by (job, step) -> fold per host -> close -> summary.

Faust has no stream-stream join, so the cross-node join is built from two agents and changelog-backed
tables (docs/STREAMS.md has the diagram and the guarantees):

1. ``ingest`` reads agent batches (input topic, keyed by host). Each message is decoded ONLY with
   ``obshub.core.schema.decode_batch``; anything that fails goes to the DLQ unchanged (value and key) with the
   headers of ``schema.DLQ_HEADERS``. Per agent instance, the table ``agents`` tracks the batch sequence
   (gap = lost batches, seen again = duplicate, dropped) and the last input offset (so a replay after a
   crash is recognised and not counted as a duplicate). The batch is reduced to one accumulator per
   (job, step, host) (``streams.accumulate``) and forwarded to the internal topic ``<app>-steps`` keyed
   by ``job|step``. Hosts of a job (REGISTER events, and the first batch of every agent instance) are
   broadcast to every partition of the internal topic.
2. ``fold`` reads ``<app>-steps``. Table ``open`` (key ``job|step``) holds per-host accumulators and the
   batch ids already applied (idempotent under replay); ``jobs`` (key ``job@partition``) holds the job's
   hosts, its step-time history and pending data-quality counters; ``closed`` (key ``job|step``) is the
   emitted-summary table: presence = summary emitted, plus the batch ids it included and late events.
   A step closes when every expected host has reported STEP_END, or by processing-time window expiry:
   the timer ``expire`` (every worker, only its active partitions) sends a ``close`` request into the
   step's own partition, so every table write happens inside the fold agent, in partition order.
3. At close: ``streams.analysis.summarize`` -> JSON on the output topic keyed by job; ``closed`` entry
   written; the step's time broadcast to every partition's history (the baseline).

Guarantee: at-least-once processing (Faust flushes the producer before committing offsets) made
effectively exactly-once per (job, step) by the idempotent fold and the ``closed`` table; the one window
left is a crash after the summary reached the broker but before the ``closed`` changelog record did,
which can repeat one summary: consumers dedupe by (job, step) (``obshub tail steps`` does).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import faust
from faust.types import TP

from obshub.core import kafka, schema
from obshub.core.settings import STREAMS
from streams import accumulate, analysis
from streams.metrics import WorkerMetrics

log = logging.getLogger("obshub.streams")

QUALITY_KEYS = ("lost_batches", "duplicate_batches", "late_events")


@dataclass
class WorkerConfig:
    """Everything one worker needs. Times in seconds; sizes in bytes.

    ``partitions``: partitions of the internal ``<app_id>-steps`` topic and of the fold tables (the
    parallelism of the join). ``window_s``: a step closes at most this long after its first data arrived
    (processing time). ``dlq_max_bytes``: a DLQ record keeps the original value up to this size (larger
    values are cut, with header ``obshub.truncated`` = original length) so a huge message cannot block it.
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
    thresholds: analysis.Thresholds = field(default_factory=analysis.Thresholds)


class _SendErrors(faust.Sensor):
    """Faust reports a failed produce only to sensors: log it and count it, so no loss is silent."""

    def __init__(self, metrics: WorkerMetrics, **kw) -> None:
        super().__init__(**kw)
        self.metrics = metrics

    def on_send_error(self, producer, exc: BaseException, state) -> None:
        self.metrics.send_errors.inc()
        log.error("Failed to produce a message: %r", exc)


class SkipDetector:
    """Detects input that the consumer skipped. Faust 0.15.3 can drop messages fetched while a worker
    finishes a rebalance and commit past them (docs/STREAMS.md). This worker processes every message it
    is given (bad ones go to the DLQ), so within one consumer generation the offsets it sees in a
    partition are consecutive: a forward jump means skipped messages. They are logged and counted
    (``obshub_streams_consumer_skips_total``); on the input topic they also show as lost batches. A seek
    back was tried and does not help: Faust's in-flight buffer moves its read position forward again."""

    def __init__(self, metrics: WorkerMetrics, name: str) -> None:
        self.metrics, self.name = metrics, name
        self.last: dict = {}

    def check(self, msg) -> None:
        """Record ``msg``'s offset; log and count a forward jump within the same generation."""
        tp, gen = msg.tp, msg.generation_id
        last = self.last.get(tp)
        if last is not None and last[1] == gen and msg.offset > last[0] + 1:
            self.metrics.consumer_skips.inc(msg.offset - last[0] - 1)
            log.warning("%s: offsets %d..%d of %s[%d] were skipped by the Faust consumer", self.name,
                        last[0] + 1, msg.offset - 1, tp.topic, tp.partition)
        if last is None or last[1] != gen or msg.offset > last[0]:
            self.last[tp] = (msg.offset, gen)


TABLES = ("agents", "open", "jobs", "closed")


def internal_topics(cfg: WorkerConfig, input_partitions: int) -> dict[str, int]:
    """Names and partition counts of the topics the app owns: the repartition topic, the tables'
    changelogs (Faust names them ``<app>-<table>-changelog``) and Faust's leader topic."""
    out = {f"{cfg.app_id}-steps": cfg.partitions, f"{cfg.app_id}-__assignor-__leader": 1}
    for name in TABLES:
        out[f"{cfg.app_id}-{name}-changelog"] = input_partitions if name == "agents" else cfg.partitions
    return out


def ensure_internal_topics(cfg: WorkerConfig, input_partitions: int, timeout_s: float = 30.0) -> None:
    """Create the app's own topics before Faust starts, and wait until the broker's metadata lists them.

    Why: Faust creates them itself at start, but when the first group assignment happens before the new
    topic is in the consumer's metadata, the topic is left out of the assignment ("Ignoring missing
    topic") and the fold agent gets no partitions until the next rebalance. Raises StreamsError when a
    topic exists with a different partition count (a changed ``--partitions`` for an existing app id).
    """
    from confluent_kafka.admin import AdminClient, NewTopic

    from streams.errors import StreamsError

    want = internal_topics(cfg, input_partitions)
    admin = AdminClient(kafka.admin_config(kafka.KafkaConnection(bootstrap=cfg.bootstrap), quiet=True))
    md = admin.list_topics(timeout=10)
    for name, n in want.items():
        if name in md.topics and len(md.topics[name].partitions) != n:
            raise StreamsError(f"topic {name} has {len(md.topics[name].partitions)} partitions, this worker "
                               f"needs {n}", "start the worker with the partition count the app id was created "
                               "with, or use a new --app-id")
    compact = {"cleanup.policy": "compact"}
    new = [NewTopic(name, n, 1, config=compact if name.endswith("-changelog") else {})
           for name, n in want.items() if name not in md.topics]
    if new:
        for name, fut in admin.create_topics(new, operation_timeout=20).items():
            try:
                fut.result()
            except Exception as exc:
                if "already exists" not in str(exc).lower():
                    raise StreamsError(f"Failed to create topic {name}: {exc}", "read the broker log") from exc
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        md = admin.list_topics(timeout=10)
        if all(name in md.topics and len(md.topics[name].partitions) == n and md.topics[name].error is None
               for name, n in want.items()):
            return
        time.sleep(0.2)
    raise StreamsError(f"the broker did not list topics {sorted(want)} within {timeout_s:.0f} s",
                       "read the broker log")


def build_app(cfg: WorkerConfig, input_partitions: int, metrics: WorkerMetrics | None = None) -> faust.App:
    """Create the Faust app with its topics, tables, agents and timer. ``input_partitions`` must be the
    input topic's partition count (the ``agents`` table is co-partitioned with it)."""
    m = metrics or WorkerMetrics()
    app = faust.App(
        cfg.app_id,
        **kafka.faust_kwargs(kafka.KafkaConnection(bootstrap=cfg.bootstrap)),
        store="memory://",
        datadir=str(cfg.state_dir / cfg.app_id),
        topic_partitions=cfg.partitions,
        topic_replication_factor=1,
        table_standby_replicas=0,
        web_enabled=False,
        autodiscover=False,
        broker_session_timeout=6.0,
        broker_heartbeat_interval=1.0,
        broker_commit_interval=1.0,
        consumer_auto_offset_reset="earliest",
        producer_max_request_size=16 * 1024 * 1024,
        consumer_max_fetch_size=16 * 1024 * 1024,
    )
    app.sensors.add(_SendErrors(m))
    src = app.topic(cfg.input_topic, key_serializer="raw", value_serializer="raw")
    rep = app.topic(f"{cfg.app_id}-steps", partitions=cfg.partitions, internal=True,
                    key_serializer="raw", value_serializer="json")
    out = app.topic(cfg.output_topic, key_serializer="raw", value_serializer="raw")
    dlq = app.topic(cfg.dlq_topic, key_serializer="raw", value_serializer="raw")
    kv = {"schema": faust.Schema(key_serializer="json", value_serializer="json")}
    agents_t = app.Table("agents", partitions=input_partitions, **kv)
    open_t = app.Table("open", partitions=cfg.partitions, **kv)
    jobs_t = app.Table("jobs", partitions=cfg.partitions, **kv)
    closed_t = app.Table("closed", partitions=cfg.partitions, **kv)
    window_ns = int(cfg.window_s * 1e9)
    rate = {"events": 0}  # events ingested by this process, for the events/s gauge
    th = cfg.thresholds

    async def broadcast(job: str, value: dict) -> None:
        for p in range(cfg.partitions):
            await rep.send(key=job.encode(), value=value, partition=p)

    # ---------------------------------------------------------------------------------------------------
    # 1. ingest
    # ---------------------------------------------------------------------------------------------------
    async def to_dlq(msg, exc: schema.SchemaError) -> None:
        value = msg.value or b""
        headers = [("obshub.reason", str(exc).encode()), ("obshub.field", (exc.field or "").encode()),
                   ("obshub.source.topic", msg.topic.encode()),
                   ("obshub.source.partition", str(msg.partition).encode()),
                   ("obshub.source.offset", str(msg.offset).encode()), ("obshub.consumer", cfg.app_id.encode())]
        if len(value) > cfg.dlq_max_bytes:
            headers.append(("obshub.truncated", str(len(value)).encode()))
            value = value[:cfg.dlq_max_bytes]
        await dlq.send(key=msg.key, value=value, headers=headers)
        m.dlq.labels(exc.field or "message").inc()
        log.warning("DLQ %s[%d]@%d: %s", msg.topic, msg.partition, msg.offset, exc)

    async def ingest_one(msg) -> None:
        try:
            batch = schema.decode_batch(msg.value)
        except schema.SchemaError as exc:
            await to_dlq(msg, exc)
            return
        st = agents_t.get(batch.agent_id)
        first = st is None
        if first:
            st = {"seq": -1, "partition": msg.partition, "offset": -1, "lost": 0, "dups": 0}
            log.info("new agent instance %s (job %s, host %s) on %s[%d]@%d", batch.agent_id, batch.job, batch.host,
                     msg.topic, msg.partition, msg.offset)
        replay = msg.partition == st["partition"] and msg.offset <= st["offset"]
        if not replay and batch.seq <= st["seq"]:
            st["dups"] += 1
            st["offset"], st["partition"] = msg.offset, msg.partition
            agents_t[batch.agent_id] = st
            m.dups.inc()
            return
        if replay:
            m.replayed.inc()
            log.info("replay of %s seq %d (%s[%d]@%d, already processed before a restart)", batch.agent_id,
                     batch.seq, msg.topic, msg.partition, msg.offset)
        lost = 0 if replay else batch.seq - st["seq"] - 1
        if lost:
            st["lost"] += lost
            m.lost.inc(lost)
        m.batches.inc()
        m.events.inc(len(batch.events))
        rate["events"] += len(batch.events)
        if batch.sent_ns:
            m.lag_s.set(max(0.0, time.time() - batch.sent_ns / 1e9))
        hosts = accumulate.registrations(batch)
        if first and not hosts:
            hosts = [{"job": batch.job, "host": batch.host, "host_id": batch.host_id}]
        for reg in hosts:
            await broadcast(reg["job"], {"t": "host", "job": reg["job"], "host": reg["host"],
                                         "host_id": reg["host_id"], "rank": reg.get("rank"),
                                         "world_size": reg.get("world_size", 0)})
        parts = accumulate.reduce_batch(batch)
        bid = f"{batch.agent_id}:{batch.seq}"
        for i, (step, acc) in enumerate(sorted(parts.items())):
            q = {}
            if i == 0 and not replay:
                q = {"lost_batches": st["lost"], "duplicate_batches": st["dups"]}
                st["lost"] = st["dups"] = 0
            await rep.send(key=f"{batch.job}|{step}".encode(),
                           value={"t": "part", "job": batch.job, "step": step, "host": batch.host,
                                  "bid": bid, "acc": acc, "q": q})
        if not replay:
            st["seq"], st["offset"], st["partition"] = batch.seq, msg.offset, msg.partition
            agents_t[batch.agent_id] = st

    ingest_skips = SkipDetector(m, "ingest")

    @app.agent(src, name="ingest")
    async def ingest(stream):
        async for event in stream.events():
            try:
                ingest_skips.check(event.message)
                await ingest_one(event.message)
            except Exception:  # a bug must not stop the worker; the message is logged with its position
                log.exception("ingest failed on %s[%d]@%d", event.message.topic, event.message.partition,
                              event.message.offset)

    # ---------------------------------------------------------------------------------------------------
    # 2. fold and close
    # ---------------------------------------------------------------------------------------------------
    def job_state(job: str, p: int) -> dict:
        js = jobs_t.get(f"{job}@{p}")
        return js if js is not None else {"hosts": {}, "ranks": {}, "world_size": 0, "history": [],
                                          "pending": dict.fromkeys(QUALITY_KEYS, 0)}

    async def close(key: str, st: dict, p: int, closed_by: str) -> None:
        job, step = st["job"], st["step"]
        js = job_state(job, p)
        quality = {k: st["q"].get(k, 0) + js["pending"].get(k, 0) for k in QUALITY_KEYS}
        summary = analysis.summarize(job, step, st["hosts"], expected_hosts=sorted(js["hosts"]),
                                     history=js["history"], quality=quality, closed_by=closed_by,
                                     closed_at_ns=time.time_ns(), th=th)
        await out.send(key=job.encode(), value=json.dumps(summary, sort_keys=True).encode())
        closed_t[key] = {"bids": st["bids"], "late": 0}
        del open_t[key]
        js["pending"] = dict.fromkeys(QUALITY_KEYS, 0)
        jobs_t[f"{job}@{p}"] = js
        m.summaries.labels(closed_by).inc()
        m.results.observe(summary)
        await broadcast(job, {"t": "hist", "job": job, "step": step, "ns": summary["step_time_max_ns"]})

    def complete(st: dict, js: dict) -> bool:
        # every rank of the job must have registered (hosts in other input partitions may lag), and every
        # known host must have reported STEP_END
        if len(js["ranks"]) < js["world_size"]:
            return False
        expected = set(js["hosts"]) | set(st["hosts"])
        return all(st["hosts"].get(h, {}).get("step_ns") is not None for h in expected)

    async def fold_part(v: dict, p: int) -> None:
        key = f"{v['job']}|{v['step']}"
        done = closed_t.get(key)
        if done is not None:
            if v["bid"] in done["bids"]:
                return  # replay of data already in the summary
            n = v["acc"]["events"]
            done["late"] += n
            done["bids"].append(v["bid"])
            closed_t[key] = done
            js = job_state(v["job"], p)
            js["pending"]["late_events"] += n
            for k, x in v["q"].items():
                js["pending"][k] = js["pending"].get(k, 0) + x
            jobs_t[f"{v['job']}@{p}"] = js
            m.late.inc(n)
            return
        st = open_t.get(key)
        if st is None:
            st = {"job": v["job"], "step": v["step"], "p": p, "opened_ns": time.time_ns(), "hosts": {},
                  "bids": [], "q": dict.fromkeys(QUALITY_KEYS, 0)}
        if v["bid"] in st["bids"]:
            return
        st["bids"].append(v["bid"])
        host = v["host"]
        if host in st["hosts"]:
            accumulate.merge(st["hosts"][host], v["acc"])
        else:
            st["hosts"][host] = v["acc"]
        for k, x in v["q"].items():
            st["q"][k] = st["q"].get(k, 0) + x
        open_t[key] = st
        if complete(st, job_state(v["job"], p)):
            await close(key, st, p, "complete")

    async def fold_one(v: dict, p: int) -> None:
        t = v.get("t")
        if t == "part":
            await fold_part(v, p)
        elif t == "host":
            js = job_state(v["job"], p)
            rank, world = v.get("rank"), v.get("world_size") or 0
            if v["host"] not in js["hosts"] or (rank is not None and str(rank) not in js["ranks"]) \
                    or world > js["world_size"]:
                js["hosts"][v["host"]] = v["host_id"]
                if rank is not None:
                    js["ranks"][str(rank)] = v["host"]
                js["world_size"] = max(js["world_size"], world)
                jobs_t[f"{v['job']}@{p}"] = js
        elif t == "hist":
            js = job_state(v["job"], p)
            hist = [h for h in js["history"] if h[0] != v["step"]] + [[v["step"], v["ns"]]]
            js["history"] = sorted(hist)[-th.baseline_n * 2:]
            jobs_t[f"{v['job']}@{p}"] = js
        elif t == "close":
            st = open_t.get(v["key"])
            if st is not None and time.time_ns() - st["opened_ns"] >= window_ns:
                log.info("closing %s by window with hosts %s", v["key"], sorted(st["hosts"]))
                await close(v["key"], st, p, "window")

    fold_skips = SkipDetector(m, "fold")

    @app.agent(rep, name="fold")
    async def fold(stream):
        async for event in stream.events():
            try:
                fold_skips.check(event.message)
                await fold_one(event.value, event.message.partition)
            except Exception:
                log.exception("fold failed on %s[%d]@%d", event.message.topic, event.message.partition,
                              event.message.offset)

    # ---------------------------------------------------------------------------------------------------
    # 3. processing-time expiry and gauges
    # ---------------------------------------------------------------------------------------------------
    requested: dict[str, int] = {}
    last = {"t": time.monotonic(), "events": 0}
    tick_s = max(0.5, min(1.0, cfg.window_s / 4))

    @app.timer(tick_s)
    async def expire():
        actives = app.assignor.assigned_actives()
        now = time.time_ns()
        n_open = 0
        for key, st in list(open_t.items()):
            p = st["p"]
            if TP(rep.get_topic_name(), p) not in actives:
                continue
            n_open += 1
            if now - st["opened_ns"] >= window_ns and now - requested.get(key, 0) >= window_ns:
                requested[key] = now
                await rep.send(key=key.encode(), value={"t": "close", "key": key}, partition=p)
        for key in [k for k, t in requested.items() if now - t > 10 * window_ns]:
            del requested[key]
        m.open_steps.set(n_open)
        total = rate["events"]
        dt = time.monotonic() - last["t"]
        if dt >= 1.0:
            m.events_rate.set((total - last["events"]) / dt)
            last["t"], last["events"] = time.monotonic(), total
        try:
            lag = 0
            for tp in actives:
                if tp.topic == cfg.input_topic:
                    hw = app.consumer.highwater(tp)
                    pos = await app.consumer.position(tp)
                    if hw is not None and pos is not None:
                        lag += max(0, hw - pos)
            m.consumer_lag.set(lag)
        except Exception:  # lag is best effort; never let a metric stop expiry
            pass

    app.obshub_tables = {"agents": agents_t, "open": open_t, "jobs": jobs_t, "closed": closed_t}
    return app
