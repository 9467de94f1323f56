"""Soak: thousands of short jobs through the real pipeline, and whether its state stays flat.

A private broker (bench/broker.py), one real ``obshub streams worker`` and one real ``obshub rules serve``
(builtin pack) processes, and synthetic agents in this process: job ``soak-<i>`` of ``--hosts`` hosts
(``streams.synthetic``: one REGISTER batch per host, then one batch per host and step) runs ``--steps``
steps and ends; jobs start at ``--rate`` per second, one after the other, each with new agent instances.

Time compression (what a shared cluster does in a week, here in minutes): jobs last milliseconds instead
of hours, and both retentions are ``--retention-s`` (default 10 s: worker ``--job-retention-s``, engine
``OBSHUB_RULES_JOB_RETENTION_S``) instead of 1 h, so about ``rate x retention`` ended jobs are held at any
time. New changelogs then roll a segment and are compacted every 10 s and keep tombstones 60 s (the floor;
``core.topics.changelog_cleaner_config``), so the broker's log cleaner compacts them during the run as it
would every hour with a 1 h retention. The broker's own cadence is not compressed: its cleaner wakes
every 15 s when idle (``log.cleaner.backoff.ms``), 1.5 retentions here and 0.4 % of one in production.

Every ``--every`` jobs (once the pipeline has summarised every step published: publishing waits when it
falls more than 2 s of jobs behind, and the schedule moves with that wait and with each sample, so no
burst follows) it prints: jobs seen, RSS of the worker and of the engine
(/proc/<pid>/status VmRSS), the worker's table keys and jobs held in memory (its
``obshub_streams_table_keys`` / ``obshub_streams_jobs_tracked`` gauges; ``peak``: the most jobs held at a
back-pressure check since the last sample), the engine's state (jobs, alert
instances and window groups in its snapshot, the snapshot's bytes), the changelog records a restarted
worker would read (every record of the app's changelog topics, read to their ends by a consumer, with the
time that took: the recovery's read, without Faust's start-up) and their bytes on disk. At the end the
worker is restarted for real: time from start to Faust's "Worker ready" and its table keys afterwards.

Target (issue #33): RSS growth between the 1,000th and the last (10,000th) job <= 5 % for the worker and
the engine, and recovery flat (the records a restart reads at the last job <= 1.5 x those at the 1,000th).

    python -m bench.soak                          # 10,000 jobs of 8 hosts at 12 jobs/s (about 15 minutes)
    python -m bench.soak --jobs 3000 --every 500  # shorter
    python -m bench.soak --quick                  # 300 jobs (about 1 minute): a smoke run
"""

from __future__ import annotations

import argparse
import os
import re
import time
import uuid
from pathlib import Path

import httpx
import msgpack
from confluent_kafka import Consumer, Producer, TopicPartition

from bench import common
from bench.broker import free_port, obshub_cmd, private_stack, stop_group
from bench.width import Proc, _start, _wait_log, topic_bytes
from obshub.core import schema
from obshub.streams import synthetic

APP_ID = "soak"
RULES_PREFIX = "soak-rules"
PARTITIONS = 4
WINDOW_S = 2.0
TARGET_GROWTH = 0.05
TARGET_RECOVERY_RATIO = 1.5


