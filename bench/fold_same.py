"""Every step summary of ``bench.width``'s in-process run (``inproc_cost``), pinned so that two trees give
the same input, written as msgpack; or two such files compared as decoded objects. The check that a change
of the close's speed left its summaries as they were (issue #30 item 4): run ``dump`` from each tree's root
on the same case, then ``compare``.

    python -m bench.fold_same dump OUT --hosts 2048 --ranks-per-host 8 --case straggler|mem|mem10 [--t0-ns NS]
    python -m bench.fold_same compare OLD NEW

The wall clock (``time.time_ns``: the fleet's start, the worker's clock) runs from ``--t0-ns`` at the start
of the run: by default the real time rounded down to the hour (``t0_now``: near the real time, which the
worker's data must be, and the same for the dumps of both trees run within one hour; give the printed value
to the second dump to be sure); ``closed_at_ns`` (the worker's clock at the close) is left out of the
comparison."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import msgspec

HOUR_NS = 3_600 * 10**9


def t0_now(now_ns: int | None = None) -> int:
    """The default start of a pinned run's wall clock: ``now_ns`` (default ``time.time_ns()``, ns since the
    epoch) rounded down to the hour. Near the real time (a constant date would drift away from it), the
    same for every dump started in the same hour."""
    now = time.time_ns() if now_ns is None else now_ns
    return now - now % HOUR_NS


WALL = ("closed_at_ns",)
"""Summary fields read from the worker's running clock: left out of ``compare``."""


def dump(out: Path, hosts: int, ranks_per_host: int, case: str, t0_ns: int | None = None) -> int:
    """Run ``inproc_cost(hosts, ranks_per_host, ...)`` of ``case`` (``bench.width.CASES``: its steps, guilty
    layer and share of hosts in reclaim) with the wall clock pinned to start at ``t0_ns`` (ns since the epoch;
    None: ``t0_now()``) and write its summaries
    (a msgpack list, in close order) to ``out``; prints the run's medians (``inproc_cost``'s fold_ms,
    close_ms, ...); returns how many summaries. Raises ``KeyError`` for an unknown case."""
    from bench import width
    from obshub.streams import inproc

    layer, steps, guilty_from, share = width.CASES[case]
    t0 = t0_now() if t0_ns is None else t0_ns
    seen: list[dict] = []
    real_pipe, real_ns = inproc.InProcess, time.time_ns
    start = time.monotonic_ns()

    def pinned_ns() -> int:  # the wall clock, from t0 at the start of the run
        return t0 + time.monotonic_ns() - start

    def recorded_pipe(*a, **kw):
        pipe = real_pipe(*a, **{**kw, "clock": pinned_ns})  # its default is bound to the real clock
        seen.append(pipe)  # type: ignore[arg-type]
        return pipe

    inproc.InProcess, time.time_ns = recorded_pipe, pinned_ns  # type: ignore[assignment,misc]
    try:
        cost = width.inproc_cost(hosts, ranks_per_host, steps, guilty_from, guilty_layer=layer, mem_share=share)
    finally:
        inproc.InProcess, time.time_ns = real_pipe, real_ns  # type: ignore[misc]
    summaries = [s for pipe in seen for s in pipe.summaries]  # type: ignore[attr-defined]
    out.write_bytes(msgspec.msgpack.encode(summaries))
    keep = ("fold_ms", "close_ms", "encode_ms", "fold_max_ms", "gc_ms", "summary_bytes", "named", "steps_judged")
    print({"t0_ns": t0, **{k: cost[k] for k in keep}})
    return len(summaries)


def compare(old: Path, new: Path) -> list[str]:
    """The differences of two ``dump`` files (decoded, ``WALL`` left out): one line per step summary that
    differs, one if their counts differ, one if they hold none (nothing compared: e.g. a pinned clock far
    from the real time, whose data the worker drops); empty when equal."""
    a = msgspec.msgpack.decode(old.read_bytes())
    b = msgspec.msgpack.decode(new.read_bytes())
    out = [f"{len(a)} summaries in {old}, {len(b)} in {new}"] if len(a) != len(b) else []
    if not a and not b:
        out.append(f"no summaries in {old} nor {new}: nothing compared")
    for x, y in zip(a, b):
        x, y = ({k: v for k, v in s.items() if k not in WALL} for s in (x, y))
        if x != y:
            keys = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
            out.append(f"step {x.get('step')}: {', '.join(keys)} differ")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fold_same", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("out", type=Path)
    d.add_argument("--hosts", type=int, default=2048)
    d.add_argument("--ranks-per-host", type=int, default=8)
    d.add_argument("--case", choices=["mem", "mem10", "straggler"], default="straggler")
    d.add_argument(
        "--t0-ns", type=int, default=None, help="the pinned wall clock's start, ns (default: now, to the hour)"
    )
    c = sub.add_parser("compare")
    c.add_argument("old", type=Path)
    c.add_argument("new", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "dump":
        n = dump(args.out, args.hosts, args.ranks_per_host, args.case, args.t0_ns)
        print(f"{n} summaries -> {args.out}")
        return 0
    diff = compare(args.old, args.new)
    a = msgspec.msgpack.decode(args.old.read_bytes())
    print("\n".join(diff) if diff else f"equal: {len(a)} summaries")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
