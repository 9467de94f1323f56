"""``obshub replay``: replay PyTorch profiler traces through the pipeline and print their diagnosis."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timezone
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from obshub.core import schema
from obshub.core.clitypes import Bootstrap, KafkaName, NonEmpty
from obshub.core.tables import WholeLineConsole, print_table
from obshub.replay.inputs import ReplayInputs, discover
from obshub.replay.publish import KafkaSink, PublishResult, publish
from obshub.replay.report import ReplayReport, StepDiagnosis

EPILOG = """\b
Examples:
  obshub replay ./traces/                         # every rank's trace under ./traces, as fast as possible
  obshub replay ./kineto/ --et ./et/ --job dlrm   # with execution traces (collective sequence ids), job name "dlrm"
  obshub replay ./traces/ --speed recorded        # at the pace the job ran (for rules with `for:` durations)
  obshub replay ./traces/ --speed 10              # ten times faster than recorded
  obshub replay ./traces/ --dry-run               # map and diagnose only, publish nothing
  obshub replay ./traces/ --dry-run --json        # the same as one JSON object, for scripts
"""


def parse_speed(value: str) -> float | None:
    """``fast`` -> None, ``recorded`` -> 1.0, a positive number -> itself. Raises click.BadParameter."""
    v = value.strip().lower()
    if v == "fast":
        return None
    if v == "recorded":
        return 1.0
    try:
        f = float(v)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not 'fast', 'recorded' or a number") from None
    if not f > 0:
        raise click.BadParameter(f"{value!r} must be greater than 0")
    return f


def _default_job(paths: tuple[Path, ...]) -> str:
    p = paths[0].resolve()
    return (p if p.is_dir() else p.parent).name or "replay"


def _iso(ns: int | None) -> str:
    if ns is None:
        return "-"
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).isoformat(timespec="microseconds")


def _ms(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:.3f}"


def summary_dict(job: str, inputs: ReplayInputs, steps: list[StepDiagnosis], res: PublishResult | None) -> dict:
    """The replay's outcome as JSON-ready data (what ``--json`` prints)."""
    return {
        "job": job,
        "coverage": inputs.coverage(),
        "world_size": inputs.world_size,
        "ranks_present": [r.rank for r in inputs.ranks],
        "missing_ranks": inputs.missing_ranks,
        "notes": inputs.notes,
        "ranks": [
            {
                "rank": r.rank,
                "host": r.host,
                "file": str(r.path),
                "pid": r.pid,
                "et": str(r.et.path) if r.et else None,
                "seq_source": r.stats.seq_source,
                "emitted": dict(r.stats.emitted),
                "skipped": dict(r.stats.skipped),
                "notes": r.stats.notes,
            }
            for r in inputs.ranks
        ],
        "steps": [
            {
                "step": s.step,
                "first_collective": s.first_collective,
                "straggler": s.straggler,
                "skew_ns": s.skew_ns,
                "ranks": [dataclasses.asdict(r) for r in s.ranks],
            }
            for s in steps
        ],
        "published": None
        if res is None
        else {"events": res.events, "batches": res.batches, "wall_s": round(res.wall_s, 3)},
    }


