"""Where a stream worker's CPU goes: one real ``obshub streams worker`` on the stream benchmark's load
(bench/loadgen.py, 8 hosts x 400 steps, 64 events per host-step), sampled by py-spy while it drains the
load, each sample given to the category of the innermost frame that names one (the application's own
work: decode, reduce, fold, summarize, JSON, table changelog writes, metrics) or else to the Faust /
aiokafka / asyncio machinery found on the stack (produce path, consume path, commit, event loop).

Printed: events per CPU-second of the worker process, and the share of samples per category. Needs
py-spy (the ``bench`` extra) and permission to attach to a child process (ptrace).

    python -m bench.worker_profile              # 8 hosts x 400 steps
    python -m bench.worker_profile --quick      # 4 hosts x 60 steps
    python -m bench.worker_profile --hosts 64 --steps 60 --steps-per-batch 1 --events-per-step 13
                                                # small batches: 13 events per Kafka message
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench import common, loadgen, stages
from bench.broker import cpu_seconds, free_port, private_stack
from bench.stream_throughput import worker_counters

# innermost frame first: (category, fragment of the frame's file)
OWN = (
    ("decode (streams.wire, msgspec)", "obshub/streams/wire"),
    ("decode (reference schema)", "core/schema"),
    ("reduce + merge (streams.accumulate)", "obshub/streams/accumulate"),
    ("summarize (streams.analysis)", "obshub/streams/analysis"),
    ("JSON of the summary", "json/"),
    ("Faust table writes (changelog records)", "faust/tables"),
    ("Prometheus metrics", "prometheus_client"),
    ("fold + ingest logic (streams.fold, streams.ingest)", "obshub/streams/fold"),
    ("fold + ingest logic (streams.fold, streams.ingest)", "obshub/streams/ingest"),
)
# anywhere on the stack, in this order
MACHINERY = (
    ("Faust commit", ("commit",)),
    (
        "produce path (Faust topics/producer, aiokafka producer)",
        ("aiokafka/producer", "faust/transport/producer", "faust/topics", "faust/channels"),
    ),
    (
        "consume path (Faust consumer/streams, aiokafka consumer)",
        ("aiokafka/consumer", "faust/transport/consumer", "faust/streams", "conductor"),
    ),
    ("aiokafka connection and protocol", ("aiokafka",)),
    ("asyncio event loop", ("asyncio",)),
)


def category(frames: list[str]) -> str:
    """Category of one stack (frames root first, py-spy ``function (file:line)``)."""
    for frame in reversed(frames):
        where = frame.rpartition(" (")[2]
        for name, frag in OWN:
            if frag in where:
                return name
    if any("expire" in f and "obshub/streams/app" in f for f in frames):
        return "window timer (streams.app expire)"
    joined = ";".join(frames)
    for name, frags in MACHINERY:
        if any(x in joined for x in frags):
            return name
    return "other"


def classify(raw: str) -> dict[str, int]:
    """Samples per category from py-spy's raw output (``stack count`` per line)."""
    out: collections.Counter = collections.Counter()
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit():
            out[category(stack.split(";"))] += int(n)
    return dict(out)


def run(
    quick: bool = False,
    rounds: int | None = None,
    hosts: int | None = None,
    steps: int | None = None,
    steps_per_batch: int = 3,
    events_per_step: int = 64,
) -> dict:
    """Profile one worker draining the load; print and save the shares. Returns the results dict.
    ``steps_per_batch`` and ``events_per_step`` shape the load's messages (bench/loadgen.py)."""
    hosts = hosts or (4 if quick else 8)
    steps = steps or (60 if quick else 400)
    exe = stages.py_spy()
    common.console.rule("[bold]stream worker profile[/bold]: where a worker's CPU goes (py-spy)")
    if exe is None:
        common.console.print("[red]py-spy is not installed (pip install 'obshub[bench]')[/red]")
        return {}
    from tests.support import testkit

    load = loadgen.build(hosts, steps, steps_per_batch=steps_per_batch, events_per_step=events_per_step)
    tmp = Path(tempfile.mkdtemp(prefix="obshub-bench-prof-"))
    with private_stack(common.console.print) as settings:
        tag = f"prof-{uuid.uuid4().hex[:6]}"
        topics = testkit.make_topics(settings, tag, partitions=4)
        port = free_port()
        w = testkit.Worker(topics, f"{tag}-app", 1, tmp / "w.log", window_s=5.0, partitions=4, metrics_port=port)
        try:
            w.wait_ready(120)
            time.sleep(1.0)
            spy_out = tmp / "spy.txt"
            spy = subprocess.Popen(
                [exe, "record", "-p", str(w.proc.pid), "-r", "200", "--nonblocking", "-f", "raw", "-o", str(spy_out)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            cpu0, t0 = cpu_seconds(w.proc.pid), time.monotonic()
            testkit.publish(settings, topics.events, load.messages)
            c = worker_counters([port])
            while c["summaries"] < load.steps and time.monotonic() - t0 < 600:
                time.sleep(0.2)
                c = worker_counters([port])
            cpu = cpu_seconds(w.proc.pid) - cpu0
            spy.send_signal(2)  # SIGINT: py-spy writes what it has
            spy.wait(60)
        finally:
            w.stop()
        samples = classify(spy_out.read_text(errors="replace")) if spy_out.exists() else {}
    total = sum(samples.values()) or 1
    from rich.table import Table

    t = Table(
        title=f"one worker, {load.events:,} events ({hosts} hosts x {steps} steps); py-spy samples by category",
        caption=common.describe_machine(),
    )
    for col in ("category", "samples", "share"):
        t.add_column(col, justify="right" if col != "category" else "left")
    for name, n in sorted(samples.items(), key=lambda kv: -kv[1]):
        t.add_row(name, f"{n:,}", f"{100 * n / total:.1f} %")
    common.console.print(t)
    rate = c["events"] / cpu if cpu > 0 else float("nan")
    common.console.print(
        f"events per CPU-second of the worker: {rate:,.0f} ({c['events']:,.0f} events, {cpu:.2f} CPU s, "
        f"{c['summaries']:.0f} of {load.steps} summaries); {len(load.messages) / cpu if cpu > 0 else 0:,.0f} input "
        f"messages per CPU-second ({load.events / len(load.messages):.0f} events each)"
    )
    result = {
        "hosts": hosts,
        "steps": steps,
        "events": c["events"],
        "cpu_s": cpu,
        "events_per_cpu_s": rate,
        "samples": samples,
        "rev": common.git_rev(),
    }
    common.console.print(f"raw results: {common.save('worker_profile', result)}")
    return result


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m bench.worker_profile [--quick]``."""
    p = argparse.ArgumentParser(
        prog="python -m bench.worker_profile", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="4 hosts x 60 steps")
    p.add_argument("--hosts", type=int, default=None, help="hosts of the load (default 8)")
    p.add_argument("--steps", type=int, default=None, help="steps of the load (default 400)")
    p.add_argument("--steps-per-batch", type=int, default=3, help="steps per input message (default 3)")
    p.add_argument("--events-per-step", type=int, default=64, help="events per host and step (default 64)")
    a = p.parse_args(argv)
    run(a.quick, hosts=a.hosts, steps=a.steps, steps_per_batch=a.steps_per_batch, events_per_step=a.events_per_step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
