"""``obshub demo``: a simulated cluster on this machine, a real fault on one host, and a verdict."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from obshub.core.clitypes import Finite
from obshub.core.settings import load_settings
from obshub.core.tables import WholeLineConsole, print_table
from obshub.demo import cluster as cluster_mod
from obshub.demo.errors import DemoError
from obshub.demo.faults import KINDS
from obshub.demo.runner import DemoOptions, matrix_row, matrix_scenarios, run_demo, run_matrix
from obshub.demo.view import DemoView

EPILOG = """\b
Examples:
  obshub demo                                  # 4 hosts, 8% packet loss on node-01 after 15 s, verdict
  obshub demo --fault cpu --fault-host 2       # a noisy neighbour on node-02's CPUs
  obshub demo --fault none --duration 30       # a clean run: passes only when no alert fires
  obshub demo --fault hang --fault-host 2      # freeze node-02's rank: named, then resolved on thaw
  obshub demo --fault net-slow --param rate_mbit=50   # a 50 Mbit/s link instead of the default
  obshub demo --hosts 3 --json report.json     # also write the machine-readable report
  obshub demo --matrix --json matrix.json      # every fault kind plus none, as a table
  obshub demo --sequence cpu@1,mem@2,hang@3,exit@0 --fault-for 12 --gap 12
                                               # several faults on one training, one verdict each
  obshub demo --fault stall --param layer=cpu --param stall_ms=800 --param period_s=18 --duration 80
                                               # sporadic: an 800 ms CPU burst on node-01 every 18 s;
                                               # every stall must be named (layer: net, cpu, process, mem)
  obshub demo --hosts 2 --ranks-per-host 2 --fault cpu --fault-host 1 --fault-rank 1
                                               # 2 ranks per host; a CPU hog on node-01's local rank 1
  obshub demo --hosts 1 --ranks-per-host 4 --fault hang --fault-rank 2
                                               # a one-node job of 4 ranks: its local rank 2 frozen
  obshub demo --workload lightning --hosts 4 --fault net-loss
                                               # the same fault under a PyTorch Lightning Trainer
  obshub demo --workload accum --fault stall --param layer=net --duration 80
                                               # gradient accumulation (4 micro-batches per step)
  obshub demo --cleanup                        # only remove what a crashed run left behind
"""


def _params(values: tuple[str, ...]) -> dict:
    out = {}
    for kv in values:
        key, sep, val = kv.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{kv!r} is not KEY=VALUE", param_hint="--param")
        if key in out:  # the last one won, silently: `--param layer=net --param layer=cpu` ran a cpu stall
            raise click.BadParameter(
                f"{key} is given twice ({key}={out[key]} and {kv}); give it once", param_hint="--param"
            )
        try:
            out[key] = int(val)
        except ValueError:
            try:
                out[key] = float(val)
            except ValueError:
                out[key] = val
    return out


def _sigterm(*_):
    raise KeyboardInterrupt


MAX_DURATION_S = 86_400.0
"""``--duration``'s bound (s): a day. ``--duration 1e9`` (32 years) was taken and the demo set itself up."""
RANKS_PER_CPU = 8
"""The most training ranks a demo runs per CPU this process may use: every rank is a real torch process
that trains in step with the others (and each host adds an agent), and 16 ranks on 2 cores (4 hosts x 4
ranks) is the most this project has run (docs/BENCHMARKS.md 8: each rank there waits 100-800 ms a step in
the run queue); ``--hosts 16 --ranks-per-host 8`` (128 ranks on 2 cores) was taken."""


def _check_world(hosts: int, ranks_per_host: int, cpus: int | None = None) -> None:
    """Refuse a world (``hosts`` x ``ranks_per_host`` ranks) over ``RANKS_PER_CPU`` per CPU of this
    process's (``cpus``: default ``os.sched_getaffinity``). Raises click.UsageError (exit 2) saying the
    limit and why."""
    import os

    cpus = cpus if cpus is not None else len(os.sched_getaffinity(0))
    world, limit = hosts * ranks_per_host, RANKS_PER_CPU * max(1, cpus)
    if world > limit:
        raise click.UsageError(
            f"--hosts {hosts} x --ranks-per-host {ranks_per_host} = {world} ranks: this machine runs at most "
            f"{limit} ({RANKS_PER_CPU} per CPU, {cpus} CPU(s)): every rank is a real torch process training in "
            f"step with the others, and {RANKS_PER_CPU} per CPU is the most run here; lower --hosts or "
            "--ranks-per-host"
        )


