"""The whole pipeline at width: one job of 8, 128, 512 and 2,048 hosts at 1 s steps through the real
broker, real ``obshub streams worker`` process(es) and the real rule engine (``obshub rules serve`` with
the builtin pack), fed by synthetic agents (bench/fleet.py: 64 events per host-step in one batch per
host-step, sealed at the step's end as the agent does, a sched straggler on ``node2`` from step 10 on).

Per size, on a fresh private broker (bench/broker.py), with the project's own topics:

1. start the worker(s), the rule engine and the agents' process (which encodes every batch up front),
   time ``streams.analysis.summarize`` on one step of the same data in this process (the floor);
2. publish ``steps`` steps on a wall-clock schedule; at each step's end sample, for every process
   (worker, engine, broker, agents), CPU seconds (``/proc/<pid>/stat``) and RSS (``/proc/<pid>/status``),
   the worker's and the engine's counters (their Prometheus endpoints), the consumer lags (committed
   offsets vs high watermarks) and the bytes on disk of every topic; read every step summary and alert
   change as it is written;
3. after ``warmup`` steps the steady state: CPU per step of each stage = CPU used / steps that stage
   finished (the worker and the engine: events ingested or evaluated / events per step; inside them, the
   fold and close per step summarised, the rules per step summary evaluated; broker and agents: steps
   published); bytes per step of each topic the same way;
4. where the pipeline kept up and a pause is asked for: ``SIGSTOP`` the worker(s) for ``pause_s`` while
   the agents go on publishing, ``SIGCONT``, and time how long until the backlog is gone (summaries at most
   one step behind and the input lag below one step's events, at a step's end).

A size that does not keep up is reported as such with what it did finish: every size has a time limit
(its steps + pause + drain + ``GRACE_S``), and a process past ``RSS_CAP_MB`` ends the size early, so the
benchmark never hangs and never takes the machine's memory.

Reported per size: lag at each step's end (summaries behind, engine behind, input and internal topic
lags), time from a step's last event in Kafka to its summary and to the straggler alert, each as read
back from its topic by this process (and the worker's ``closed_at_ns``), RSS peak of each process, CPU per step of each
stage and its ratio to ``summarize`` of the same step, bytes per step on each topic (events, the worker's
repartition topic, each table's changelog, steps, alerts), drain time after the pause. Across sizes: the
growth exponent of each stage (least-squares slope of log cost over log hosts, sizes >= 128).

Targets (this 2-core machine): a 512-host job at 1 s steps keeps up end to end (summaries and engine at
most ``BOUND_STEPS`` behind at every step's end after warm-up, every step summarised, the straggler
alerted); at 2,048 hosts the fold <= 100 ms and the rule pack <= 50 ms of CPU per step, and every
obshub process <= 500 MB RSS. The worker's CPU is one number for ingest + fold + close (one process);
py-spy splits it (bench/stages.py). The fold target is judged on the fold as the target defines it, the
join's table operations + codec (``fold``), per step summarised; ``close`` (``summarize`` + the summary's
emission), fold + close and the fold agent's transport are printed beside it.

    python -m bench.width                  # 8, 128, 512, 2,048 hosts (about 15 minutes)
    python -m bench.width --quick          # 4 and 16 hosts, 12 steps, a 3 s pause at 4 (about 1 minute)
    python -m bench.width --sizes 8,128 --steps 20 --pause-s 0
    python -m bench.width --sizes 2048 --ranks-per-host 8 --steps 15 --pause-s 0 --step-s 5   # RSS at 2,048 x 8
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from rich.table import Table

from bench import common, fleet
from bench.broker import REPO, cpu_seconds, free_port, obshub_cmd, private_stack, stop_group
from bench.stages import Profile, py_spy
from obshub import stack
from obshub.core import kafka, schema

SIZES = (8, 128, 512, 2048)
STEPS = {8: 20, 128: 30, 512: 30, 2048: 30}
QUICK_SIZES = (4, 16)
QUICK_STEPS = 12
PAUSE_S, QUICK_PAUSE_S = 60, 3
PAUSE_SIZES = (128, 512)  # the pause runs at these sizes (when the pipeline kept up before it)
DRAIN_MAX_S = 60  # the agents go on publishing this long after SIGCONT at most
WARMUP = 3  # steps left out of the steady state
GUILTY_FROM = 10  # the straggler starts once the job has the 10 clean steps its baseline needs
BOUND_STEPS = 3  # "keeps up": summaries and engine at most this many steps behind
GRACE_S = 25.0  # after the last publish: time for the last summaries and alerts
QUICK_GRACE_S = 10.0
WIDE_GRACE_S = 60.0  # from 2,048 hosts: a worker that fell behind gets time to finish some steps
RSS_CAP_MB = 4000  # a process above this ends the size (the machine is shared)
WORKERS = 1
PARTITIONS = 8
WINDOW_S = 10.0
APP_ID = "bench-width"
ENGINE_GROUP = "obshub-rules-engine"
ALERT_RULE = "sched_contention_on_straggler"
TARGET_FOLD_MS, TARGET_RULES_MS, TARGET_RSS_MB, TARGET_KEEPUP_HOSTS, TARGET_CPU_HOSTS = 100.0, 50.0, 500.0, 512, 2048


# -------------------------------------------------------------------------------------------------------
# processes
# -------------------------------------------------------------------------------------------------------
@dataclass
class Proc:
    """One started process: its role, Popen (None for the broker) and pid."""

    role: str
    pid: int
    popen: subprocess.Popen | None = None
    log: Path | None = None
    metrics_port: int = 0

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return Path(f"/proc/{self.pid}").exists()

    def cpu(self) -> float:
        try:
            return cpu_seconds(self.pid)
        except OSError:
            return float("nan")

    def rss_mb(self) -> tuple[float, float]:
        """(current RSS, peak RSS) in MB from /proc/<pid>/status (VmRSS, VmHWM); NaN when gone."""
        cur = peak = float("nan")
        try:
            for ln in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if ln.startswith("VmRSS:"):
                    cur = int(ln.split()[1]) / 1024
                elif ln.startswith("VmHWM:"):
                    peak = int(ln.split()[1]) / 1024
        except OSError:
            pass
        return cur, peak

    def log_tail(self, n: int = 2500) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:] if self.log else ""
        except OSError:
            return ""


def _start(role: str, args: list[str], log: Path, metrics_port: int = 0, stdin=subprocess.DEVNULL, stdout=None) -> Proc:
    fh = open(log, "ab")
    p = subprocess.Popen(
        args,
        stdout=stdout or fh,
        stderr=fh,
        stdin=stdin,
        start_new_session=True,
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    fh.close()
    return Proc(role, p.pid, p, log, metrics_port)


def _wait_log(proc: Proc, needle: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if needle in proc.log_tail(200_000):
            return
        if not proc.alive():
            raise RuntimeError(f"{proc.role} exited with {proc.popen.returncode}:\n{proc.log_tail()}")
        time.sleep(0.2)
    raise RuntimeError(f"{proc.role} not ready in {timeout_s:.0f} s (no {needle!r} in its log):\n{proc.log_tail()}")


def _metrics(port: int) -> dict[str, float]:
    """Prometheus samples of ``port`` summed by sample name and the ``signal`` label (``name{signal}``)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=3).text
    except httpx.HTTPError:
        return out
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + (f"{{{s.labels['signal']}}}" if "signal" in s.labels else "")
            out[key] = out.get(key, 0.0) + s.value
    return out


# -------------------------------------------------------------------------------------------------------
# measurement helpers
# -------------------------------------------------------------------------------------------------------
def topic_bytes(data_dir: Path) -> dict[str, int]:
    """Bytes of the log segments on disk per topic (``<topic>-<partition>`` directories)."""
    out: dict[str, int] = {}
    try:
        entries = list(os.scandir(data_dir))
    except OSError:
        return out
    for d in entries:
        if not d.is_dir() or "-" not in d.name:
            continue
        topic = d.name.rsplit("-", 1)[0]
        try:
            n = sum(f.stat().st_size for f in os.scandir(d.path) if f.name.endswith(".log"))
        except OSError:
            continue
        out[topic] = out.get(topic, 0) + n
    return out


def topic_class(topic: str, app_id: str) -> str | None:
    """Which row of the bytes table a topic belongs to: events, repartition, changelog <table>, steps,
    alerts, dlq; None for the broker's own topics and other apps' topics."""
    if topic == schema.TOPIC_EVENTS:
        return "events (agents)"
    if topic == schema.TOPIC_STEPS:
        return "steps (summaries)"
    if topic == schema.TOPIC_ALERTS:
        return "alerts"
    if topic == schema.TOPIC_DLQ:
        return "dlq"
    if topic.startswith(app_id + "-"):
        rest = topic[len(app_id) + 1 :]
        if rest.endswith("-changelog"):
            return f"changelog {rest[: -len('-changelog')]}"
        if "__assignor" in rest:
            return None
        return f"repartition {rest}"
    return None


