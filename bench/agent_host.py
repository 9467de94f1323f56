"""The agent process of bench/agent_throughput.py: obshub's own :class:`producer.agent.Agent` (the class
behind ``obshub agent``) reading a real :class:`producer.loader.BpfEventSource` with only the
``pytorch_step`` probe, attached to the USDT probes of a given executable (bench/firehose.c) and watching
one pid, publishing to the broker of ``$OBSHUB_HOME``/``$OBSHUB_KAFKA_PORT``.

It exists because ``obshub agent`` has no option to point the USDT probes at another binary than
``obshub.instrument._usdt``; everything else (batcher, transport, metrics, shutdown) is the agent's own code.
It pins itself to one CPU (``--cpu``), serves Prometheus metrics on ``--metrics-port`` and runs until
SIGTERM; exit code as ``obshub agent`` (0: everything delivered).

With ``--burst`` it also attaches bench/firehose_burst.c (appended to the agent's BPF program) to the
executable's ``fire_burst``: one uprobe hit emits up to 64 ``STEP_BEGIN`` records through the same ring
buffer, reservation and loss counter as the USDT handler.

    python -m bench.agent_host --usdt /tmp/firehose --pid 1234 --cpu 0 --metrics-port 9464 [--burst] [--ringbuf-pages 4096 --host h2]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """Build and run the agent; returns its exit code."""
    p = argparse.ArgumentParser(
        prog="python -m bench.agent_host", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--usdt", required=True, type=Path, help="executable or library with the obshub USDT probes")
    p.add_argument("--pid", required=True, type=int, help="process to watch")
    p.add_argument("--cpu", type=int, default=None, help="pin this process to this CPU")
    p.add_argument("--metrics-port", type=int, required=True)
    p.add_argument(
        "--ringbuf-pages", type=int, default=16384, help="ring buffer size, 4 KiB pages (default 64 MiB, the agent's)"
    )
    p.add_argument("--host", default="bench-firehose", help="the agent's host name (and spool folder)")
    p.add_argument(
        "--burst",
        action="store_true",
        help="also attach bench/firehose_burst.c to the executable's fire_burst (n records per call)",
    )
    a = p.parse_args(argv)
    if a.cpu is not None:
        os.sched_setaffinity(0, {a.cpu})

    from obshub.core.settings import agent_config, load_settings
    from obshub.producer.agent import Agent
    from obshub.producer.loader import BpfEventSource
    from obshub.producer.probes import ProbeOptions, Target

    settings = load_settings()
    cfg = agent_config(
        job="bench-agent",
        host=a.host,
        host_id=7,
        kafka=dict(bootstrap=settings.bootstrap_servers),
        spool=dict(dir=settings.home / "spool" / a.host),
        metrics_port=a.metrics_port,
        flush_timeout_s=30.0,
    )

    class Source(BpfEventSource):
        def start(self):
            table = super().start()
            if a.burst:
                self.attach_uprobe(a.usdt, "fire_burst", "obs_bench_burst")
            return table

    src = Source(
        settings,
        Target(pids={a.pid}),
        ProbeOptions(probes=("pytorch_step",), usdt_library=a.usdt, sysfs=False, ringbuf_pages=a.ringbuf_pages),
    )
    if a.burst:
        src.extra_source = (Path(__file__).resolve().parent / "firehose_burst.c").read_text()
    return Agent(cfg, src, settings=settings).run()


if __name__ == "__main__":
    sys.exit(main())