@click.command("demo", epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--hosts",
    type=click.IntRange(1, 16),
    default=4,
    show_default=True,
    help="simulated hosts (1: a one-node job, with --ranks-per-host 2..8 and a --fault-rank)",
)
@click.option(
    "--fault",
    type=click.Choice(KINDS),
    default="net-loss",
    show_default=True,
    help="what to inject (network: net-slow, net-loss; sched: cpu; memory: mem; process: hang (the host's ranks frozen), exit (the host's ranks killed); stall: sporadic stalls of one layer, see --param; none)",
)
@click.option(
    "--fault-host", type=int, default=None, help="host index that gets the fault  [default: 1; 0 with --hosts 1]"
)
@click.option(
    "--ranks-per-host",
    type=click.IntRange(1, 8),
    default=1,
    show_default=True,
    help="training ranks per host namespace (global rank = host x R + local rank; world = hosts x R)",
)
@click.option(
    "--fault-rank",
    type=int,
    default=None,
    help="local rank of the faulty host that the cpu or hang fault (or a cpu / process stall) hits alone "
    "(its peers on the host run on)",
)
@click.option(
    "--fault-at",
    type=Finite(min=0),
    default=15.0,
    show_default=True,
    help="seconds after the first training step on every host",
)
@click.option(
    "--duration",
    type=Finite(min=0, min_open=True, max=MAX_DURATION_S),
    default=45.0,
    show_default=True,
    help=f"seconds of training after the first step, at most {MAX_DURATION_S:.0f} (24 h)",
)
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=None,
    help="stop the ranks after this many steps instead (with a fault at least 11: the worker names nothing "
    "before the job's baseline holds 10 steps; and enough steps to train past --fault-at)",
)
@click.option(
    "--settle",
    type=Finite(min=0),
    default=8.0,
    show_default=True,
    help="seconds to wait for late alerts after training",
)
@click.option(
    "--param",
    "params",
    multiple=True,
    metavar="KEY=VALUE",
    help="fault size, a positive number, only those the fault reads (others are refused): percent (net-loss, default 8); rate_mbit, burst_kb, latency_ms "
    "(net-slow: 24, 32, 100); procs (cpu); room_mb, hog_anon_mb, file_mb (mem: 48, 24, 256); stall: layer "
    "(net, cpu, process or mem; default net), stall_ms (800), period_s (18), procs (cpu), room_mb (mem: 64; 16 with full), full (mem: 1 = fill the cgroup, an anonymous burst), "
    "loss_pct (net: a loss burst of that percent instead of a blackout), delay_ms (net: an RTT spike instead, "
    "tc netem) or rate_kbit (net: an RTT spike with tc tbf at that rate); shape (cpu: burst, outside or "
    "quota) and quota_us (cpu, shape=quota: 1000); stall_ms shorter than period_s",
)
@click.option(
    "--workload",
    type=click.Choice(["ddp", "lightning", "accum"]),
    default="ddp",
    show_default=True,
    help="the training every rank runs: ddp (obshub.workloads.ddp_train, a plain DDP loop), lightning "
    "(lightning_train: PyTorch Lightning's Trainer, DDP strategy, sync_dist logging) or accum (accum_train: "
    "4 micro-batches per optimizer step, DDP no_sync on the first 3); a step is an optimizer step",
)
@click.option("--hidden", type=click.IntRange(min=1), default=None, help="the workload's MLP width (default: its own)")
@click.option(
    "--step-sleep-ms",
    type=Finite(min=0),
    default=50.0,
    show_default=True,
    help="the workload's simulated data loading per optimizer step (leaves the 2-core box some idle time)",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="write the report (or the matrix) as JSON here ('-' = stdout)",
)
@click.option("--matrix", is_flag=True, help="run every fault kind plus none on --fault-host")
@click.option(
    "--sequence",
    default="",
    metavar="KIND@HOST,...",
    help="several faults one after the other on one training (exit only last), e.g. cpu@1,hang@2; "
    "stall:LAYER@HOST for sporadic stalls of one layer (net, cpu, process, mem)",
)
@click.option(
    "--fault-for",
    type=Finite(min=0, min_open=True),
    default=12.0,
    show_default=True,
    help="with --sequence: seconds each fault stays injected",
)
@click.option(
    "--gap",
    type=Finite(min=0),
    default=12.0,
    show_default=True,
    help="with --sequence: seconds between a fault's removal and the next one",
)
@click.option("--keep-stack", is_flag=True, help="leave the Kafka broker running at the end")
@click.option(
    "--lock-wait",
    type=Finite(min=0),
    default=0.0,
    show_default=True,
    help="seconds to wait for another demo on this machine to finish (the namespaces are global)",
)
@click.option(
    "--cleanup", is_flag=True, help="only remove leftovers of a previous run, then exit (with --lock-wait alone)"
)
def demo_command(
    hosts,
    fault,
    fault_host,
    ranks_per_host,
    fault_rank,
    fault_at,
    duration,
    steps,
    settle,
    params,
    workload,
    hidden,
    step_sleep_ms,
    json_path,
    matrix,
    sequence,
    fault_for,
    gap,
    keep_stack,
    lock_wait,
    cleanup,
):
    """Simulate a multi-host training cluster on this machine, inject a real fault on one host, and
    check that obshub names the host and the layer.

    Each host is a network namespace (10.77.0.0/24 on bridge obshub-br0) with its own cgroups, running
    --ranks-per-host ranks (default 1) of a gloo DDP training under `obshub run` and its own `obshub
    agent`; one Kafka broker, the stream worker and the rule engine with the builtin rules serve them all.
    Needs root.

    Exit code 0 only when the right host and layer were named and nothing wrong fired (with
    --fault none: when nothing fired); with --matrix or --sequence, when every scenario passed. 1: the
    verdict failed, or an error (an `error:` line says which; everything set up is removed); 2: bad
    options, refused before anything is set up; 130: interrupted (everything set up is removed)."""
    settings = load_settings()
    console = WholeLineConsole(stderr=True, highlight=False)
    if cleanup:
        _check_cleanup_options()
        c = cluster_mod.Cluster(2, progress=lambda m: console.print(f"demo: {m}"), lock_wait_s=lock_wait)
        c.lock()
        try:
            removed = cluster_mod.sweep(progress=lambda m: console.print(f"demo: {m}"))
        finally:
            c.unlock()
        console.print("removed: " + ", ".join(removed) if removed else "nothing to clean up")
        return
    _check_run_options(matrix, sequence, json_path)
    _check_world(hosts, ranks_per_host)
    if fault == "none" and not matrix and not sequence.strip() and fault_host is not None:
        # a clean run injects nothing: a host given for its fault was silently ignored (newuser20)
        raise click.UsageError(
            "--fault-host with --fault none: a clean run injects no fault, so there is no host to fault; drop "
            "--fault-host, or choose a fault (--fault cpu ...)"
        )
    if fault_host is None:
        fault_host = 1 if hosts > 1 else 0
    opts = DemoOptions(
        hosts=hosts,
        fault=fault,
        fault_host=fault_host,
        ranks_per_host=ranks_per_host,
        fault_rank=fault_rank,
        fault_at_s=fault_at,
        duration_s=duration,
        steps=steps,
        settle_s=settle,
        workload=workload,
        hidden=hidden,
        step_sleep_ms=step_sleep_ms,
        fault_params=_params(params),
        keep_stack=keep_stack,
        lock_wait_s=lock_wait,
        sequence=_sequence(sequence),
        fault_for_s=fault_for,
        gap_s=gap,
    )
    try:
        for o in matrix_scenarios(opts) if matrix else [opts]:
            o.check()
    except DemoError as exc:  # options that do not fit together or are out of range: a usage error (exit 2)
        raise click.UsageError(f"{exc}; {exc.hint}" if exc.hint else str(exc)) from None
    old = signal.signal(signal.SIGTERM, _sigterm)
    try:
        names = [
            f"node-{i:02d}" if ranks_per_host == 1 else f"node-{i:02d}/r{i * ranks_per_host + lr}"
            for i in range(hosts)
            for lr in range(ranks_per_host)
        ]
        with DemoView(console, names) as view:
            if matrix:
                rows = run_matrix(opts, settings, view)
            else:
                report = run_demo(opts, settings, view)
        if matrix:
            _print_matrix(console, rows)
            _write(json_path, {"matrix": rows})
            sys.exit(0 if rows and all(r["ok"] for r in rows) else 1)
        from obshub.demo.verdict import Verdict

        if "episodes" in report:
            _print_episodes(console, report["episodes"])
            _write(json_path, report)
            sys.exit(0 if all(ep["verdict"]["ok"] for ep in report["episodes"]) else 1)
        v = Verdict(**{k: val for k, val in report["verdict"].items() if k != "wrong_count"})
        view.verdict(v, report["scenario"]["fault_host_name"])
        w = report["webhook"]
        console.print(
            f"  webhook receiver: {w['requests']} requests {w['by_service']} -> {w['file']}"
            + (f", [red]{len(w['invalid'])} invalid[/red]" if w["invalid"] else "")
        )
        console.print(f"  logs and report: {report['logs']}")
        _write(json_path, report)
        sys.exit(0 if v.ok else 1)
    finally:
        signal.signal(signal.SIGTERM, old)