def _print(console: Console, d: dict) -> None:
    console.print(f"job [bold]{d['job']}[/bold]: {d['coverage']}")
    for n in d["notes"]:
        console.print(f"  note: {n}")
    t = Table("rank", "file", "events", "skipped", "coll_seq from", title="traces")
    for r in d["ranks"]:
        skipped = sum(r["skipped"].values())
        t.add_row(
            str(r["rank"]), Path(r["file"]).name, str(sum(r["emitted"].values())), str(skipped), r["seq_source"] or "-"
        )
    print_table(console, t)
    for r in d["ranks"]:
        for n in r["notes"]:
            console.print(f"  rank {r['rank']}: {n}")
    reasons: dict[str, int] = {}
    for r in d["ranks"]:
        for k, v in r["skipped"].items():
            reasons[k] = reasons.get(k, 0) + v
    if reasons:
        console.print("skipped: " + "; ".join(f"{v} {k}" for k, v in sorted(reasons.items(), key=lambda x: -x[1])))
    for s in d["steps"]:
        fc = s["first_collective"]
        title = f"step {s['step']}" + (f": first collective {fc[2]} (pg {fc[0]}, seq {fc[1]})" if fc else "")
        t = Table("rank", "step start (UTC)", "step ms", "arrival +ms", "wait ms", "kernel ms", "", title=title)
        first = min((r["first_coll_arrival_ns"] for r in s["ranks"] if r["first_coll_arrival_ns"]), default=None)
        for r in s["ranks"]:
            arr = r["first_coll_arrival_ns"]
            t.add_row(
                r["host"],
                _iso(r["start_ns"]),
                _ms(r["duration_ns"]),
                _ms(arr - first) if arr is not None and first is not None else "-",
                _ms(r["wait_ns"]),
                _ms(r["first_coll_kernel_ns"]),
                "[red]straggler[/red]" if r["straggler"] else "",
            )
        print_table(console, t)
        if s["straggler"]:
            console.print(
                f"step {s['step']}: straggler [bold]{s['straggler']}[/bold] arrived last at the first "
                f"collective, {_ms(s['skew_ns'])} ms after the first rank"
            )
    if d["published"]:
        p = d["published"]
        console.print(
            f"published {sum(p['events'].values())} events in {sum(p['batches'].values())} batches "
            f"from {len(p['events'])} agents in {p['wall_s']} s"
        )


@click.command("replay", epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option(
    "--et",
    "et_paths",
    multiple=True,
    type=click.Path(exists=True, path_type=Path),
    help="execution trace file or folder (repeatable); ETs among PATHS are found by content too",
)
@click.option(
    "--job",
    default=None,
    type=NonEmpty("a job name", schema.MAX_STR_LEN),  # "" is a usage error, not "the folder's name"
    help="job name to publish under (default: the trace folder's name)",
)
@click.option(
    "--speed",
    default="fast",
    show_default=True,
    callback=lambda _ctx, _param, value: parse_speed(value),  # a bad value is a usage error naming --speed
    help="'fast', 'recorded' (the job's own pace) or a speed-up factor such as 10",
)
@click.option("--dry-run", is_flag=True, help="map and diagnose, publish nothing")
@click.option(
    "--bootstrap",
    type=Bootstrap(),
    help="Kafka bootstrap servers (default: the obshub broker)",
)
@click.option(
    "--topic",
    type=KafkaName(max_len=249),
    default=schema.TOPIC_EVENTS,
    show_default=True,
    help="events topic to publish to (another one for an isolated stream app)",
)
@click.option(
    "--max-batch-events",
    default=2000,
    show_default=True,
    type=click.IntRange(1, 100_000),
    help="events per batch at most",
)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of tables")
def replay_command(paths, et_paths, job, speed, dry_run, bootstrap, topic, max_batch_events, as_json):
    """Replay PyTorch profiler (Kineto) traces, one file per rank, through obshub.

    Each rank is published as its own agent (host rank<N>) on the events topic, so `obshub streams
    worker` and the rule engine diagnose the job as if it were live. The replay prints its own
    per-rank table: step start and duration, arrival and wait at the first collective, the straggler.
    A rank set smaller than the job's world size is reported ("2 of 128 ranks present").

    Exit codes: 0 published (or --dry-run); 69 no broker answered (at once when nothing listens at the
    address, else within 2 s), nothing published; 1 any other error (the message says which).
    """
    from obshub.core.settings import load_settings

    speed_f = speed  # parse_speed, by the option's callback
    job = _default_job(paths) if job is None else job
    inputs = discover(list(paths), list(et_paths) or None)  # bad inputs are said before the broker is asked
    sink = None if dry_run else KafkaSink(load_settings(bootstrap=bootstrap).bootstrap_servers, topic)
    report = ReplayReport()
    res = None
    if sink is None:
        publish(inputs, job, lambda _b: None, speed=speed_f, max_events=max_batch_events, observe=report.observe)
    else:
        res = publish(inputs, job, sink, speed=speed_f, max_events=max_batch_events, observe=report.observe)
        sink.close()
    d = summary_dict(job, inputs, report.steps(), res)
    if as_json:
        click.echo(json.dumps(d, indent=1))
    else:
        _print(WholeLineConsole(highlight=False), d)
