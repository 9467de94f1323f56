"""``python -m bench``: obshub's benchmarks, side by side, each printing its table (median, spread,
ratio), the machine it ran on and its verdicts against the targets; raw results in bench/results/.

    python -m bench                                  # every benchmark, default rounds (make bench)
    python -m bench training_overhead                # one benchmark
    python -m bench rules_throughput agent_throughput --quick   # some, as smoke runs (tiny sizes)
    python -m bench ttd --rounds 3                   # the demo matrix 3 times
    python -m bench --list                           # names and what each measures

Each benchmark starts what it needs (a private Kafka broker on free ports in a temporary home, workers,
agents) and stops it again. A benchmark that fails is reported and the others still run. Exit codes: 0
every benchmark completed and met its targets; 1 a benchmark failed or missed a target (``--quick``: smoke
runs, whose misses are printed but not counted); 2 bad arguments. ``scale`` reads the other benchmarks'
latest results, so it runs last.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
import traceback

from bench import common

# run order: cheap and self-contained first; scale last (it reads the others' results)
BENCHMARKS: dict[str, str] = {
    "training_overhead": "step time of a 2-rank gloo DDP job: plain, obshub run, + agent, torch.profiler",
    "agent_throughput": "largest lossless ring buffer -> Kafka event rate of the agent on one core",
    "stream_throughput": "events/s per Faust worker (1 and 2 workers) vs a plain confluent-kafka loop",
    "fold_width": "stream join CPU and changelog bytes per step vs hosts (8-2,048), beside summarize",
    "summary_size": "bytes of one step summary at 128-4,096 hosts vs the broker's 1 MB message limit",
    "rules_throughput": "rule evaluations/s of the builtin pack on recorded summaries and events",
    "ttd": "time to detection per fault kind over N runs of obshub demo --matrix",
    "width": "one job of 8-2,048 hosts at 1 s steps through broker, stream worker and rule engine",
    "scale": "events/s, Kafka bandwidth, workers for 1,024 and 16,384 GPUs; 128-host replay check",
}


def main(argv: list[str] | None = None) -> int:
    """Run the named benchmarks (all by default); returns 0 when every one completed and met its targets,
    1 when one failed or (without ``--quick``) missed a target; exits 2 on bad arguments (argparse)."""
    p = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("names", nargs="*", metavar="NAME", help=f"benchmarks to run: {', '.join(BENCHMARKS)}")
    p.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, one round")
    p.add_argument(
        "--rounds",
        type=common.positive_int,
        default=None,
        metavar="N",
        help="rounds per benchmark, 1 or more (default: each one's own; summary_size, width and scale run one pass)",
    )
    p.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    a = p.parse_args(argv)
    if a.list:
        for name, what in BENCHMARKS.items():
            print(f"{name:<18} {what}")
        return 0
    unknown = [n for n in a.names if n not in BENCHMARKS]
    if unknown:
        p.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}")
    names = [n for n in BENCHMARKS if n in a.names] if a.names else list(BENCHMARKS)
    common.console.print(
        f"[bold]obshub benchmarks[/bold] at {common.git_rev()}: {', '.join(names)}"
        f"{' (quick)' if a.quick else ''}\n{common.describe_machine()}"
    )
    failed, times = [], {}
    t_all = time.monotonic()
    for name in names:
        t0 = time.monotonic()
        try:
            importlib.import_module(f"bench.{name}").run(quick=a.quick, rounds=a.rounds)
        except KeyboardInterrupt:
            common.console.print(f"[red]{name}: interrupted[/red]")
            return 130
        except Exception as exc:  # one broken benchmark must not hide the others' tables
            failed.append(name)
            common.console.print(f"[red]{name} failed: {type(exc).__name__}: {exc}[/red]")
            common.console.print(f"[dim]{traceback.format_exc()[-2500:]}[/dim]")
        times[name] = time.monotonic() - t0
    if not a.quick:
        from bench import summary

        common.console.rule("[bold]targets at a glance[/bold] (python -m bench.summary)")
        common.console.print(summary.markdown(), markup=False)
    common.console.print(
        "durations: "
        + ", ".join(f"{k} {v:.0f} s" for k, v in times.items())
        + f"; total {time.monotonic() - t_all:.0f} s"
    )
    if failed:
        common.console.print(f"[red]failed: {', '.join(failed)}[/red]")
        return 1
    if common.exit_code(a.quick):
        common.console.print(f"[red]targets missed: {'; '.join(common.MISSED)}[/red]")
    return common.exit_code(a.quick)


if __name__ == "__main__":
    sys.exit(main())