def _check_cleanup_options() -> None:
    """Refuse options beside --cleanup other than --lock-wait: a cleanup removes what any earlier run left
    (every demo namespace, cgroup, nftables table and broker) and runs nothing, so a --hosts or --fault given
    with it would be silently ignored. Raises click.UsageError (exit 2)."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    given = [
        f"--{p.name.replace('_', '-')}"
        for p in ctx.command.params
        if p.name not in ("cleanup", "lock_wait") and ctx.get_parameter_source(p.name) is not ParameterSource.DEFAULT
    ]
    if given:
        raise click.UsageError(
            f"{', '.join(given)} with --cleanup: a cleanup only removes what earlier runs left behind and runs "
            "nothing; drop them (only --lock-wait applies), or run the demo without --cleanup"
        )


def _check_run_options(matrix: bool, sequence: str, json_path: Path | None) -> None:
    """Refuse, before anything is set up, options that one kind of run would ignore and a --json path
    that could not be written at the end (minutes later). Raises click.UsageError / BadParameter (exit 2)."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    given = [
        f"--{name.replace('_', '-')}"
        for name in ("fault", "fault_host")
        if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT
    ]
    if matrix and sequence:
        raise click.UsageError("--matrix and --sequence are two kinds of run: choose one")
    if sequence and given:
        raise click.UsageError(
            f"{' and '.join(given)} with --sequence: the sequence names each fault and host (KIND@HOST,...); "
            f"drop {' and '.join(given)}"
        )
    if matrix and "--fault" in given:
        raise click.UsageError("--fault with --matrix: the matrix runs every fault kind; drop --fault")
    if sequence.strip() and not _sequence(sequence):
        raise click.BadParameter(f"{sequence!r} holds no KIND@HOST, e.g. cpu@1,hang@2", param_hint="--sequence")
    if json_path is not None and str(json_path) != "-":
        folder = json_path.resolve().parent
        if not folder.is_dir():
            raise click.BadParameter(
                f"{json_path}: its folder {folder} does not exist (the report is written at the end of the run)",
                param_hint="'--json'",
            )


