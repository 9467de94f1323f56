"""Stream throughput, side by side: events/s through ingest, the per-step join and the summaries, for

- ``faust, 1 worker`` and ``faust, 2 workers``: real ``obshub streams worker`` processes (one consumer
  group, 4 input partitions, 4 internal partitions), fed agent-shaped batches (bench/loadgen.py: 8 hosts,
  64 events per host-step, 3 steps per batch) published to a fresh topic once the workers are ready;
  time runs from the first publish to the last summary (the workers' Prometheus counters);
- ``plain confluent-kafka loop``: bench/plain_loop.py doing the same work with the same code
  (decode, accumulate, summarise, publish) in one process without Faust, over the same messages already
  in the topic: the ceiling for Python on this machine.

Configurations run interleaved per round. Reported per configuration: total events/s and events/s per
worker, with the ratio to the plain loop, and events per CPU-second of each (the worker processes' own
CPU; independent of other load on the machine). Targets: >= 50,000 events/s per worker and Faust within
3x of the plain loop (wall clock); >= 100,000 events per CPU-second per Faust worker and within 1.5x of
the plain loop per CPU-second.

    python -m bench.stream_throughput                 # ROUNDS rounds of HOSTS x STEPS
    python -m bench.stream_throughput --quick         # 1 round, a few thousand events
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench import common, loadgen
from bench.broker import cpu_seconds, free_port, private_stack
from bench.plain_loop import PlainLoop
from tests.support import testkit

HOSTS, STEPS, ROUNDS = 8, 400, 2
QUICK_HOSTS, QUICK_STEPS = 4, 30
PARTITIONS = 4
TARGET_PER_WORKER = 50_000
TARGET_VS_PLAIN = 3.0
TARGET_PER_CPU_S = 100_000  # events per CPU-second of one Faust worker
TARGET_VS_PLAIN_CPU = 1.5  # plain loop's events per CPU-second / one Faust worker's


def worker_counters(ports: list[int]) -> dict:
    """Sum of ``obshub_streams_events_total`` and ``obshub_streams_summaries_total`` over the workers."""
    out = {"events": 0.0, "summaries": 0.0}
    for port in ports:
        try:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        except httpx.HTTPError:
            continue
        for fam in text_string_to_metric_families(text):
            if fam.name == "obshub_streams_events":
                out["events"] += sum(s.value for s in fam.samples if s.name.endswith("_total"))
            elif fam.name == "obshub_streams_summaries":
                out["summaries"] += sum(s.value for s in fam.samples if s.name.endswith("_total"))
    return out


class FaustRun:
    """``n`` workers of one fresh app on fresh topics; :meth:`measure` publishes the load and times it."""

    def __init__(self, settings, tmp: Path, n: int, tag: str):
        self.settings = settings
        self.topics = testkit.make_topics(settings, f"bench-{tag}", partitions=PARTITIONS)
        app = f"bench-{tag}-app"
        self.ports = [free_port() for _ in range(n)]
        self.workers = [
            testkit.Worker(
                self.topics,
                app,
                i + 1,
                tmp / f"{tag}-{i}.log",
                window_s=5.0,
                partitions=PARTITIONS,
                metrics_port=self.ports[i],
            )
            for i in range(n)
        ]

    def measure(self, load: loadgen.Load, timeout_s: float = 300.0) -> dict:
        """Wait until the workers are ready, publish, wait for every summary. Returns events/s."""
        for w in self.workers:
            w.wait_ready(120)
        time.sleep(3.0 if len(self.workers) > 1 else 1.0)  # let the group settle after the last join
        cpu0 = sum(cpu_seconds(w.proc.pid) for w in self.workers)
        t0 = time.monotonic()
        testkit.publish(self.settings, self.topics.events, load.messages)
        t_pub = time.monotonic() - t0
        deadline = t0 + timeout_s
        c = worker_counters(self.ports)
        while c["summaries"] < load.steps and time.monotonic() < deadline:
            time.sleep(0.2)
            c = worker_counters(self.ports)
        secs = time.monotonic() - t0
        cpu = sum(cpu_seconds(w.proc.pid) for w in self.workers) - cpu0
        done = c["summaries"] >= load.steps
        return {
            "events": c["events"],
            "summaries": c["summaries"],
            "seconds": secs,
            "publish_s": t_pub,
            "complete": done,
            "events_per_s": load.events / secs if done else c["events"] / secs,
            "cpu_s": cpu,
            "events_per_cpu_s": c["events"] / cpu if cpu > 0 else float("nan"),
        }

    def stop(self) -> None:
        for w in self.workers:
            w.stop()


def run(quick: bool = False, rounds: int | None = None) -> dict:
    """Run the benchmark, print the table and verdicts, save the JSON. Returns the results dict."""
    rounds = rounds or (1 if quick else ROUNDS)
    hosts, steps = (QUICK_HOSTS, QUICK_STEPS) if quick else (HOSTS, STEPS)
    common.console.rule("[bold]3. stream throughput[/bold]: Faust workers vs a plain confluent-kafka loop")
    load = loadgen.build(hosts, steps)
    common.console.print(
        f"[dim]  load: {hosts} hosts x {steps} steps = {load.events:,} events in "
        f"{len(load.messages):,} batches ({load.bytes / 1e6:.1f} MB msgpack)[/dim]"
    )
    tmp = Path(tempfile.mkdtemp(prefix="obshub-bench-streams-"))
    details: dict[str, list[dict]] = {}
    last_topic: list[str] = []
    try:
        with private_stack(common.console.print) as settings:

            def faust(n: int):
                def fn() -> float:
                    r = FaustRun(settings, tmp, n, f"w{n}-{uuid.uuid4().hex[:6]}")
                    try:
                        res = r.measure(load)
                    finally:
                        r.stop()
                    last_topic[:] = [r.topics.events, r.topics.steps]
                    details.setdefault(f"faust, {n} worker{'s' if n > 1 else ''}", []).append(res)
                    if not res["complete"]:
                        common.console.print(
                            f"[red]  {n} worker(s): only {res['summaries']:.0f} of {load.steps} summaries in time[/red]"
                        )
                    return res["events_per_s"]

                return fn

            def plain() -> float:
                res = PlainLoop(settings.bootstrap_servers, last_topic[0], last_topic[1] + "-plain").run(load.steps)
                details.setdefault("plain confluent-kafka loop", []).append(res)
                return res["events_per_s"]

            series = common.interleave(
                {"faust, 1 worker": faust(1), "faust, 2 workers": faust(2), "plain confluent-kafka loop": plain}, rounds
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    per_worker = {"faust, 1 worker": 1, "faust, 2 workers": 2, "plain confluent-kafka loop": 1}
    common.console.print(
        common.table(
            f"events/s through ingest + join + summaries ({load.events:,} events, "
            f"{rounds} interleaved rounds; ratio = to the plain loop)",
            series,
            "events/s",
            baseline="plain confluent-kafka loop",
            lower_is_better=False,
            fmt="{:,.0f}",
        )
    )
    pw = {k: v.median / per_worker[k] for k, v in series.items()}
    common.console.print("events/s per worker (process): " + ", ".join(f"{k}: {v:,.0f}" for k, v in pw.items()))
    plain_rate = series["plain confluent-kafka loop"].median
    one = series["faust, 1 worker"].median
    cpu_eff = {k: statistics.median(d["events_per_cpu_s"] for d in v) for k, v in details.items()}
    common.console.print(
        "events per CPU second of the worker process(es) (independent of other load on the box): "
        + ", ".join(f"{k}: {v:,.0f}" for k, v in cpu_eff.items())
    )
    common.verdict(
        f">= {TARGET_PER_WORKER:,} events/s per Faust worker",
        one >= TARGET_PER_WORKER,
        f"1 worker {one:,.0f}/s; 2 workers {pw['faust, 2 workers']:,.0f}/s each "
        f"(2 cores shared with the broker and the publisher)",
    )
    common.verdict(
        "Faust within 3x of the plain loop",
        one * TARGET_VS_PLAIN >= plain_rate,
        f"plain loop {plain_rate:,.0f}/s = {plain_rate / one:.2f}x one Faust worker",
    )
    one_cpu, plain_cpu = cpu_eff.get("faust, 1 worker", 0.0), cpu_eff.get("plain confluent-kafka loop", 0.0)
    common.verdict(
        f">= {TARGET_PER_CPU_S:,} events per CPU-second per Faust worker",
        one_cpu >= TARGET_PER_CPU_S,
        f"1 worker {one_cpu:,.0f}; 2 workers {cpu_eff.get('faust, 2 workers', 0.0):,.0f}",
    )
    common.verdict(
        f"Faust within {TARGET_VS_PLAIN_CPU}x of the plain loop per CPU-second",
        one_cpu * TARGET_VS_PLAIN_CPU >= plain_cpu,
        f"plain loop {plain_cpu:,.0f} events/CPU-s = {plain_cpu / one_cpu if one_cpu else float('inf'):.2f}x "
        "one Faust worker",
    )
    result = {
        "rounds": rounds,
        "hosts": hosts,
        "steps": steps,
        "events": load.events,
        "batches": len(load.messages),
        "bytes": load.bytes,
        "samples": {k: v.samples for k, v in series.items()},
        "per_worker": pw,
        "details": details,
        "events_per_cpu_s": cpu_eff,
        "rev": common.git_rev(),
        "targets": {
            "per_worker": TARGET_PER_WORKER,
            "vs_plain": TARGET_VS_PLAIN,
            "per_cpu_s": TARGET_PER_CPU_S,
            "vs_plain_cpu": TARGET_VS_PLAIN_CPU,
        },
    }
    common.console.print(f"raw results: {common.save('stream_throughput', result)}")
    return result


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m bench.stream_throughput [--quick] [--rounds N]``."""
    p = argparse.ArgumentParser(
        prog="python -m bench.stream_throughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="smoke run: 1 round, a few thousand events")
    p.add_argument("--rounds", type=common.positive_int, default=None, help=f"interleaved rounds (default {ROUNDS})")
    a = p.parse_args(argv)
    run(a.quick, a.rounds)
    return common.exit_code(a.quick)


if __name__ == "__main__":
    raise SystemExit(main())