def _gauges(port: int) -> dict[str, float]:
    """``name`` or ``name{table}`` -> value of the worker's retention gauges and summaries counter."""
    out: dict[str, float] = {}
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    except httpx.HTTPError:
        return out
    for m in re.finditer(r'^(obshub_streams_table_keys)\{table="(\w+)"\} (\S+)$', text, re.M):
        out[m.group(2)] = float(m.group(3))
    for name in ("obshub_streams_jobs_tracked", "obshub_streams_summaries_total"):
        out[name] = sum(float(v) for v in re.findall(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", text, re.M))
    return out


def _engine_state(bootstrap: str, topic: str) -> dict:
    """Jobs, alert instances, window groups and bytes of the rule engine's state: the last record of each
    partition of its state topic ``topic`` (``<group prefix>-state``, msgpack ``{"engine": snapshot, ...}``
    per owned steps partition, docs/RULES.md), summed over partitions; zeros when none is readable."""
    out = {"jobs": 0, "alerts": 0, "groups": 0, "bytes": 0}
    c = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"soak-state-{uuid.uuid4().hex}", "enable.auto.commit": False}
    )
    try:
        md = c.list_topics(topic, timeout=10).topics.get(topic)
        for p in sorted(md.partitions) if md is not None and md.error is None else ():
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)
            if hi <= lo:
                continue
            # the last offsets are transaction markers, never delivered: read the tail, keep its last record
            c.assign([TopicPartition(topic, p, max(lo, hi - 8))])
            m, deadline = None, time.monotonic() + 10
            while time.monotonic() < deadline:
                got = c.poll(0.5)
                if got is not None and not got.error() and got.value():
                    m = got
                if c.position([TopicPartition(topic, p)])[0].offset >= hi:
                    break
            if m is None:
                continue
            try:
                snap = (msgpack.unpackb(m.value(), raw=False, strict_map_key=False) or {}).get("engine") or {}
            except (ValueError, AttributeError):
                continue
            out["bytes"] += len(m.value())
            out["jobs"] += len(snap.get("jobs") or {})
            out["alerts"] += len(snap.get("instances") or [])
            out["groups"] += sum(len(rt.get("fps") or ()) for rt in (snap.get("runtime") or {}).values())
    finally:
        c.close()
    return out


