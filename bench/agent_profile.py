"""Where the agent's own CPU goes while it follows a training: the workload of bench/training_overhead.py
(a 2-rank gloo DDP training under ``obshub run``) with ``obshub agent --registered`` attached (every probe,
or ``--probes``), shipping to a private broker. Over the steady-state window (rank 0's step ``warmup`` to
its last step) it prints, per thread of the agent (by ``comm``: the Python main thread, librdkafka's
``rdk:*`` threads, the metrics server, the exit watcher): CPU ms per second (``/proc/<pid>/task/<tid>/
schedstat``, ns on CPU) and wakeups per second (``voluntary_ctxt_switches`` + ``nonvoluntary_ctxt_switches``
of ``/proc/<pid>/task/<tid>/status``). With ``--py-spy`` it also records the agent with py-spy over the
window (``--idle --nonblocking``, raw collapsed stacks to ``--py-spy-out``) and prints the top frames.

    python -m bench.agent_profile                       # every probe, 400 steps
    python -m bench.agent_profile --probes pytorch --steps 300 --py-spy

Needs root and bcc (the BPF probes), like bench/training_overhead.py; run it under the heavy lock.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.broker import obshub_cmd, private_stack
from bench.training_overhead import WORKLOAD, AgentRun, run_ranks


def thread_counters(pid: int) -> dict[int, tuple[str, int, int]]:
    """{tid: (comm, ns on CPU, context switches)} of every live thread of ``pid`` (schedstat, status)."""
    out = {}
    for task in os.scandir(f"/proc/{pid}/task"):
        try:
            comm = Path(task.path, "comm").read_text().strip()
            ns = int(Path(task.path, "schedstat").read_text().split()[0])
            sw = 0
            for line in Path(task.path, "status").read_text().splitlines():
                if line.endswith("ctxt_switches:") or "ctxt_switches:" in line:
                    sw += int(line.split()[1])
            out[int(task.name)] = (comm, ns, sw)
        except (OSError, ValueError, IndexError):
            continue
    return out


def per_thread(a: dict, b: dict, seconds: float) -> list[tuple[str, float, float]]:
    """(comm, CPU ms/s, switches/s) per thread name from two :func:`thread_counters` snapshots."""
    acc: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for tid, (comm, ns, sw) in b.items():
        _c, ns0, sw0 = a.get(tid, (comm, 0, 0))
        acc[comm][0] += (ns - ns0) / 1e6 / seconds
        acc[comm][1] += (sw - sw0) / seconds
    return sorted(((c, v[0], v[1]) for c, v in acc.items()), key=lambda r: -r[1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.agent_profile", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--probes", default=None, help="the agent's --probes (default: every probe)")
    p.add_argument("--py-spy", action="store_true", help="record the agent with py-spy over the window")
    p.add_argument("--py-spy-out", default="/tmp/obshub-agent-profile.txt")
    p.add_argument("--cprofile", default=None, help="run the agent under cProfile, stats to this file")
    p.add_argument("--perf", default=None, help="also record the agent with `perf record -g` to this file")
    args = p.parse_args(argv)
    res: dict = {}
    if args.cprofile:
        import bench.training_overhead as to

        def cmd(*a: str) -> list[str]:
            base = obshub_cmd(*a)
            return [base[0], "-m", "cProfile", "-o", args.cprofile, "-m", *base[2:]] if a[0] == "agent" else base

        to.obshub_cmd = cmd
    with private_stack(print):
        agent = AgentRun("bench-profile", args.probes)
        pid = agent.proc.pid
        marks: dict = {}
        spy: list[subprocess.Popen] = []

        def on_warm() -> None:
            marks["t0"], marks["a"] = time.monotonic(), thread_counters(pid)
            if args.py_spy:
                exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
                spy.append(
                    subprocess.Popen(
                        [exe, "record", "--pid", str(pid), "--idle", "--nonblocking", "--threads", "-r", "200"]
                        + ["--format", "raw", "-o", args.py_spy_out, "-d", "3600"],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
            if args.perf:
                spy.append(
                    subprocess.Popen(
                        ["perf", "record", "-F", "1999", "-g", "-p", str(pid), "-o", args.perf],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )

        def on_last() -> None:
            marks["t1"], marks["b"] = time.monotonic(), thread_counters(pid)
            for s in spy:
                s.send_signal(2)

        try:
            res = run_ranks(
                obshub_cmd("run", "--job", "bench-profile", "--"), WORKLOAD, args.steps, args.warmup, on_warm, on_last
            )
        finally:
            for s in spy:
                s.wait(30)
            agent.stop()
    secs = marks["t1"] - marks["t0"]
    print(
        f"window {secs:.1f} s, median step {res['median_ms']:.2f} ms, ranks' CPU {res['cpu_ns_per_step'] / 1e6:.2f} ms/step"
    )
    rows = per_thread(marks["a"], marks["b"], secs)
    print(f"agent total: {sum(r[1] for r in rows):.2f} ms CPU/s, {sum(r[2] for r in rows):.1f} switches/s")
    for comm, ms, sw in rows:
        print(f"  {comm:<20} {ms:8.2f} ms/s {sw:8.1f} switches/s")
    if args.py_spy and Path(args.py_spy_out).exists():
        own: collections.Counter = collections.Counter()
        total = 0
        for line in Path(args.py_spy_out).read_text().splitlines():
            stack, _, n = line.rpartition(" ")
            if not n.isdigit():
                continue
            total += int(n)
            frames = stack.split(";")
            own[frames[-1]] += int(n)
        print(f"py-spy: {total} samples; top leaf frames:")
        for f, n in own.most_common(25):
            print(f"  {n:6d} {f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