def _write(path: Path | None, obj) -> None:
    if path is None:
        return
    text = json.dumps(obj, indent=2, default=str)
    if str(path) == "-":
        click.echo(text)
    else:
        path.write_text(text + "\n")


def _sequence(text: str) -> list[tuple[str, int]]:
    """``"cpu@1,hang@2"`` -> ``[("cpu", 1), ("hang", 2)]``; raises click.BadParameter naming the bad item."""
    out = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        kind, _, host = item.partition("@")
        if not host.isdigit():
            raise click.BadParameter(f"{item!r}: expected KIND@HOST, e.g. cpu@1", param_hint="--sequence")
        out.append((kind, int(host)))
    return out


def _print_episodes(console: Console, eps: list[dict]) -> None:
    t = Table(
        "fault",
        "host",
        "detected host",
        "layer",
        "time to detection",
        "wrong alerts",
        "result",
        title="obshub demo --sequence",
    )
    for ep in eps:
        v = ep["verdict"]
        fc = v.get("first_correct") or {}
        ttd = f"{v['ttd_s']:.2f} s" if v.get("ttd_s") is not None else "-"
        if v.get("stalls") and v.get("ttd_s") is not None:  # sporadic stalls: ttd_s is their median
            ttd = f"median {v['ttd_s']:.2f} s" + (
                f", worst {v['worst_s']:.2f} s" if v.get("worst_s") is not None else ""
            )
        t.add_row(
            ep["kind"],
            ep["host"] or "-",
            fc.get("host") or "-",
            fc.get("layer") or "-",
            ttd,
            str(v["wrong_count"]),
            "[green]pass[/green]" if v["ok"] else "[red]fail[/red]",
        )
    print_table(console, t)
    for ep in eps:
        console.print(f"  {ep['kind']} on {ep['host']}: {ep['verdict']['reason']}")


def _print_matrix(console: Console, rows: list[dict]) -> None:
    t = Table(
        "fault",
        "host",
        "detected host",
        "layer",
        "time to detection",
        "wrong alerts",
        "result",
        title="obshub demo --matrix",
    )
    for r in rows:
        ttd = f"{r['ttd_s']:.2f} s" if r["ttd_s"] is not None else "-"
        t.add_row(
            r["fault"],
            r["host"],
            r["detected_host"],
            r["layer"],
            ttd,
            str(r["wrong_alerts"]),
            "[green]pass[/green]" if r["ok"] else "[red]fail[/red]",
        )
    print_table(console, t)
    for r in rows:
        console.print(f"  {r['fault']}: {r['reason']}")


__all__ = ["demo_command", "matrix_row", "DemoError"]