def changelog_read(bootstrap: str, app_id: str) -> tuple[int, float]:
    """(records, seconds) to read every changelog partition of ``app_id`` from its start to its end, as a
    restarted worker's recovery does (keys and values fetched, not decoded)."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"soak-probe-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "fetch.message.max.bytes": 16 << 20,
        }
    )
    t0 = time.monotonic()
    try:
        md = c.list_topics(timeout=10)
        tps, ends = [], {}
        for name, t in md.topics.items():
            if name.startswith(f"{app_id}-") and name.endswith("-changelog"):
                for p in t.partitions:
                    lo, hi = c.get_watermark_offsets(TopicPartition(name, p), timeout=10)
                    if hi > lo:
                        tps.append(TopicPartition(name, p, lo))
                        ends[(name, p)] = hi
        t0 = time.monotonic()
        c.assign(tps)
        n, left = 0, dict(ends)
        deadline = time.monotonic() + 120
        while left and time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                if m.error():
                    continue
                n += 1
                k = (m.topic(), m.partition())
                if k in left and m.offset() >= left[k] - 1:
                    del left[k]
        return n, time.monotonic() - t0
    finally:
        c.close()


class Jobs:
    """Synthetic agents: job ``soak-<i>`` encoded on demand and published (keyed by host)."""

    def __init__(self, bootstrap: str, hosts: int, steps: int):
        self.hosts, self.steps = hosts, steps
        self.prod = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
        self.n = 0

    def publish(self) -> None:
        scn = synthetic.Scenario(
            job=f"soak-{self.n}", hosts=self.hosts, steps=self.steps, seed=self.n, start_ns=time.time_ns()
        )
        for key, batch in synthetic.generate(scn):
            self.prod.produce(schema.TOPIC_EVENTS, key=key, value=schema.encode_batch(batch))
        self.prod.poll(0)
        self.n += 1

    def flush(self) -> None:
        self.prod.flush(30)


def _worker(tmp: Path, retention_s: float, n: int) -> Proc:
    port = free_port()
    args = ["--app-id", APP_ID, "--partitions", str(PARTITIONS), "--window-s", str(WINDOW_S)]
    args += ["--job-retention-s", str(retention_s), "--metrics-port", str(port), "--log-level", "info"]
    return _start("worker", obshub_cmd("streams", "worker", *args), tmp / f"worker{n}.log", port)


def run(
    quick: bool = False,
    rounds: int | None = None,
    *,
    jobs: int = 10_000,
    every: int = 1_000,
    hosts: int = 8,
    steps: int = 3,
    rate: float = 12.0,
    retention_s: float = 10.0,
) -> dict:
    """Run the soak (module docstring); prints the table and the verdicts, saves bench/results/soak.json."""
    say = common.console.print
    if quick:
        jobs, every = 300, 100
    say(
        f"[bold]soak[/bold]: {jobs:,} jobs of {hosts} hosts x {steps} steps at {rate:g} jobs/s, retention {retention_s:g} s"
    )
    rows: list[dict] = []
    procs: list[Proc] = []
    with private_stack(say) as settings:
        tmp = settings.home / "soak"
        tmp.mkdir()
        boot = settings.bootstrap_servers
        os.environ["OBSHUB_RULES_JOB_RETENTION_S"] = str(retention_s)
        try:
            worker = _worker(tmp, retention_s, 1)
            procs.append(worker)
            eport = free_port()
            engine = _start(
                "engine",
                obshub_cmd("rules", "serve", "--group-prefix", RULES_PREFIX, "--metrics-port", str(eport)),
                tmp / "engine.log",
                eport,
            )
            procs.append(engine)
            _wait_log(worker, "Worker ready", 120)
            time.sleep(3.0)
            gen = Jobs(boot, hosts, steps)
            state_topic = f"{RULES_PREFIX}-state"
            t0 = time.monotonic()
            peak = 0.0  # most jobs held in the worker's memory at a back-pressure check since the last sample
            while gen.n < jobs:
                due = t0 + gen.n / rate
                now = time.monotonic()
                if due > now:
                    time.sleep(due - now)
                gen.publish()
                if gen.n % 50 == 0:  # back-pressure: at most 2 s of jobs not yet summarised
                    gen.flush()
                    while True:
                        g = _gauges(worker.metrics_port)
                        behind = gen.n * steps - g.get("obshub_streams_summaries_total", 0.0)
                        if behind <= 2 * rate * steps:
                            break
                        time.sleep(0.2)
                        t0 += 0.2  # the schedule moves with the wait
                    for p in procs:
                        if not p.alive():
                            raise RuntimeError(f"{p.role} exited:\n{p.log_tail()}")
                    peak = max(peak, g.get("obshub_streams_jobs_tracked", 0.0))
                if gen.n % every == 0:
                    t_s = time.monotonic()
                    rows.append(_sample(gen, worker, engine, state_topic, boot, steps, settings.kafka_dir / "data"))
                    rows[-1]["jobs_in_memory_peak"], peak = peak, 0.0
                    _print_row(rows[-1])
                    # the schedule moves with the sample too: no burst of the jobs "due" while it waited
                    t0 += time.monotonic() - t_s
            gen.flush()
            # the real restart: stop the worker, start it again, time until ready, tables after recovery
            stop_group(worker.popen, 20)
            t_r = time.monotonic()
            worker = _worker(tmp, retention_s, 2)
            procs.append(worker)
            _wait_log(worker, "Worker ready", 180)
            ready_s = time.monotonic() - t_r
            time.sleep(3.0)
            after = _gauges(worker.metrics_port)
        finally:
            for p in procs:
                if p.popen is not None:
                    stop_group(p.popen, 10)
            os.environ.pop("OBSHUB_RULES_JOB_RETENTION_S", None)
    return _report(rows, ready_s, after, jobs, hosts, steps, rate, retention_s)


def _sample(gen: Jobs, worker: Proc, engine: Proc, state_topic: str, boot: str, steps: int, data_dir: Path) -> dict:
    deadline = time.monotonic() + 60  # wait until every step published so far is summarised
    g = _gauges(worker.metrics_port)
    while g.get("obshub_streams_summaries_total", 0.0) < gen.n * steps and time.monotonic() < deadline:
        time.sleep(0.2)
        g = _gauges(worker.metrics_port)
    records, read_s = changelog_read(boot, APP_ID)
    cl_bytes = sum(v for k, v in topic_bytes(data_dir).items() if k.startswith(f"{APP_ID}-") and "changelog" in k)
    return {
        "jobs": gen.n,
        "worker_rss_mb": worker.rss_mb()[0],
        "engine_rss_mb": engine.rss_mb()[0],
        "tables": {k: v for k, v in g.items() if not k.startswith("obshub_")},
        "jobs_in_memory": g.get("obshub_streams_jobs_tracked", 0.0),
        "summaries": g.get("obshub_streams_summaries_total", 0.0),
        "engine": _engine_state(boot, state_topic),
        "changelog_records": records,
        "changelog_read_s": read_s,
        "changelog_bytes": cl_bytes,
    }


def _print_row(r: dict) -> None:
    t = r["tables"]
    e = r["engine"]
    common.console.print(
        f"  {r['jobs']:>6,} jobs  worker {r['worker_rss_mb']:6.1f} MB  engine {r['engine_rss_mb']:6.1f} MB  "
        f"jobs/members/closed/agents keys {t.get('jobs', 0):.0f}/{t.get('members', 0):.0f}/"
        f"{t.get('closed', 0):.0f}/{t.get('agents', 0):.0f}  in memory {r['jobs_in_memory']:.0f} "
        f"(peak {r.get('jobs_in_memory_peak', 0):.0f})  "
        f"engine jobs/alerts/groups {e['jobs']}/{e['alerts']}/{e['groups']} ({e['bytes']:,} B)  "
        f"changelogs {r['changelog_records']:,} records, read in {r['changelog_read_s']:.2f} s, "
        f"{r['changelog_bytes'] / 1e6:.1f} MB  summaries {r['summaries']:,.0f}"
    )


def _report(rows, ready_s, after, jobs, hosts, steps, rate, retention_s) -> dict:
    say = common.console.print
    out = {
        "jobs": jobs,
        "hosts": hosts,
        "steps": steps,
        "rate": rate,
        "retention_s": retention_s,
        "rows": rows,
        "restart_ready_s": ready_s,
        "tables_after_restart": after,
    }
    say(
        f"  restart at the end: worker ready {ready_s:.1f} s after start; table keys after recovery "
        + ", ".join(f"{k} {v:.0f}" for k, v in after.items() if not k.startswith("obshub_"))
    )
    first = next((r for r in rows if r["jobs"] >= 1000), rows[0] if rows else None)
    last = rows[-1] if rows else None
    if first and last and last is not first:
        for role in ("worker", "engine"):
            a, b = first[f"{role}_rss_mb"], last[f"{role}_rss_mb"]
            growth = (b - a) / a
            out[f"{role}_growth"] = growth
            common.verdict(
                f"{role} RSS growth, job {first['jobs']:,} -> {last['jobs']:,}",
                growth <= TARGET_GROWTH,
                f"{a:.1f} -> {b:.1f} MB ({growth:+.1%}; target <= {TARGET_GROWTH:.0%})",
            )
        ra, rb = max(1, first["changelog_records"]), last["changelog_records"]
        out["recovery_ratio"] = rb / ra
        common.verdict(
            f"records a restart reads, job {first['jobs']:,} -> {last['jobs']:,}",
            rb / ra <= TARGET_RECOVERY_RATIO,
            f"{ra:,} -> {rb:,} ({rb / ra:.2f}x; read in {first['changelog_read_s']:.2f} s -> "
            f"{last['changelog_read_s']:.2f} s; target <= {TARGET_RECOVERY_RATIO}x)",
        )
    common.save("soak", out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--every", type=int, default=1_000, help="sample every this many jobs")
    p.add_argument("--hosts", type=int, default=8)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--rate", type=float, default=12.0, help="jobs started per second")
    p.add_argument("--retention-s", type=float, default=10.0, help="worker and engine job retention (s)")
    p.add_argument("--quick", action="store_true", help="300 jobs, a sample every 100")
    a = p.parse_args(argv)
    run(
        a.quick,
        jobs=a.jobs,
        every=a.every,
        hosts=a.hosts,
        steps=a.steps,
        rate=a.rate,
        retention_s=a.retention_s,
    )
    return common.exit_code(a.quick)


if __name__ == "__main__":
    raise SystemExit(main())
