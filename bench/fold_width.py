"""Fold cost per step against the job's width: CPU and changelog bytes of the stream worker's join for one
step of a job of 8 .. 2,048 hosts, side by side with ``streams.analysis.summarize`` (the floor).

What runs: the worker's own ingest and fold code (``streams.inproc``: ``Ingest`` + ``Fold`` over tables
that encode every write with the worker's codec, as Faust writes a changelog record) on batches of the
stream benchmark's shape (bench/loadgen.py: 64 events per host-step, 3 steps per batch, so one part per
host and step). Each host's first batch (its registration and steps 0..2) is fed first and not counted. The
input is taken in rounds of ``--round-messages`` messages (default: a quarter of the hosts, so each
step's parts arrive over 4 rounds, as in a worker whose 100 ms rounds see a 1 s step's batches arrive
over a few hundred ms): a round's parts go to the fold as one ``batch`` message per partition, applied
as one unit (``Fold.apply_round``), as the worker does; ``--round-messages 1`` applies every part as a
unit of its own. The process's garbage collector is tuned as the worker's (``streams.app.tune_gc``). Per
width, per step:

- ``ingest``: decode + validate + reduce of the batches (``streams.wire``, ``streams.accumulate``);
- ``fold``: every table operation of the fold agent and its codec, the close and ``summarize`` included
  (the issue's "open table + codec"); ``summarize``: the analysis alone, measured inside the fold;
- ``changelog``: bytes (keys + values) and records written to the tables' changelogs;
- ``previous layout``: the layout this one replaced (one ``open`` entry per step holding every host,
  rewritten and JSON-encoded on every part), replayed on the same parts, up to ``--old-max`` hosts (it
  grows with hosts², 122 s per step at 2,048).

The growth exponent is the least-squares slope of log(cost) over log(hosts): 1 = linear. Targets: fold
<= 100 ms CPU per step at 2,048 hosts, and exponents of the fold CPU and changelog bytes <= 1.15.

    python -m bench.fold_width                    # 8 .. 2,048 hosts, 3 rounds
    python -m bench.fold_width --quick            # 8 .. 256 hosts, 1 round
    python -m bench.fold_width --hosts 64 512     # chosen widths
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

from rich.table import Table

from bench import common, loadgen
from obshub.core import schema
from obshub.streams import accumulate, analysis, fold, wire
from obshub.streams.inproc import InProcess

WIDTHS = (8, 32, 128, 512, 2048)
QUICK_WIDTHS = (8, 32, 128, 256)
STEPS = 6
ROUNDS = 3
OLD_MAX = 256
TARGET_FOLD_MS_2048 = 100.0
TARGET_EXPONENT = 1.15


WARMUP_STEPS = 3  # the first batch of every host (its registration and steps 0..2) is fed before measuring


def _is_warmup(value: bytes) -> bool:
    return any(e.step < WARMUP_STEPS for e in schema.decode_batch(value).events)


def _timed_summarize(acc_s: list[float]):
    real = analysis.summarize

    def wrapper(*a, **kw):
        t0 = time.process_time()
        try:
            return real(*a, **kw)
        finally:
            acc_s.append(time.process_time() - t0)

    return wrapper


ROUNDS_PER_STEP = 4  # default: a step's parts arrive over this many rounds


def measure_new(load: loadgen.Load, partitions: int = 8, round_messages: int = 0) -> dict:
    """One run of the current layout over ``load``, input taken in rounds of ``round_messages`` messages
    (0: hosts / ``ROUNDS_PER_STEP``; 1: every part its own unit): CPU seconds and changelog bytes, per
    step."""
    round_messages = round_messages or max(1, load.hosts // ROUNDS_PER_STEP)
    pipe = InProcess(partitions=partitions)
    regs = [v for _k, v in load.messages if _is_warmup(v)]
    rest = [v for _k, v in load.messages if not _is_warmup(v)]
    for v in regs:
        pipe.feed(v)
    b0 = pipe.changelog_bytes
    r0 = sum(t.records for t in pipe.tables.values())
    n0 = pipe.internal
    summ: list[float] = []
    fold.analysis.summarize = _timed_summarize(summ)
    t_ingest = t_fold = 0.0
    internal_bytes = 0
    try:
        for i in range(0, len(rest), max(1, round_messages)):
            t0 = time.process_time()
            parts = [x for v in rest[i : i + max(1, round_messages)] for x in pipe.parts_of(v)]
            t1 = time.process_time()
            if round_messages <= 1:
                for msg, p in parts:
                    pipe._apply(msg, p)
            else:
                per: dict[int, list[bytes]] = {}
                for msg, p in parts:
                    per.setdefault(p, []).append(wire.packb(msg))
                for p, msgs in sorted(per.items()):
                    pipe._apply({"t": "batch", "msgs": msgs}, p)
            t2 = time.process_time()
            t_ingest += t1 - t0
            t_fold += t2 - t1
            internal_bytes += sum(len(wire.packb(m)) for m, _p in parts)
    finally:
        fold.analysis.summarize = analysis.summarize
    steps = load.steps - WARMUP_STEPS
    assert len(pipe.summaries) == load.steps, f"{len(pipe.summaries)} of {steps} steps summarised"
    return {
        "ingest_s": t_ingest / steps,
        "fold_s": t_fold / steps,
        "summarize_s": sum(summ) / steps,
        "changelog_bytes": (pipe.changelog_bytes - b0) / steps,
        "changelog_records": (sum(t.records for t in pipe.tables.values()) - r0) / steps,
        "internal_msgs": (pipe.internal - n0) / steps,
        "internal_bytes": internal_bytes / steps,
    }


def measure_old(load: loadgen.Load) -> dict:
    """The replaced layout on the same parts: per part, merge into the step's single ``open`` entry (all
    hosts) and JSON-encode the whole entry, as its changelog write did. Returns CPU s and bytes per step."""
    pipe = InProcess(partitions=1)
    parts = []
    for _k, v in load.messages:
        if not _is_warmup(v):
            parts.extend(m for m, _p in pipe.parts_of(v) if m["t"] == "part")
    open_t: dict[str, dict] = {}
    nbytes = 0
    t0 = time.process_time()
    for v in parts:
        key = f"{v['job']}|{v['step']}"
        st = open_t.get(key)
        if st is None:
            st = open_t[key] = {
                "job": v["job"],
                "step": v["step"],
                "p": 0,
                "opened_ns": 0,
                "hosts": {},
                "bids": [],
                "q": dict.fromkeys(fold.QUALITY_KEYS, 0),
            }
        st["bids"].append(v["bid"])
        if v["host"] in st["hosts"]:
            accumulate.merge(st["hosts"][v["host"]], v["acc"])
        else:
            st["hosts"][v["host"]] = v["acc"]
        nbytes += len(json.dumps(key)) + len(json.dumps(st, default=accumulate.to_dict))  # accumulators as dicts
    cpu = time.process_time() - t0
    steps = load.steps - WARMUP_STEPS
    return {"fold_s": cpu / steps, "changelog_bytes": nbytes / steps}


def exponent(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log(y) over log(x) (the growth exponent); nan with fewer than 2 points."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y > 0]
    if len(pts) < 2:
        return float("nan")
    mx = statistics.mean(p[0] for p in pts)
    my = statistics.mean(p[1] for p in pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / den


def run(
    quick: bool = False,
    rounds: int | None = None,
    widths: tuple[int, ...] | None = None,
    old_max: int = OLD_MAX,
    round_messages: int = 0,
) -> dict:
    """Measure, print the table, the exponents and the verdicts, save the JSON. Returns the results."""
    rounds = rounds or (1 if quick else ROUNDS)
    widths = tuple(widths or (QUICK_WIDTHS if quick else WIDTHS))
    from obshub.streams.app import (
        tune_gc,  # the worker's garbage-collector settings (imports Faust: not at module load)
    )

    tune_gc()
    common.console.rule("[bold]fold width[/bold]: join CPU and changelog bytes per step vs hosts")
    rows: dict[int, dict] = {}
    for hosts in widths:
        load = loadgen.build(hosts, STEPS + WARMUP_STEPS, job=f"w{hosts}")
        samples = []
        for r in range(rounds):
            common.console.print(f"[dim]  {hosts} hosts, round {r + 1}/{rounds}[/dim]")
            samples.append(measure_new(load, round_messages=round_messages))
        row = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
        if hosts <= old_max:
            row["old"] = measure_old(load)
        rows[hosts] = row
    t = Table(
        title="per step of a job (64 events per host-step; input in rounds of "
        + (f"{round_messages} message(s)" if round_messages else f"hosts / {ROUNDS_PER_STEP} messages")
        + f"; median of {rounds} round(s))",
        caption=common.describe_machine(),
    )
    for col in (
        "hosts",
        "ingest ms",
        "fold ms",
        "summarize ms",
        "fold / summarize",
        "changelog KB",
        "records",
        "internal KB",
        "previous layout: fold ms",
        "previous: changelog KB",
    ):
        t.add_column(col, justify="right")
    for hosts, r in rows.items():
        old = r.get("old")
        t.add_row(
            f"{hosts:,}",
            f"{r['ingest_s'] * 1e3:.2f}",
            f"{r['fold_s'] * 1e3:.2f}",
            f"{r['summarize_s'] * 1e3:.2f}",
            f"{r['fold_s'] / r['summarize_s']:.1f}" if r["summarize_s"] else "",
            f"{r['changelog_bytes'] / 1e3:,.1f}",
            f"{r['changelog_records']:,.0f}",
            f"{r['internal_bytes'] / 1e3:,.1f}",
            f"{old['fold_s'] * 1e3:,.1f}" if old else "-",
            f"{old['changelog_bytes'] / 1e3:,.0f}" if old else "-",
        )
    common.console.print(t)
    hs = list(rows)
    exps = {
        k: exponent(hs, [rows[h][k] for h in hs])
        for k in ("ingest_s", "fold_s", "summarize_s", "changelog_bytes", "changelog_records")
    }
    olds = [h for h in hs if "old" in rows[h]]
    exps_old = {k: exponent(olds, [rows[h]["old"][k] for h in olds]) for k in ("fold_s", "changelog_bytes")}
    common.console.print(
        "growth exponents (1 = linear): "
        + ", ".join(f"{k} {v:.2f}" for k, v in exps.items())
        + "; previous layout: "
        + ", ".join(f"{k} {v:.2f}" for k, v in exps_old.items())
    )
    big = max(hs)
    common.verdict(
        "fold and changelog linear in hosts",
        exps["fold_s"] <= TARGET_EXPONENT and exps["changelog_bytes"] <= TARGET_EXPONENT,
        f"exponents fold {exps['fold_s']:.2f}, changelog bytes {exps['changelog_bytes']:.2f} "
        f"(target <= {TARGET_EXPONENT})",
    )
    if big >= 2048:
        ms = rows[big]["fold_s"] * 1e3
        common.verdict(
            f"fold <= {TARGET_FOLD_MS_2048:.0f} ms CPU per step at {big:,} hosts",
            ms <= TARGET_FOLD_MS_2048,
            f"{ms:.1f} ms (summarize alone {rows[big]['summarize_s'] * 1e3:.1f} ms)",
        )
    result = {
        "rounds": rounds,
        "round_messages": round_messages,
        "steps": STEPS,
        "rows": {str(h): r for h, r in rows.items()},
        "exponents": exps,
        "exponents_previous_layout": exps_old,
        "rev": common.git_rev(),
    }
    common.console.print(f"raw results: {common.save('fold_width', result)}")
    return result


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m bench.fold_width [--quick] [--rounds N] [--hosts H ...] [--old-max H]``."""
    p = argparse.ArgumentParser(
        prog="python -m bench.fold_width", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="smoke run: 8 .. 256 hosts, 1 round")
    p.add_argument("--rounds", type=common.positive_int, default=None, help=f"rounds per width (default {ROUNDS})")
    p.add_argument("--hosts", type=int, nargs="+", default=None, help="widths to measure")
    p.add_argument("--old-max", type=int, default=OLD_MAX, help="widest job for the previous layout")
    p.add_argument(
        "--round-messages",
        type=int,
        default=0,
        help=f"input messages per worker round (default hosts / {ROUNDS_PER_STEP}; 1 = every part its own unit)",
    )
    a = p.parse_args(argv)
    run(a.quick, a.rounds, tuple(a.hosts) if a.hosts else None, a.old_max, a.round_messages)
    return common.exit_code(a.quick)


if __name__ == "__main__":
    raise SystemExit(main())
