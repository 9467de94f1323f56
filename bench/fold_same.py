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
    keep = ("fold_ms", "fold_enc_ms", "close_ms", "encode_ms", "fold_max_ms", "gc_ms", "summary_bytes", "named")
    keep += ("steps_judged",)
    print({"t0_ns": t0, **{k: cost[k] for k in keep}})
    return len(summaries)


def read_dump(path: Path) -> list[dict]:
    """The step summaries of a ``dump`` file (a msgpack list of maps). Raises ValueError naming the file
    when it cannot be read or is not such a list."""
    try:
        got = msgspec.msgpack.decode(path.read_bytes())
    except OSError as exc:
        raise ValueError(f"{path}: cannot read it ({exc.strerror})") from None
    except msgspec.DecodeError as exc:
        raise ValueError(f"{path}: not a fold_same dump (msgpack: {exc})") from None
    if not isinstance(got, list) or not all(isinstance(s, dict) for s in got):
        raise ValueError(f"{path}: not a fold_same dump (a msgpack list of step summaries)")
    return got


def compare(old: Path, new: Path) -> list[str]:
    """The differences of two ``dump`` files (decoded, ``WALL`` left out): one line per step summary that
    differs, one if their counts differ, one if they hold none (nothing compared: e.g. a pinned clock far
    from the real time, whose data the worker drops); empty when equal. Raises ValueError for a file that
    is not a dump (``read_dump``)."""
    a, b = read_dump(old), read_dump(new)
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
    """``dump`` (exit 0, or 1 when the run closed no step) or ``compare`` (exit 0 when equal, 1 when they
    differ); bad input (a size under 1, a ``--t0-ns`` that is no positive ns count, an output folder that
    does not exist, a file that is not a dump) exits 2 naming it, before any run (argparse)."""
    from bench import common

    ap = argparse.ArgumentParser(
        prog="python -m bench.fold_same", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump", help="run the pinned in-process case, write its summaries to OUT (msgpack)")
    d.add_argument("out", type=Path, help="the msgpack file to write")
    d.add_argument("--hosts", type=common.positive_int, default=2048, help="hosts of the fleet (default 2048)")
    d.add_argument("--ranks-per-host", type=common.positive_int, default=8, help="training ranks per host (default 8)")
    d.add_argument(
        "--case",
        choices=["mem", "mem10", "straggler"],
        default="straggler",
        help="bench.width's case (default straggler)",
    )
    d.add_argument(
        "--t0-ns",
        type=common.positive_int,
        default=None,
        help="the pinned wall clock's start, ns since the epoch (default: now, to the hour)",
    )
    c = sub.add_parser("compare", help="compare two dumps (exit 0 equal, 1 different)")
    c.add_argument("old", type=Path, help="a dump of the base tree")
    c.add_argument("new", type=Path, help="a dump of the changed tree")
    args = ap.parse_args(argv)
    if args.cmd == "dump":
        if not args.out.parent.is_dir():
            d.error(f"{args.out}: no folder {args.out.parent} to write it in")
        n = dump(args.out, args.hosts, args.ranks_per_host, args.case, args.t0_ns)
        print(f"{n} summaries -> {args.out}")
        if not n:
            print("no step closed: a --t0-ns far from the real time (the worker drops such data)?", file=sys.stderr)
        return 0 if n else 1
    try:
        diff = compare(args.old, args.new)
    except ValueError as exc:
        c.error(str(exc))
    print("\n".join(diff) if diff else f"equal: {len(read_dump(args.old))} summaries")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