def precommit(bootstrap: str, group: str, topics: list[str]) -> None:
    """Commit the current end of every partition of ``topics`` for consumer group ``group``, so a new
    consumer of that group (a worker, an engine of the next size) starts after the earlier sizes' data."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    c = Consumer(
        kafka.consumer_config(kafka.KafkaConnection(bootstrap=bootstrap), group, {"enable.auto.commit": False})
    )
    try:
        for attempt in range(30):  # a broker that just started may not have elected every leader yet
            try:
                offs = []
                for t in topics:
                    md = c.list_topics(t, timeout=10)
                    for p in md.topics[t].partitions:
                        _lo, hi = c.get_watermark_offsets(TopicPartition(t, p), timeout=10, cached=False)
                        offs.append(TopicPartition(t, p, hi))
                if offs:
                    c.commit(offsets=offs, asynchronous=False)
                return
            except KafkaException:
                if attempt == 29:
                    raise
                time.sleep(1.0)
    finally:
        c.close()


def summarize_ms(shape: fleet.Shape, reps: int = 5) -> float:
    """CPU ms (this process) of one ``streams.analysis.summarize`` call on a guilty step of ``shape``
    (the same batches the agents publish, reduced per host like the worker does); median of ``reps``."""
    from obshub.streams import accumulate, analysis

    step = shape.guilty_from + 1
    accs: dict[str, dict] = {}
    # the hosts' ranks as the worker's ingest learns them from their REGISTER events (pids 1000 + local rank)
    per = shape.ranks_per_host
    for b in fleet.one_step_batches(shape, step):
        ranks = {1000 + lr: (b.host_id * per + lr, lr) for lr in range(per)} if per > 1 else None
        for st, part in accumulate.reduce_batch(b, ranks=ranks).items():
            if st != step:
                continue
            if b.host in accs:
                accumulate.merge(accs[b.host], part)
            else:
                accs[b.host] = part
    hosts = sorted(accs)
    hist = [[s, 941_000_000] for s in range(max(0, step - 20), step)]
    samples = []
    for _ in range(reps):
        t0 = time.process_time()
        analysis.summarize(
            shape.job,
            step,
            accs,
            expected_hosts=hosts,
            history=hist,
            quality={},
            closed_by="complete",
            closed_at_ns=time.time_ns(),
        )
        samples.append((time.process_time() - t0) * 1000)
    return statistics.median(samples)


class Lags:
    """Consumer lags from the broker's view: committed offsets of a group vs the end offsets of a topic,
    in messages; two admin requests per sample (``refresh``), then ``lag(group, topic)`` per pair."""

    def __init__(self, bootstrap: str, pairs: list[tuple[str, str]]):
        from confluent_kafka.admin import AdminClient

        self.admin = AdminClient(kafka.admin_config(kafka.KafkaConnection(bootstrap=bootstrap), quiet=True))
        self.pairs = pairs
        self.parts: dict[str, list[int]] = {}
        self.ends: dict[tuple[str, int], int] = {}
        self.committed: dict[str, dict[tuple[str, int], int]] = {}

    def refresh(self) -> None:
        """Read every topic's end offsets and every group's committed offsets (best effort: what fails
        is left out and its lag reads -1)."""
        from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        self.ends, self.committed = {}, {}
        try:
            missing = [t for _g, t in self.pairs if not self.parts.get(t)]
            if missing:
                md = self.admin.list_topics(timeout=5)
                for t in missing:
                    if t in md.topics:
                        self.parts[t] = sorted(md.topics[t].partitions)
            req = {
                TopicPartition(t, p): OffsetSpec.latest()
                for t in {t for _g, t in self.pairs}
                for p in self.parts.get(t, [])
            }
            for tp, fut in self.admin.list_offsets(req, request_timeout=5).items() if req else []:
                self.ends[(tp.topic, tp.partition)] = fut.result().offset
            groups = sorted({g for g, _t in self.pairs})
            futs = (
                self.admin.list_consumer_group_offsets(
                    [ConsumerGroupTopicPartitions(g) for g in groups], request_timeout=5
                )
                if len(groups) == 1
                else {}
            )
            if len(groups) > 1:  # the client takes one group per request
                for g in groups:
                    futs.update(
                        self.admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(g)], request_timeout=5)
                    )
            for g, fut in futs.items():
                self.committed[g] = {(tp.topic, tp.partition): tp.offset for tp in fut.result().topic_partitions}
        except Exception:
            pass

    def lag(self, group: str, topic: str) -> int:
        """Messages of ``topic`` beyond ``group``'s committed offsets at the last refresh (-1: unknown)."""
        parts = self.parts.get(topic)
        com = self.committed.get(group)
        if not parts or com is None or any((topic, p) not in self.ends for p in parts):
            return -1
        return sum(max(0, self.ends[(topic, p)] - max(0, com.get((topic, p), 0))) for p in parts)

    def close(self) -> None:
        pass


class Reader:
    """Reads the steps and alerts topics from the beginning in a thread, keeping those of job ``job``:
    per step the time it was read (``recv_ns``), the summary's ``closed_at_ns``, straggler and first
    blamed layer; every alert change with the time it was read."""

    def __init__(self, bootstrap: str, job: str):
        self.job = job
        from confluent_kafka import Consumer

        self.c = Consumer(
            kafka.consumer_config(
                kafka.KafkaConnection(bootstrap=bootstrap),
                f"bench-width-{uuid.uuid4().hex[:6]}",
                {"auto.offset.reset": "earliest", "enable.auto.commit": False, "fetch.wait.max.ms": 20},
            )
        )  # a record is seen within ~20 ms of reaching the broker
        self.c.subscribe([schema.TOPIC_STEPS, schema.TOPIC_ALERTS])
        self.summaries: dict[int, dict] = {}
        self.alerts: list[dict] = []
        self.bad = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="reader", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            m = self.c.poll(0.2)
            if m is None or m.error():
                continue
            recv = time.time_ns()
            try:
                d = json.loads(m.value())
                if m.topic() == schema.TOPIC_STEPS and d.get("job") == self.job:
                    st = d.get("straggler") or {}
                    blame = d.get("blame") or []
                    self.summaries.setdefault(
                        int(d["step"]),
                        {
                            "closed_at_ns": int(d["closed_at_ns"]),
                            "recv_ns": recv,
                            "closed_by": d.get("closed_by"),
                            "straggler": st.get("host"),
                            "layer": blame[0]["layer"] if blame else None,
                            "hosts": len(d.get("hosts") or []),
                            "bytes": len(m.value()),
                        },
                    )
                elif m.topic() == schema.TOPIC_ALERTS and (d.get("labels") or {}).get("job") == self.job:
                    ann = d.get("annotations") or {}
                    self.alerts.append(
                        {
                            "rule": d.get("rule"),
                            "status": d.get("status"),
                            "host": (d.get("labels") or {}).get("host"),
                            "step": ann.get("step"),
                            "t_ns": recv,
                            "kafka_ts_ns": m.timestamp()[1] * 1_000_000,
                        }
                    )
            except (ValueError, KeyError, TypeError):
                self.bad += 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        with contextlib.suppress(Exception):
            self.c.close()


class Agents:
    """The agents' process (bench/fleet.py): reads its JSON lines in a thread."""

    def __init__(self, settings, shape: fleet.Shape, log: Path):
        args = [
            sys.executable,
            "-m",
            "bench.fleet",
            "--bootstrap",
            settings.bootstrap_servers,
            "--hosts",
            str(shape.hosts),
            "--job",
            shape.job,
            "--steps",
            str(shape.steps),
            "--events-per-step",
            str(shape.events_per_step),
            "--step-s",
            str(shape.step_s),
            "--guilty-from",
            str(shape.guilty_from),
            "--ranks-per-host",
            str(shape.ranks_per_host),
        ]
        self.proc = _start("agents", args, log, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.ready: dict | None = None
        self.total = shape.steps
        self.steps: list[dict] = []
        self.thread = threading.Thread(target=self._read, name="agents", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.popen.stdout:
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if "ready" in d:
                self.ready = d
            elif "step" in d:
                self.steps.append(d)

    def wait_ready(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while self.ready is None:
            if not self.proc.alive():
                raise RuntimeError(f"agents exited with {self.proc.popen.returncode}:\n{self.proc.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"agents not ready in {timeout_s:.0f} s:\n{self.proc.log_tail()}")
            time.sleep(0.2)
        return self.ready

    def go(self, at: float) -> None:
        self.proc.popen.stdin.write(f"go {at:.6f}\n".encode())
        self.proc.popen.stdin.flush()

    def published(self) -> tuple[int, int]:
        """(steps fully published, events published)."""
        s = self.steps
        return (len(s), s[-1]["events"] if s else 0)


# -------------------------------------------------------------------------------------------------------
# one size
# -------------------------------------------------------------------------------------------------------
@dataclass
class SizeResult:
    """Everything measured for one job size (see the module docstring); plain data for the JSON."""

    hosts: int
    steps: int
    events_per_step: int
    guilty_from: int = GUILTY_FROM
    summarize_ms: float = float("nan")
    encode_s: float = 0.0
    samples: list[dict] = field(default_factory=list)
    summaries: dict = field(default_factory=dict)
    alerts: list = field(default_factory=list)
    publish: list = field(default_factory=list)
    rss_peak_mb: dict = field(default_factory=dict)
    cpu_ms_per_step: dict = field(default_factory=dict)
    cpu_complete: dict = field(default_factory=dict)
    bytes_per_step: dict = field(default_factory=dict)
    bytes_complete: dict = field(default_factory=dict)
    work: dict = field(default_factory=dict)
    cpu_s: dict = field(default_factory=dict)
    kept_up: bool = False
    why_not: list = field(default_factory=list)
    alert: dict | None = None
    to_summary_s: list = field(default_factory=list)
    to_close_s: list = field(default_factory=list)
    pause: dict | None = None
    profile: dict = field(default_factory=dict)
    ended: str = ""
    wall_s: float = 0.0
    step_s: float = 1.0  # the job's step in seconds (--step-s): the run's rates are events_per_step / step_s


def _behind(smp: dict) -> float:
    """Steps due by this sample (published, or scheduled to be) and not summarised yet (>= 0)."""
    return max(0.0, smp["due"] - smp["summaries"])


def _unit(work: dict, role: str, stage: str | None = None) -> float:
    """Steps of work a process (or one stage of it) finished: the worker = events ingested / events per step,
    its fold and close = steps summarised; the engine = events evaluated / events per step (they are most of
    what it reads), its rules = step summaries evaluated; the broker and the agents = steps published."""
    if role.startswith("worker"):
        return work["summaries"] if stage in ("fold", "close", "fold transport") else work["ingested"]
    if role == "engine":
        return work["engine"] if stage == "rules" else work["engine_events"]
    return work["published"]


def _topic_unit(work: dict, cls: str) -> float:
    """The steps a topic's bytes are divided by: events per step published, the repartition topic and the
    per-agent table per step ingested, the fold's tables and summaries per step summarised, alerts per
    step evaluated."""
    if cls.startswith("events"):
        return work["published"]
    if cls.startswith("repartition") or cls == "changelog agents":
        return work["ingested"]
    if cls == "alerts":
        return work["engine"]
    return work["summaries"]


def _rates(a: dict, b: dict, eps: int, app_id: str) -> dict:
    """Between samples a and b: ``work`` (steps each stage finished), ``cpu_s`` (CPU seconds per
    process), ``cpu`` (ms per step of work, see ``_unit``; all of it when none finished, a lower bound),
    ``done`` (whether any finished), ``bytes`` per step per topic class and ``bytes_done``."""
    work = {
        "published": b["published_steps"] - a["published_steps"],
        "ingested": (b["ingested"] - a["ingested"]) / eps,
        "summaries": b["summaries"] - a["summaries"],
        "engine": b["engine_steps"] - a["engine_steps"],
        "engine_events": (b["engine_events"] - a["engine_events"]) / eps,
    }
    cpu_s, cpu, done = {}, {}, {}
    for role in b["cpu"]:
        d = b["cpu"][role] - a["cpu"].get(role, float("nan"))
        n = _unit(work, role)
        cpu_s[role] = d
        cpu[role] = d * 1000 / n if n > 0 else d * 1000
        done[role] = n > 0
    raw: dict[str, float] = {}
    for topic, n in b["bytes"].items():
        cls = topic_class(topic, app_id)
        if cls is not None:
            raw[cls] = raw.get(cls, 0.0) + n - a["bytes"].get(topic, 0)
    by = {c: d / _topic_unit(work, c) if _topic_unit(work, c) > 0 else d for c, d in raw.items()}
    by_done = {c: _topic_unit(work, c) > 0 for c in raw}
    return {"work": work, "cpu_s": cpu_s, "cpu": cpu, "done": done, "bytes": by, "bytes_done": by_done}


class SizeRun:
    """One job size on the shared broker: its processes, samplers and the measurement phases."""

    def __init__(
        self,
        settings,
        hosts: int,
        steps: int,
        *,
        pause_s: float,
        workers: int,
        tmp: Path,
        say,
        guilty_from: int = GUILTY_FROM,
        grace_s: float = GRACE_S,
        ranks_per_host: int = 1,
        step_s: float = 1.0,
    ):
        self.settings, self.say, self.steps, self.pause_s = settings, say, steps, pause_s
        self.grace_s = grace_s
        drain = int(DRAIN_MAX_S) if pause_s > 0 else 0
        self.shape = fleet.Shape(
            hosts,
            steps + (int(pause_s) + drain if pause_s > 0 else 0),
            job=f"wide-{hosts}",
            guilty_from=guilty_from,
            ranks_per_host=ranks_per_host,
            step_s=step_s,
        )
        self.eps = self.shape.events_per_step_total
        self.app_id = f"{APP_ID}-{hosts}"
        self.rules_prefix = f"{APP_ID}-rules-{hosts}"
        self.engine_group = f"{self.rules_prefix}-engine"
        self.data_dir = settings.kafka_dir / "data"
        self.res = SizeResult(hosts, steps, self.eps, guilty_from, step_s=step_s)
        self.procs: list[Proc] = []
        self.lags: Lags | None = None
        self.reader: Reader | None = None
        self.stopped = False
        self.last_wm: dict[str, float] = {}
        self.t0 = 0.0
        self.tmp = tmp
        try:
            self.start(workers, tmp)
        except BaseException:
            self.stop_all()
            raise

    def stop_all(self) -> None:
        """SIGCONT (a paused worker cannot stop) and stop every process this size started."""
        for p in self.procs:
            if p.popen is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGCONT)
        for p in self.procs:
            if p.popen is not None:
                stop_group(p.popen, 5)  # SIGKILL after 5 s: a clean shutdown is not measured

    def start(self, workers: int, tmp: Path) -> None:
        """Start the agents (encoding begins at once), the worker(s) and the engine, each consumer group
        committed at the current end of its inputs."""
        boot = self.settings.bootstrap_servers
        hosts = self.shape.hosts
        self.agents = Agents(self.settings, self.shape, tmp / f"agents-{hosts}.log")
        self.procs.append(self.agents.proc)
        precommit(boot, self.app_id, [schema.TOPIC_EVENTS])
        precommit(boot, self.engine_group, [schema.TOPIC_STEPS, schema.TOPIC_EVENTS])
        precommit(boot, f"{self.rules_prefix}-notify", [schema.TOPIC_ALERTS])
        shutil.rmtree(self.settings.state_dir / "rules", ignore_errors=True)  # no earlier engine's alerts
        for i in range(workers):
            port = free_port()
            self.procs.append(
                _start(
                    f"worker{i + 1}" if workers > 1 else "worker",
                    obshub_cmd(
                        "streams",
                        "worker",
                        "--app-id",
                        self.app_id,
                        "--partitions",
                        str(PARTITIONS),
                        "--window-s",
                        str(WINDOW_S),
                        "--index",
                        str(i + 1),
                        "--metrics-port",
                        str(port),
                        "--log-level",
                        "info",
                    ),
                    tmp / f"worker{i + 1}-{hosts}.log",
                    port,
                )
            )
        port = free_port()
        self.procs.append(
            _start(
                "engine",
                obshub_cmd(
                    "rules",
                    "serve",
                    "--group-prefix",
                    self.rules_prefix,
                    "--metrics-port",
                    str(port),
                    "--log-level",
                    "INFO",
                ),
                tmp / f"engine-{hosts}.log",
                port,
            )
        )
        bpid = stack.broker_pid(self.settings)
        if bpid:
            self.procs.append(Proc("broker", bpid))

    def workers(self) -> list[Proc]:
        return [p for p in self.procs if p.role.startswith("worker")]

    def sample(self, s: int) -> dict:
        """One sample at the end of step ``s`` (see the module docstring)."""
        steps_pub, ev_pub = self.agents.published()
        if not self.stopped:  # a stopped worker cannot answer: keep its last counters
            wm: dict[str, float] = {}
            for p in self.workers():
                for k, v in _metrics(p.metrics_port).items():
                    wm[k] = wm.get(k, 0.0) + v
            self.last_wm = wm or self.last_wm
        wm = self.last_wm
        em = next((_metrics(p.metrics_port) for p in self.procs if p.role == "engine"), {})
        on_time = not self.agents.steps or self.agents.steps[-1]["late_s"] < 0.5
        due = min(self.agents.total, max(steps_pub, s + 1)) if on_time else steps_pub
        lags = self.lags
        lags.refresh()
        return {
            "step_end": s,
            "due": due,
            "t": time.monotonic() - self.t0,
            "published_steps": steps_pub,
            "published_events": ev_pub,
            "ingested": wm.get("obshub_streams_events_total", 0.0),
            "summaries": wm.get("obshub_streams_summaries_total", 0.0),
            "engine_steps": em.get("obshub_rules_records_total{steps}", 0.0),
            "engine_events": em.get("obshub_rules_records_total{events}", 0.0),
            "input_lag": lags.lag(self.app_id, schema.TOPIC_EVENTS),
            "internal_lag": lags.lag(self.app_id, f"{self.app_id}-steps"),
            "engine_lag_steps_topic": lags.lag(self.engine_group, schema.TOPIC_STEPS),
            "engine_lag_events_topic": lags.lag(self.engine_group, schema.TOPIC_EVENTS),
            "cpu": {p.role: p.cpu() for p in self.procs},
            "rss": {p.role: p.rss_mb()[0] for p in self.procs},
            "bytes": topic_bytes(self.data_dir),
        }

    def check_procs(self) -> str:
        """Why the size must end now ('' when every process runs and is below the RSS cap)."""
        for p in self.procs:
            if p.role == "agents":
                continue
            if not p.alive():
                return f"{p.role} exited (log: {p.log_tail(800)})"
            cur, _peak = p.rss_mb()
            if cur > RSS_CAP_MB:
                return f"{p.role} RSS {cur:,.0f} MB > cap {RSS_CAP_MB:,} MB"
        return ""

    def wait_step_end(self, s: int) -> None:
        time.sleep(max(0.0, self.t0 + (s + 1) * self.shape.step_s - time.monotonic()))

    def run(self) -> SizeResult:
        """Wait until everything is ready, measure, stop everything. Raises RuntimeError when a process
        does not start."""
        res = self.res
        t_size = time.monotonic()
        try:
            for p in self.workers():
                _wait_log(p, "Worker ready", 120)
            _wait_log(next(p for p in self.procs if p.role == "engine"), "engine: took over", 60)
            res.summarize_ms = summarize_ms(self.shape)
            res.encode_s = self.agents.wait_ready(900)["encode_s"]
            time.sleep(2.0 if len(self.workers()) == 1 else 4.0)  # let the group settle
            self.lags = Lags(
                self.settings.bootstrap_servers,
                [
                    (self.app_id, schema.TOPIC_EVENTS),
                    (self.app_id, f"{self.app_id}-steps"),
                    (self.engine_group, schema.TOPIC_STEPS),
                    (self.engine_group, schema.TOPIC_EVENTS),
                ],
            )
            self.reader = Reader(self.settings.bootstrap_servers, self.shape.job)
            self.measure()
        finally:
            for p in self.procs:
                if p.alive():
                    res.rss_peak_mb[p.role] = p.rss_mb()[1]
            self.stop_all()
            if self.reader is not None:
                time.sleep(0.5)
                self.reader.close()
                res.summaries, res.alerts = self.reader.summaries, self.reader.alerts
            if self.lags is not None:
                self.lags.close()
        res.publish = self.agents.steps
        res.wall_s = time.monotonic() - t_size
        _judge(res, self.shape)
        return res

    def measure(self) -> None:
        res, shape, steps = self.res, self.shape, self.steps
        self.t0 = time.monotonic() + 1.0
        self.agents.go(time.time() + 1.0)
        res.samples.append(self.sample(-1))
        limit = self.t0 + steps * shape.step_s + self.grace_s
        pause = self.pause_s > 0
        s, steady_a, profs = 0, None, None
        # phase 1: the measured steps, then until every one is summarised and evaluated (or the time limit)
        while True:
            self.wait_step_end(s)
            smp = self.sample(s)
            res.samples.append(smp)
            if s == WARMUP - 1:
                steady_a = smp
                profs = {
                    p.role: Profile(
                        p.pid,
                        "engine" if p.role == "engine" else "worker",
                        seconds=steps - WARMUP - 1,
                        out=self.tmp / f"profile-{p.role}-{shape.hosts}.txt",
                    )
                    for p in self.procs
                    if p.role == "engine" or p.role.startswith("worker")
                }
            bad = self.check_procs()
            if bad:
                res.ended = bad
                break
            s += 1
            if s >= steps:
                if pause and s == steps:
                    behind = [_behind(x) for x in res.samples[WARMUP + 1 :]]
                    if behind and max(behind) <= BOUND_STEPS:
                        break  # kept up: the load goes on and the pause phase starts now
                    # did not keep up: no pause; the agents stop and the grace period lets the stages finish
                    res.pause = {
                        "skipped": f"the pipeline did not keep up before it (up to {max(behind or [0]):.0f} "
                        f"steps behind)"
                    }
                    self.agents.proc.popen.send_signal(signal.SIGTERM)
                    pause = False
                if (smp["summaries"] >= steps and smp["engine_steps"] >= steps) or time.monotonic() >= limit:
                    break
        steady_b = res.samples[-1]
        for role, prof in (profs or {}).items():
            r = prof.result()
            if r is not None:
                res.profile[role] = r
        rt = _rates(steady_a or res.samples[0], steady_b, self.eps, self.app_id)
        res.work, res.cpu_s = rt["work"], rt["cpu_s"]
        res.cpu_ms_per_step, res.cpu_complete = rt["cpu"], rt["done"]
        res.bytes_per_step, res.bytes_complete = rt["bytes"], rt["bytes_done"]
        self.say(
            f"[dim]  {shape.hosts:,} hosts: {len(res.samples) - 1} step ends sampled, "
            f"{steady_b['summaries']:.0f} summaries, engine {steady_b['engine_steps']:.0f} steps, agents "
            f"published {self.agents.published()[0]} steps[/dim]"
        )
        if res.ended or not pause:
            return
        # phase 2: the pause (only when the measured steps kept up: otherwise the backlog never drains)
        for p in self.workers():
            os.killpg(p.pid, signal.SIGSTOP)
        self.stopped = True
        t_stop = time.monotonic()
        self.say(f"[dim]  {shape.hosts:,} hosts: worker(s) stopped (SIGSTOP) for {self.pause_s:.0f} s under load[/dim]")
        samples = []
        while time.monotonic() < t_stop + self.pause_s:
            self.wait_step_end(s)
            samples.append(self.sample(s))
            s += 1
        for p in self.workers():
            os.killpg(p.pid, signal.SIGCONT)
        self.stopped = False
        t_cont = time.monotonic()
        at_resume = samples[-1] if samples else res.samples[-1]
        drained = None
        while s < shape.steps and time.monotonic() < t_cont + DRAIN_MAX_S:
            self.wait_step_end(s)
            smp = self.sample(s)
            samples.append(smp)
            s += 1
            bad = self.check_procs()
            if bad:
                res.ended = bad
                break
            if _behind(smp) <= 1 and smp["published_events"] + shape.hosts - smp["ingested"] <= self.eps:
                drained = time.monotonic() - t_cont
                break
        self.agents.proc.popen.send_signal(signal.SIGTERM)
        res.pause = {
            "pause_s": self.pause_s,
            "backlog_steps_at_resume": _behind(at_resume),
            "backlog_events_at_resume": at_resume["published_events"] + shape.hosts - at_resume["ingested"],
            "drain_s": drained,
            "limit_s": DRAIN_MAX_S,
            "max_internal_lag": max((x["internal_lag"] for x in samples), default=0),
            "samples": samples,
        }


def _judge(res: SizeResult, shape: fleet.Shape) -> None:
    """Keep-up verdict, latencies and the straggler alert of one size."""
    pub = {d["step"]: d["t_ns"] for d in res.publish}
    measured = [s for s in range(res.steps) if s in pub]
    res.to_summary_s = [(res.summaries[s]["recv_ns"] - pub[s]) / 1e9 for s in measured if s in res.summaries]
    res.to_close_s = [(res.summaries[s]["closed_at_ns"] - pub[s]) / 1e9 for s in measured if s in res.summaries]
    fired = [a for a in res.alerts if a["rule"] == ALERT_RULE and a["status"] == "firing"]
    if fired:
        a = fired[0]
        try:
            st = int(a["step"])
        except (TypeError, ValueError):
            st = -1
        res.alert = {
            "host": a["host"],
            "step": st,
            "t_ns": a["t_ns"],
            "after_last_event_s": (a["t_ns"] - pub[st]) / 1e9 if st in pub else None,
            "after_first_guilty_s": (a["t_ns"] - pub[shape.guilty_from]) / 1e9 if shape.guilty_from in pub else None,
        }
    steady = [x for x in res.samples[1:] if WARMUP <= x["step_end"] < res.steps]
    behind = [_behind(x) for x in steady]
    eng_behind = [x["summaries"] - x["engine_steps"] for x in steady]
    why = []
    if res.ended:
        why.append(res.ended)
    if len(pub) < res.steps:
        why.append(f"agents published {len(pub)} of {res.steps} steps")
    late = max((d["late_s"] for d in res.publish[: res.steps]), default=0.0)
    if late > 0.5:
        why.append(f"agents up to {late:.1f} s behind schedule (the machine was saturated)")
    if behind and max(behind) > BOUND_STEPS:
        why.append(f"summaries up to {max(behind):.0f} steps behind")
    if eng_behind and max(eng_behind) > BOUND_STEPS:
        why.append(f"engine up to {max(eng_behind):.0f} steps behind the summaries")
    n_sum = sum(1 for s in range(res.steps) if s in res.summaries)
    if n_sum < res.steps:
        why.append(f"{n_sum} of {res.steps} steps summarised")
    named = sum(
        1
        for s in range(shape.guilty_from, res.steps)
        if res.summaries.get(s, {}).get("straggler") == shape.straggler_host
    )
    if named < n_sum - shape.guilty_from - 1:
        why.append(f"straggler named in {named} summaries only")
    if res.alert is None or res.alert["host"] != shape.straggler_host:
        why.append(f"no {ALERT_RULE} alert for {shape.straggler_host}")
    res.why_not = why
    res.kept_up = not why


# -------------------------------------------------------------------------------------------------------
# report
# -------------------------------------------------------------------------------------------------------
def _fmt_ms(v: float, done: bool = True) -> str:
    if v != v:
        return "-"
    txt = f"{v / 1000:,.1f} s" if v >= 10_000 else f"{v:,.1f} ms" if v >= 1 else f"{v:.2f} ms"
    return txt if done else f"> {txt}"


def _fmt_bytes(v: float) -> str:
    if v != v:
        return "-"
    return f"{v / 1e6:,.2f} MB" if v >= 1e5 else f"{v / 1e3:,.1f} kB"


def exponent(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log(y) over log(x) (the growth exponent: 1 = linear, 2 = quadratic); NaN
    with fewer than two usable points."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y > 0 and y == y]
    if len(pts) < 2:
        return float("nan")
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / den if den else float("nan")


def print_size(r: SizeResult, say) -> None:
    """The per-size block: lag at each step's end, latencies, alert, pause."""
    shape = fleet.Shape(r.hosts, r.steps, guilty_from=r.guilty_from)
    steady = [x for x in r.samples[1:] if x["step_end"] < r.steps or not r.pause]
    behind = " ".join(f"{_behind(x):.0f}" for x in steady)
    eng = " ".join(f"{max(0.0, x['summaries'] - x['engine_steps']):.0f}" for x in steady)
    inp = max((x["input_lag"] for x in steady), default=-1)
    internal = max((x["internal_lag"] for x in steady), default=-1)
    late = max((d["late_s"] for d in r.publish[: r.steps]), default=0.0)
    say(
        f"[bold]{r.hosts:,} hosts[/bold] ({r.events_per_step / r.step_s:,.0f} events/s in "
        f"{r.hosts / r.step_s:,.0f} batches/s: {r.events_per_step:,} events a step of {r.step_s:g} s; "
        f"{r.steps} steps; batches encoded up front in {r.encode_s:.1f} s; agents at most {late:.2f} s late)"
    )
    say(f"  summaries behind at each step's end (steps): {behind or '-'}")
    say(f"  engine behind the summaries (steps):         {eng or '-'}")
    say(f"  max lag at a step's end: input {inp:,} messages, repartition topic {internal:,} messages")
    if r.to_summary_s:
        q = sorted(r.to_summary_s)
        c = sorted(r.to_close_s)
        say(
            f"  last event -> summary on the steps topic: median {statistics.median(q):.2f} s, max {q[-1]:.2f} s "
            f"({len(q)} of {r.steps} steps; closed by the worker after median {statistics.median(c):.2f} s)"
        )
    named = sum(
        1
        for s, v in r.summaries.items()
        if shape.guilty_from <= s < r.steps and v["straggler"] == shape.straggler_host and v["layer"] == "sched"
    )
    if r.alert:
        a = r.alert
        extra = f"{a['after_last_event_s']:.2f} s after its last event" if a["after_last_event_s"] is not None else ""
        say(
            f"  straggler {shape.straggler_host} named (sched) in {named} summaries; alert {ALERT_RULE} "
            f"{a['host']} fired at step {a['step']}, {extra}"
            + (f", {a['after_first_guilty_s']:.1f} s after the first slow step" if a["after_first_guilty_s"] else "")
        )
    else:
        say(f"  straggler {shape.straggler_host} named (sched) in {named} summaries; [red]no {ALERT_RULE} alert[/red]")
    if r.pause:
        p = r.pause
        if "skipped" in p:
            say(f"  pause: not run: {p['skipped']}")
        else:
            d = (
                f"drained in {p['drain_s']:.1f} s"
                if p["drain_s"] is not None
                else f"[red]not drained within {p['limit_s']} s[/red]"
            )
            say(
                f"  pause: worker(s) stopped {p['pause_s']:.0f} s under load; backlog at resume "
                f"{p['backlog_steps_at_resume']:.0f} steps ({p['backlog_events_at_resume']:,.0f} events); {d} "
                f"(max repartition lag {p['max_internal_lag']:,} messages)"
            )
    verdict = "[green]kept up[/green]" if r.kept_up else f"[red]did not keep up[/red]: {'; '.join(r.why_not)}"
    say(f"  {verdict}")


def stage_ms(r: SizeResult, role: str, stages: tuple[str, ...]) -> tuple[float, bool] | None:
    """(CPU ms per step, complete) of ``stages`` of process ``role``: each stage's sampled share of the
    process's CPU seconds divided by the steps that stage finished (``_unit``); when one of them finished
    none, its share of all the CPU counts and the result is a lower bound (complete False). None without
    a profile."""
    prof = r.profile.get(role)
    d = r.cpu_s.get(role)
    if not prof or d is None or d != d:
        return None
    total, complete = 0.0, True
    for st in stages:
        n = _unit(r.work, role, st)
        share = prof["shares"].get(st, 0.0)
        total += share * d * 1000 / n if n > 0 else share * d * 1000
        complete = complete and n > 0
    return total, complete


def fold_split(r: SizeResult) -> tuple[tuple[float, bool], ...] | None:
    """``(fold, close, fold + close, fold transport)`` of the worker process(es) of size ``r``, each
    ``(CPU ms per step summarised, complete)``: the fold = table operations + codec (the target's
    definition), close = ``summarize`` + the summary's emission (bench/stages.py). None without a profile."""
    wk = [k for k in r.cpu_ms_per_step if k.startswith("worker")]
    out = []
    for stages in (("fold",), ("close",), ("fold", "close"), ("fold transport",)):
        parts = [stage_ms(r, k, stages) for k in wk]
        if not parts or any(x is None for x in parts):
            return None
        out.append((sum(x[0] for x in parts), all(x[1] for x in parts)))
    return tuple(out)


def _fit_sizes(results: list[SizeResult]) -> list[SizeResult]:
    """Sizes the growth exponent is fitted over: >= 128 hosts (at 8 fixed costs dominate), or all when
    fewer than two are that wide (the quick run)."""
    wide = [r for r in results if r.hosts >= 128]
    return wide if len(wide) >= 2 else results


def report(results: list[SizeResult], say=common.console.print) -> dict:
    """Cross-size tables (one column per size, the growth exponent last) and verdicts. Returns the
    verdicts and exponents."""
    fit = _fit_sizes(results)
    fit_txt = ", ".join(f"{r.hosts:,}" for r in fit)
    roles = ["summarize"]
    for r in results:
        roles += [k for k in r.cpu_ms_per_step if k not in roles]
    t = Table(
        title="CPU per step of each stage, steady state (x = ratio to summarize of the same step; "
        "> = a lower bound: the stage finished no step); k = growth exponent, cost ~ hosts^k "
        f"(least squares over {fit_txt} hosts)",
        caption=common.describe_machine(),
    )
    t.add_column("stage")
    for r in results:
        t.add_column(f"{r.hosts:,} hosts", justify="right")
    t.add_column("k", justify="right")
    growth = {}
    for role in roles:
        cells = []
        for r in results:
            if role == "summarize":
                cells.append(_fmt_ms(r.summarize_ms))
                continue
            v = r.cpu_ms_per_step.get(role, float("nan"))
            ok = r.cpu_complete.get(role, True)
            ratio = f" x{v / r.summarize_ms:,.0f}" if r.summarize_ms > 0 and v == v else ""
            cells.append(_fmt_ms(v, ok) + ratio)
        pts = [
            (r.hosts, r.summarize_ms if role == "summarize" else r.cpu_ms_per_step.get(role, float("nan")))
            for r in fit
            if role == "summarize" or r.cpu_complete.get(role, False)
        ]
        k = exponent([p[0] for p in pts], [p[1] for p in pts])
        growth[role] = k
        t.add_row(role, *cells, "-" if k != k else f"{k:.2f}")
    say(t)
    stage_rows = []
    for r in results:
        for role, prof in r.profile.items():
            stage_rows += [(role, st) for st in prof["shares"] if (role, st) not in stage_rows]
    if stage_rows:
        t = Table(
            title="where the CPU of a step goes inside each process (py-spy samples x the process's CPU per "
            "step; ms and share); k = growth exponent"
        )
        t.add_column("process: stage")
        for r in results:
            t.add_column(f"{r.hosts:,} hosts", justify="right")
        t.add_column("k", justify="right")
        for role, st in sorted(stage_rows):
            cells, pts = [], []
            for r in results:
                sm = stage_ms(r, role, (st,))
                share = (r.profile.get(role) or {}).get("shares", {}).get(st, 0.0)
                cells.append("-" if sm is None else f"{_fmt_ms(sm[0], sm[1])} ({share:.0%})")
                if sm is not None and r in fit and sm[1]:
                    pts.append((r.hosts, sm[0]))
            k = exponent([p[0] for p in pts], [p[1] for p in pts])
            growth[f"{role}: {st}"] = k
            t.add_row(f"{role}: {st}", *cells, "-" if k != k else f"{k:.2f}")
        say(t)
        for r in results:
            split = fold_split(r)
            if split is not None:
                (f, fd), (c, cd), (b, bd), (t_, td) = split
                say(
                    f"worker at {r.hosts:,} hosts, per step summarised: fold (table operations + codec) "
                    f"{_fmt_ms(f, fd)}, close (summarize + emit) {_fmt_ms(c, cd)}, fold + close {_fmt_ms(b, bd)}; "
                    f"fold transport {_fmt_ms(t_, td)}"
                )
    elif py_spy() is None:
        say("[dim]no split inside the processes: py-spy is not installed (pip install py-spy)[/dim]")
    classes = []
    for r in results:
        classes += [k for k in r.bytes_per_step if k not in classes]
    order = ("events", "repartition", "changelog", "steps", "alerts", "dlq")
    classes.sort(key=lambda c: next((i for i, o in enumerate(order) if c.startswith(o)), len(order)))
    t = Table(title="bytes per step on each topic (log segments on disk, steady state); k = growth exponent")
    t.add_column("topic")
    for r in results:
        t.add_column(f"{r.hosts:,} hosts", justify="right")
    t.add_column("k", justify="right")
    bytes_growth = {}
    for c in classes:
        ok = [r for r in fit if r.bytes_complete.get(c, True)]
        k = exponent([r.hosts for r in ok], [r.bytes_per_step.get(c, float("nan")) for r in ok])
        bytes_growth[c] = k
        t.add_row(
            c,
            *[
                ("" if r.bytes_complete.get(c, True) else "> ") + _fmt_bytes(r.bytes_per_step.get(c, float("nan")))
                for r in results
            ],
            "-" if k != k else f"{k:.2f}",
        )
    say(t)
    rss_roles = []
    for r in results:
        rss_roles += [k for k in r.rss_peak_mb if k not in rss_roles]
    t = Table(title="RSS peak of each process (MB, VmHWM)")
    t.add_column("process")
    for r in results:
        t.add_column(f"{r.hosts:,} hosts", justify="right")
    for role in rss_roles:
        t.add_row(role, *[f"{r.rss_peak_mb.get(role, float('nan')):,.0f}" for r in results])
    say(t)
    proj = projection(results, say)
    verdicts, rows = {}, []

    def verdict(key: str, label: str, ok: bool, detail: str) -> None:
        verdicts[key] = ok
        rows.append({"target": label, "measured": detail, "met": ok})
        common.verdict(label, ok, detail)

    keep = next((r for r in results if r.hosts == TARGET_KEEPUP_HOSTS), None)
    if keep is not None:
        verdict(
            "keep_up_512",
            f"a {TARGET_KEEPUP_HOSTS}-host job at 1 s steps keeps up end to end",
            keep.kept_up,
            "bounded lag, every step summarised, straggler alerted" if keep.kept_up else "; ".join(keep.why_not),
        )
    big = next((r for r in results if r.hosts == TARGET_CPU_HOSTS), None)
    if big is not None:
        wk = [k for k in big.cpu_ms_per_step if k.startswith("worker")]
        wdone = bool(wk) and all(big.cpu_complete.get(k, False) for k in wk)
        whole = sum(big.cpu_ms_per_step[k] for k in wk) if wk else float("nan")
        split = fold_split(big)
        if split is not None:
            (fold, fdone), (close, cdone), (both, bdone), (trans, tdone) = split
            what = (
                f"fold (table operations + codec) {_fmt_ms(fold, fdone)} per step summarised; close (summarize "
                f"+ emit) {_fmt_ms(close, cdone)}; fold + close {_fmt_ms(both, bdone)}; the fold agent's "
                f"transport {_fmt_ms(trans, tdone)} (sampled shares of the worker's CPU; the whole worker "
                f"{_fmt_ms(whole, wdone)} per step ingested)"
            )
        else:
            fold, fdone = whole, wdone and big.work.get("summaries", 0) > 0
            what = (
                f"stream worker {_fmt_ms(whole, wdone)} per step (whole process: ingest + fold + close; no "
                f"profile to split it)"
            )
        verdict(
            "fold_2048",
            f"at {TARGET_CPU_HOSTS:,} hosts the fold (table operations + codec) costs <= {TARGET_FOLD_MS:.0f} ms "
            "CPU per step",
            fdone and fold <= TARGET_FOLD_MS,
            f"{what}; summarize alone {_fmt_ms(big.summarize_ms)}",
        )
        e = big.cpu_ms_per_step.get("engine", float("nan"))
        edone = big.cpu_complete.get("engine", False)
        ev = stage_ms(big, "engine", ("rules",))
        if ev is not None:
            rules_ms, edone = ev
            what = (
                f"rule evaluation {_fmt_ms(rules_ms, edone)} per step summary evaluated (sampled share of the "
                f"engine's CPU; the whole engine, which also decodes every event, "
                f"{_fmt_ms(e, big.cpu_complete.get('engine', False))} per step of events)"
            )
        else:
            edone = edone and big.work.get("engine", 0) > 0
            rules_ms, what = e, f"rule engine process {_fmt_ms(e, edone)} per step (no profile to split it)"
        verdict(
            "rules_2048",
            f"at {TARGET_CPU_HOSTS:,} hosts the rule pack costs <= {TARGET_RULES_MS:.0f} ms CPU per step",
            edone and rules_ms <= TARGET_RULES_MS,
            what,
        )
        own = {k: v for k, v in big.rss_peak_mb.items() if k not in ("broker", "agents")}
        worst = max(own.items(), key=lambda kv: kv[1] if kv[1] == kv[1] else -1, default=("-", float("nan")))
        verdict(
            "rss_2048",
            f"at {TARGET_CPU_HOSTS:,} hosts RSS of each obshub process <= {TARGET_RSS_MB:.0f} MB",
            bool(own) and all(v <= TARGET_RSS_MB for v in own.values()),
            ", ".join(f"{k} {v:,.0f} MB" for k, v in own.items())
            + f" (peak: {worst[0]}; broker JVM {big.rss_peak_mb.get('broker', float('nan')):,.0f} MB)",
        )
    return {
        "verdicts": verdicts,
        "target_rows": rows,
        "growth": growth,
        "bytes_growth": bytes_growth,
        "projection": proj,
    }


BUSY = 0.7  # a process is planned at 70 % of a core, the rest is headroom for bursts and rebalances


def projection(results: list[SizeResult], say=common.console.print) -> list[dict]:
    """Cores and Kafka bandwidth one job needs at 1 s steps, from the CPU and bytes per step measured at
    each size (a stage that finished no step gives a lower bound, marked ">"), whatever the run's own step
    (``SizeResult.step_s``, ``--step-s``): per row ``events_per_s`` the job's events per second at 1 s steps
    (events per step), ``events_per_s_run`` those of the run measured (events per step / its step in s),
    ``step_s`` its step. Returns the rows."""
    runs = sorted({r.step_s for r in results})
    t = Table(
        title=f"what one job needs at 1 s steps, from this run at {', '.join(f'{x:g}' for x in runs)} s steps "
        f"(cores of this machine; processes = ceil(cores / {BUSY}))"
    )
    for col in (
        "GPUs (hosts x 8)",
        "events/s at 1 s steps (this run's)",
        "stream worker cores",
        "rule engine cores",
        "broker cores",
        "Kafka writes MB/s",
        "worker processes",
        "RSS per worker / engine MB",
    ):
        t.add_column(col, justify="right")
    rows = []
    for r in results:
        step_s = 1.0  # the projection's step: CPU and bytes per step of work are per second at 1 s steps
        wk = [k for k in r.cpu_ms_per_step if k.startswith("worker")]
        if not wk:
            continue
        w = sum(r.cpu_ms_per_step[k] for k in wk) / 1000 / step_s
        wdone = all(r.cpu_complete.get(k, False) for k in wk)
        e = r.cpu_ms_per_step.get("engine", float("nan")) / 1000 / step_s
        b = r.cpu_ms_per_step.get("broker", float("nan")) / 1000 / step_s
        mb = sum(v for v in r.bytes_per_step.values() if v == v) / 1e6 / step_s
        mdone = all(r.bytes_complete.values()) if r.bytes_complete else False
        row = {
            "hosts": r.hosts,
            "gpus": r.hosts * 8,
            "events_per_s": r.events_per_step / step_s,
            "events_per_s_run": r.events_per_step / r.step_s,
            "step_s": r.step_s,
            "worker_cores": w,
            "engine_cores": e,
            "broker_cores": b,
            "kafka_mb_s": mb,
            "workers": math.ceil(w / BUSY) if w == w else None,
            "lower_bound": not (wdone and mdone),
        }
        rows.append(row)
        gt = lambda ok: "" if ok else "> "  # noqa: E731
        t.add_row(
            f"{r.hosts * 8:,} ({r.hosts:,})",
            f"{row['events_per_s']:,.0f}"
            + ("" if r.step_s == 1.0 else f" ({row['events_per_s_run']:,.0f} at {r.step_s:g} s)"),
            f"{gt(wdone)}{w:.2f}",
            f"{gt(r.cpu_complete.get('engine', False))}{e:.2f}",
            f"{b:.2f}",
            f"{gt(mdone)}{mb:,.2f}",
            f"{gt(wdone)}{row['workers']}",
            f"{r.rss_peak_mb.get(wk[0], float('nan')):,.0f} / {r.rss_peak_mb.get('engine', float('nan')):,.0f}",
        )
    say(t)
    return rows


def _rss_now(field: str = "VmRSS:") -> float:
    """This process's ``VmRSS`` (or ``field``, e.g. ``VmHWM:``) in MB."""
    for ln in Path("/proc/self/status").read_text().splitlines():
        if ln.startswith(field):
            return int(ln.split()[1]) / 1024
    return float("nan")


CASES = {
    # name: (guilty layer, steps, guilty_from, share of the other hosts under memory pressure); every judged
    # step (after guilty_from) has the job's baseline (Thresholds.baseline_min_n = 10 closed steps), so the
    # evidence is computed as in a running job (steps 6-7 of the 8-step run before had none: 20 ms less close)
    "straggler": ("sched", 15, 11, 0.0),
    # a memory straggler after the memory episode's quiet steps (analysis.MEMORY_QUIET_STEPS + 1 closed
    # steps without): its steps are an episode from the first slow one (memory_stall_episode at the 3rd)
    "mem": ("memory", 21, 17, 0.0),
    # the same, with 10 % of the other hosts' ranks in reclaim every step (2 ms a rank-step, not late)
    "mem10": ("memory", 21, 17, 0.1),
}
"""``inproc_cost``'s cases (``bench.width --inproc --case``); the straggler is node2's rank ``ranks // 2``."""


def inproc_cost(
    hosts: int,
    ranks_per_host: int,
    steps: int = 15,
    guilty_from: int = 11,
    say=None,
    *,
    guilty_layer: str = "sched",
    mem_share: float = 0.0,
) -> dict:
    """The worker's and the engine's work per step at ``hosts`` x ``ranks_per_host`` without a broker: the
    fleet's batches of every step (encoded as the agents send them) through the worker's own ingest and
    fold (``streams.inproc``, each step's batches in 4 rounds, as ``bench.fold_width``) and every step
    summary through the builtin rule pack (``rules.engine.Engine``), in this process. Per step after the
    guilty one (the straggler rank slowed from ``guilty_from``): CPU ms of ingest (``ingest_ms``: the input
    batches' decode into parts; ``encode_ms``: the parts' msgpack encoding, which the real worker's ingest
    agent does when it sends them to the internal topic, ``Round.add``: measured apart, in no fold figure),
    fold (``fold_ms``: the fold agent's own work on the internal messages it reads, i.e. their decode,
    table operations, changelog writes, the step's close and ``summarize``; ``close_ms`` the step's close
    with ``summarize``; ``fold_enc_ms`` the fold with the parts' encoding, the figure this bench called
    the fold before ``fold23``) and the rule pack, the summary's JSON bytes; the process's RSS peak
    (VmHWM, MB: the fleet's batches of one step, the tables and the engine together; a worker holds less)
    and whether the straggler's host and rank were named; ``gc_ms`` the collector's CPU in a step (median,
    included in the figures above), ``fold_max_ms`` the slowest fold and ``full_gcs`` the full collections of
    every step but the first (which pays for the registrations). For the sizes a 2-core machine cannot carry
    through the real broker at 1 s steps (2,048 hosts x 8 ranks = 1 M events per step). ``guilty_layer``:
    where the straggler's extra time goes ("sched", "memory", ...: ``streams.synthetic.GUILTY_KINDS``);
    ``mem_share``: the share (0-1) of the other hosts whose ranks stall in reclaim every step
    (``fleet.Shape.mem_hosts``). Also returned: ``episodes``, the judged steps whose ``memory_episode``
    names the straggler's host, and ``fired``, the rules that fired for it (its ``host`` label)."""
    from obshub.rules.engine import Engine
    from obshub.rules.loader import load_ruleset
    from obshub.streams import wire
    from obshub.streams.app import tune_gc
    from obshub.streams.inproc import InProcess

    tune_gc()
    say = say or common.console.print
    if not 0.0 <= mem_share < 1.0:
        raise ValueError(f"mem_share={mem_share}: expected a share from 0 to below 1")
    shape = fleet.Shape(
        hosts,
        steps,
        job=f"inproc-{hosts}x{ranks_per_host}",
        guilty_from=guilty_from,
        ranks_per_host=ranks_per_host,
        guilty_layer=guilty_layer,
        mem_hosts=round(mem_share * (hosts - 1)),
    )
    t0 = time.monotonic()
    f = fleet.Fleet(shape, time.time_ns())
    rss_fleet = _rss_now()
    pipe = InProcess(partitions=PARTITIONS)
    for _k, v in f.register_messages():
        pipe.feed(v)
    fired: set[str] = set()

    def on_change(c: dict) -> None:
        if c.get("status") == "firing" and c.get("labels", {}).get("host") == shape.straggler_host:
            fired.add(c["rule"])

    engine = Engine(load_ruleset([REPO / "obshub" / "rules" / "builtin"]), on_change)
    seqs = [1] * hosts
    rows = []
    close_s = [0.0]  # CPU s of the step's close (summarize included), out of the fold's
    fold_close = pipe.fold.close

    def timed_close(*args, **kw):
        c = time.process_time()
        try:
            return fold_close(*args, **kw)
        finally:
            close_s[0] += time.process_time() - c

    pipe.fold.close = timed_close  # type: ignore[method-assign]
    # the collector's CPU per step, and its full collections (generation 2): the worker's own thresholds
    # (tune_gc) apply; what they cost is in the step's figures, shown apart here
    gcs = {"s": 0.0, "full": 0, "full_s": 0.0, "t0": 0.0}

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gcs["t0"] = time.process_time()
            return
        dt = time.process_time() - gcs["t0"]
        gcs["s"] += dt
        if info.get("generation") == 2:
            gcs["full"] += 1
            gcs["full_s"] += dt

    gc.callbacks.append(on_gc)
    for step in range(steps):
        gcs.update(s=0.0, full=0, full_s=0.0)
        values = [v for _due, msgs, _n in f.step_slots(step, seqs) for _k, v in msgs]
        n0 = len(pipe.summaries)
        ing = fo = enc = 0.0
        close_s[0] = 0.0
        quarter = max(1, len(values) // 4)
        for i in range(0, len(values), quarter):
            c0 = time.process_time()
            parts = [x for v in values[i : i + quarter] for x in pipe.parts_of(v)]
            c1 = time.process_time()
            per: dict[int, list[bytes]] = {}
            for msg, p in parts:
                per.setdefault(p, []).append(wire.packb(msg))
            enc += time.process_time() - c1
            for p, msgs in sorted(per.items()):
                pipe._apply({"t": "batch", "msgs": msgs}, p)
            ing += c1 - c0
            fo += time.process_time() - c1  # the parts' encoding included here: taken out below
        fo -= enc  # the fold's own work: what the fold agent does with the messages it reads
        del values
        rules = 0.0
        for sm in pipe.summaries[n0:]:
            rec = {**sm, "time_ns": sm["closed_at_ns"]}
            c0 = time.process_time()
            engine.process("steps", rec)
            engine.tick(rec["time_ns"])
            rules += time.process_time() - c0
        s = pipe.summaries[-1] if len(pipe.summaries) > n0 else {}
        strag = s.get("straggler") or {}
        rows.append(
            {
                "step": step,
                "ingest_ms": ing * 1e3,
                "fold_ms": fo * 1e3,
                "fold_enc_ms": (fo + enc) * 1e3,
                "encode_ms": enc * 1e3,
                "close_ms": close_s[0] * 1e3,
                "rules_ms": rules * 1e3,
                "summary_bytes": len(json.dumps(s, separators=(",", ":")).encode()) if s else 0,
                "named": (strag.get("host"), strag.get("rank")),
                "episode": (s.get("memory_episode") or {}).get("host") == shape.straggler_host,
                "gc_ms": gcs["s"] * 1e3,
                "full_gcs": gcs["full"],
                "full_gc_ms": gcs["full_s"] * 1e3,
            }
        )
        say(
            f"[dim]  {hosts:,} x {ranks_per_host}: step {step} ingest {ing * 1e3:,.0f} ms + parts' encoding "
            f"{enc * 1e3:,.0f} ms, fold {fo * 1e3:,.0f} ms (close {close_s[0] * 1e3:,.0f}), "
            f"collector {gcs['s'] * 1e3:,.0f} ms ({gcs['full']} full, {gcs['full_s'] * 1e3:,.0f} ms), "
            f"rules {rules * 1e3:,.1f} ms, summary {rows[-1]['summary_bytes']:,} B, straggler {rows[-1]['named']}[/dim]"
        )
    gc.callbacks.remove(on_gc)
    peak = _rss_now("VmHWM:")
    late = [r for r in rows if r["step"] > guilty_from]
    want = (shape.straggler_host, shape.straggler_rank)
    return {
        "hosts": hosts,
        "ranks_per_host": ranks_per_host,
        "events_per_step": shape.events_per_step_total,
        "ingest_ms": statistics.median(r["ingest_ms"] for r in late),
        "fold_ms": statistics.median(r["fold_ms"] for r in late),
        "fold_enc_ms": statistics.median(r["fold_enc_ms"] for r in late),
        "encode_ms": statistics.median(r["encode_ms"] for r in late),
        "close_ms": statistics.median(r["close_ms"] for r in late),
        "rules_ms": statistics.median(r["rules_ms"] for r in late),
        "fold_max_ms": max(r["fold_ms"] for r in rows[1:]),  # every step but the first (registrations' GC)
        "gc_ms": statistics.median(r["gc_ms"] for r in late),
        "full_gcs": sum(r["full_gcs"] for r in rows[1:]),
        "summary_bytes": max(r["summary_bytes"] for r in late),
        "rss_peak_mb": peak,
        "rss_fleet_mb": rss_fleet,  # after building the fleet's templates: the rest is the worker's and engine's
        "named": sum(1 for r in late if tuple(r["named"]) == want),
        "episodes": sum(1 for r in late if r["episode"]),
        "fired": sorted(fired),
        "case": {"guilty_layer": guilty_layer, "mem_hosts": shape.mem_hosts, "steps": steps, "from": guilty_from},
        "steps_judged": len(late),
        "wall_s": time.monotonic() - t0,
    }


def run(
    quick: bool = False,
    rounds: int | None = None,
    sizes: tuple[int, ...] | None = None,
    steps: int | None = None,
    pause_s: float | None = None,
    workers: int = WORKERS,
    ranks_per_host: int = 1,
    step_s: float = 1.0,
) -> dict:
    """Run every size, print the blocks, tables and verdicts, save the JSON. ``rounds`` (``python -m bench
    --rounds``, every benchmark's) is not read: one pass, each size takes minutes and its figures are
    medians over its steps already; ``python -m bench.width`` has no ``--rounds``. ``step_s``: the job's
    step in seconds (1 s by default; longer for a width whose 1 s steps this machine cannot carry, to
    measure the processes' RSS at it). Returns the results dict."""
    sizes = sizes or (QUICK_SIZES if quick else SIZES)
    pause_s = (QUICK_PAUSE_S if quick else PAUSE_S) if pause_s is None else pause_s
    say = common.console.print
    common.console.rule(
        "[bold]7. width[/bold]: one job of "
        + ", ".join(f"{h:,}" for h in sizes)
        + " hosts"
        + (f" x {ranks_per_host} ranks" if ranks_per_host > 1 else "")
        + " through broker, worker, rule engine"
    )
    results: list[SizeResult] = []
    tmp = Path(tempfile.mkdtemp(prefix="obshub-bench-width-"))
    t_all = time.monotonic()
    with private_stack(say) as settings:
        for hosts in sizes:
            n = steps or (QUICK_STEPS if quick else STEPS.get(hosts, 20))
            p = pause_s if hosts in ((sizes[0],) if quick else PAUSE_SIZES) else 0
            say(
                f"[dim]{hosts:,} hosts: {n} steps at {step_s:g} s"
                + (f", then a {p:.0f} s pause" if p > 0 else "")
                + "[/dim]"
            )
            try:
                r = SizeRun(
                    settings,
                    hosts,
                    n,
                    pause_s=p,
                    workers=workers,
                    tmp=tmp,
                    say=say,
                    guilty_from=GUILTY_FROM,
                    grace_s=QUICK_GRACE_S if quick else WIDE_GRACE_S if hosts >= 2048 else GRACE_S,
                    ranks_per_host=ranks_per_host,
                    step_s=step_s,
                ).run()
            except Exception as exc:  # one size that cannot run must not hide the others
                say(f"[red]{hosts:,} hosts: could not run: {type(exc).__name__}: {exc}[/red]")
                r = SizeResult(
                    hosts, n, hosts * 64 * ranks_per_host, ended=f"could not run: {str(exc)[:300]}", step_s=step_s
                )
                r.why_not = [r.ended]
            results.append(r)
            print_size(r, say)
    out = report(results, say)
    say(f"width: {time.monotonic() - t_all:.0f} s in all; process logs in {tmp}")
    data = {
        "sizes": [{k: v for k, v in r.__dict__.items()} for r in results],
        **out,
        "rev": common.git_rev(),
        "workers": workers,
        "partitions": PARTITIONS,
        "window_s": WINDOW_S,
        "ranks_per_host": ranks_per_host,
        "step_s": step_s,
    }
    say(f"raw results: {common.save('width', data)}")
    return data


def decode_cost(hosts: int, ranks_per_host: int, repeats: int = 5) -> dict:
    """The fold's decode of one step's part messages at ``hosts`` x ``ranks_per_host``, side by side in this
    process: as the ingest sends them (``accumulate.PartMsg``, typed accumulators as msgpack arrays,
    decoded by ``accumulate.decode_internal`` into the records) and the same messages in the dict form the
    worker sent before the typed accumulators (``accumulate.to_dict``, decoded untyped into dicts, as that
    worker did). Best of ``repeats`` CPU ms per step each, the bytes of each form and their ratio."""
    from obshub.streams import accumulate, wire
    from obshub.streams.inproc import InProcess

    f = fleet.Fleet(fleet.Shape(hosts, 3, job="decode", guilty_from=1, ranks_per_host=ranks_per_host), time.time_ns())
    pipe = InProcess(partitions=1)
    for _k, v in f.register_messages():
        pipe.feed(v)
    values = [v for _due, msgs, _n in f.step_slots(1, [1] * hosts) for _k, v in msgs]
    parts = [m for v in values for m, _p in pipe.parts_of(v) if isinstance(m, accumulate.PartMsg)]
    forms = {
        "typed": ([wire.packb(m) for m in parts], accumulate.decode_internal),
        "dict": ([wire.packb(accumulate.to_dict(m)) for m in parts], wire.unpackb),
    }
    best = {k: float("inf") for k in forms}
    for _ in range(repeats):
        for k, (raws, dec) in forms.items():  # interleaved: both see the same machine
            gc.collect()
            c = time.process_time()
            out = [dec(r) for r in raws]
            best[k] = min(best[k], time.process_time() - c)
            del out
    return {
        "hosts": hosts,
        "ranks_per_host": ranks_per_host,
        "parts": len(parts),
        "typed_ms": best["typed"] * 1e3,
        "dict_ms": best["dict"] * 1e3,
        "typed_bytes": sum(map(len, forms["typed"][0])),
        "dict_bytes": sum(map(len, forms["dict"][0])),
    }


def host_counts(text: str) -> tuple[int, ...]:
    """argparse type of ``--sizes``: comma-separated host counts, each a whole number of 1 or more
    (``0``, ``-5`` and ``abc`` ended in a traceback, or in a size that "could not run"). Raises
    argparse.ArgumentTypeError naming the bad item."""
    items = [x.strip() for x in text.split(",")]
    if not any(items):
        raise argparse.ArgumentTypeError(f"{text!r}: no host count given (e.g. 8,128)")
    out = []
    for x in items:
        try:
            n = int(x)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: {x!r} is not a whole number of hosts (e.g. 8,128)") from None
        if n < 1:
            raise argparse.ArgumentTypeError(f"{text!r}: {n} hosts; each size is 1 host or more")
        out.append(n)
    return tuple(out)


MIN_STEPS = GUILTY_FROM + 2
"""Fewest ``--steps``: the straggler slows from step ``GUILTY_FROM`` (its baseline needs the 10 clean steps
before), and its alert needs a slow step summarised after it; fewer steps judge no straggler at all."""
MAX_STEP_S = 60.0
"""Longest ``--step-s``: a size of 30 steps then takes half an hour."""

#: the options of the broker run (``run``), which ``--inproc`` and ``--decode`` do not read
_RUN_OPTIONS = ("quick", "steps", "pause_s", "workers", "step_s")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line of ``python -m bench.width``; bad input exits 2 naming the option and the value
    (argparse): a host count, step count, worker count or rank count below 1, a pause or step length
    that is negative, not finite or too long, ``--case`` without ``--inproc``, and an option of the broker
    run given with ``--inproc`` or ``--decode`` (which read none of them). Defaults are filled in after the
    checks (``steps``: None, each size its own)."""
    p = argparse.ArgumentParser(
        prog="python -m bench.width", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="smoke run: 4 and 16 hosts, 12 steps, a 3 s pause at 4 hosts")
    p.add_argument(
        "--sizes",
        type=host_counts,
        default=None,
        metavar="N,N,...",
        help="comma-separated host counts, each 1 or more (default 8,128,512,2048; --quick 4,16; --inproc 8,128; "
        "--decode 512)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"steps per size, at least {MIN_STEPS}: the straggler slows from step {GUILTY_FROM} (default: per size, "
        "20-30; --quick 12)",
    )
    p.add_argument(
        "--pause-s",
        type=float,
        default=None,
        help=f"seconds the worker is stopped under load at {', '.join(map(str, PAUSE_SIZES))} hosts (the first "
        f"size with --quick), 0 for none (default {PAUSE_S:g}; --quick {QUICK_PAUSE_S:g})",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help=f"stream worker processes, 1 to {PARTITIONS} (the topics' partitions; default {WORKERS})",
    )
    p.add_argument(
        "--inproc",
        action="store_true",
        help="no broker: ingest, fold and rule pack of each size in this process (inproc_cost), one size per "
        "process run; for sizes the machine cannot carry at 1 s steps",
    )
    p.add_argument(
        "--ranks-per-host",
        type=int,
        default=1,
        help="ranks per host, 1 or more: each host's batches hold every rank's events, 64 per rank-step (default 1)",
    )
    p.add_argument(
        "--decode",
        action="store_true",
        help="no broker: the fold's decode of one step's parts, typed accumulators vs the dict form, side by side",
    )
    p.add_argument(
        "--case",
        choices=sorted(CASES),
        default=None,
        help="with --inproc: straggler (sched, 15 steps, from 11: a baseline on the judged steps), mem (node2 stalls in reclaim from step 17 of 21: "
        "a memory episode), mem10 (mem, and 10%% of the other hosts in reclaim every step); default straggler",
    )
    p.add_argument(
        "--step-s",
        type=float,
        default=None,
        help=f"the job's step in seconds, above 0, at most {MAX_STEP_S:g} (default 1; e.g. 5 to measure RSS at "
        "2,048 x 8, which 1 s steps overrun here)",
    )
    a = p.parse_args(argv)
    if a.step_s is not None and not 0 < a.step_s <= MAX_STEP_S:
        p.error(f"--step-s {a.step_s}: expected a positive number of seconds, at most {MAX_STEP_S:g}")
    if a.pause_s is not None and not 0 <= a.pause_s < math.inf:
        p.error(f"--pause-s {a.pause_s}: expected 0 (no pause) or a finite positive number of seconds")
    if a.steps is not None and a.steps < MIN_STEPS:
        p.error(
            f"--steps {a.steps}: expected {MIN_STEPS} or more (the straggler slows from step {GUILTY_FROM}, once "
            "its baseline has 10 clean steps)"
        )
    if a.workers is not None and not 1 <= a.workers <= PARTITIONS:
        p.error(f"--workers {a.workers}: expected 1 to {PARTITIONS} (the topics have {PARTITIONS} partitions)")
    if a.ranks_per_host < 1:
        p.error(f"--ranks-per-host {a.ranks_per_host}: expected 1 or more")
    if a.inproc and a.decode:
        p.error("--inproc and --decode: one at a time")
    if a.case is not None and not a.inproc:
        p.error(f"--case {a.case}: only with --inproc (the broker run's case is the sched straggler)")
    if a.inproc or a.decode:
        given = [
            f"--{k.replace('_', '-')}" for k in _RUN_OPTIONS if getattr(a, k) is not None and getattr(a, k) is not False
        ]
        if given:
            p.error(f"{', '.join(given)}: only without {'--inproc' if a.inproc else '--decode'} (the broker run's)")
    a.case = a.case or "straggler"
    a.workers = WORKERS if a.workers is None else a.workers
    a.step_s = 1.0 if a.step_s is None else a.step_s
    return a


def main(argv: list[str] | None = None) -> int:
    """Command line (``parse_args``): ``python -m bench.width [--quick] [--sizes 8,128] [--steps N]
    [--pause-s S]``, or ``--inproc`` / ``--decode``; 0 when it ran, 2 on bad arguments."""
    a = parse_args(argv)
    sizes = a.sizes
    if a.decode:
        rows = [decode_cost(h, a.ranks_per_host) for h in sizes or (512,)]
        cells = [
            [
                f"{r['hosts']:,} x {r['ranks_per_host']}",
                f"{r['parts']:,}",
                f"{r['dict_ms']:.2f}",
                f"{r['typed_ms']:.2f}",
                f"{r['typed_ms'] / r['dict_ms']:.2f}",
                f"{r['dict_bytes']:,} / {r['typed_bytes']:,}",
            ]
            for r in rows
        ]
        cols = ("hosts x ranks", "parts", "dict form ms", "typed ms", "typed / dict", "bytes dict / typed")
        title = f"the fold's decode of one step's parts ({a.ranks_per_host} ranks per host), best of 5"
        common.console.print(common.rows_table(title, cols, cells))
        return 0
    if a.inproc:
        layer, n_steps, g_from, share = CASES[a.case]
        out = [
            inproc_cost(h, a.ranks_per_host, n_steps, g_from, guilty_layer=layer, mem_share=share)
            for h in sizes or (8, 128)
        ]
        t = Table(
            title=f"in process, per step after the straggler's first slow step ({a.ranks_per_host} ranks per host, "
            f"case {a.case})"
        )
        for col in (
            "hosts x ranks",
            "events/step",
            "ingest ms",
            "fold ms (+ parts' encoding)",
            "parts' encoding (ingest's), close (fold's)",
            "fold max ms (steps 1-)",
            "collector ms; full (steps 1-)",
            "rule pack ms",
            "summary bytes",
            "RSS peak MB",
            "straggler host+rank named",
            "memory episode; fired for it",
        ):
            t.add_column(col, justify="right")
        for r in out:
            t.add_row(
                f"{r['hosts']:,} x {r['ranks_per_host']}",
                f"{r['events_per_step']:,}",
                f"{r['ingest_ms']:,.0f}",
                f"{r['fold_ms']:,.0f} ({r['fold_enc_ms']:,.0f})",
                f"{r['encode_ms']:,.0f}, {r['close_ms']:,.0f}",
                f"{r['fold_max_ms']:,.0f}",
                f"{r['gc_ms']:,.0f}; {r['full_gcs']}",
                f"{r['rules_ms']:,.1f}",
                f"{r['summary_bytes']:,}",
                f"{r['rss_peak_mb']:,.0f} ({r['rss_fleet_mb']:,.0f})",
                f"{r['named']}/{r['steps_judged']}",
                f"{r['episodes']}/{r['steps_judged']}; {', '.join(r['fired']) or '-'}",
            )
        common.console.print(t)
        saved = common.save("width_inproc", {"rows": out, "case": a.case, "rev": common.git_rev()})
        common.console.print(f"raw results: {saved}")
        return 0
    run(
        a.quick,
        sizes=sizes,
        steps=a.steps,
        pause_s=a.pause_s,
        workers=a.workers,
        ranks_per_host=a.ranks_per_host,
        step_s=a.step_s,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
