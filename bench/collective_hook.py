"""Per-call cost of obshub's collective hook (a Python kernel at the ``BackendSelect`` key of every c10d
dispatcher op, obshub/instrument/hooks.py) and of its backward-phase wrapper, side by side with the same
calls uninstrumented.

    python -m bench.collective_hook [--calls 2000] [--rounds 7]

One process, gloo world of one on CPU (the smallest real collective: the hook's cost is the largest
share of it). Configurations, interleaved per round (hooks enabled and disabled in turn):

* ``all_reduce plain`` / ``all_reduce obshub``: ``dist.all_reduce`` of 4 floats, synchronous;
* ``functional plain`` / ``functional obshub``: ``_functional_collectives.all_reduce`` + wait (the path
  of DTensor, FSDP2 and compiled graphs);
* ``... obshub-py``: the same with ``OBSHUB_COLLECTIVE_KERNEL=python`` (the Python kernel, the fallback
  when the C++ kernel ``obshub.instrument._c10d_kernel`` is not built); ``obshub`` uses the C++ kernel
  when it is built;
* ``all_reduce obshub-1``: the C++ kernel on its one-probe path (``_usdt._force_coll``: what it does while
  an agent traces ``coll``: clock, in-flight registry, one probe at the end), at a NOP site;
* ``all_reduce obshub-ring``: the C++ kernel while a reader drains its collective ring (what it does while
  the agent reads the ring: clock, in-flight registry, two records written into the ring, no probe; the
  reader, obshub/producer/collring.py, is opened before and drained after each sample, untimed: the agent's
  work, in its own process);
* ``backward plain`` / ``backward obshub``: forward and ``backward()`` of a 2-layer MLP (one micro-batch:
  the module hooks, a forward and a backward phase through the wrapped ``torch.autograd.backward``).

The probes are the real USDT probes with no tracer attached (a NOP each). Prints µs per call, the ratio
to the plain call and the added µs per call, and for each all_reduce configuration the median [min..max]
of its per-round difference to the plain call of the same round (the medians alone swing ±15-28 µs at
load 4-7 on the shared VM; the paired differences much less). ``--kinds all_reduce --calls 3000 --rounds 5``
is the one-process loop of docs/BENCHMARKS.md section 11.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

from bench import common


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; returns 0."""
    ap = argparse.ArgumentParser(prog="python -m bench.collective_hook", description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000, help="calls per sample")
    ap.add_argument("--rounds", type=common.positive_int, default=7, help="samples per configuration")
    ap.add_argument(
        "--kinds", default="all_reduce,functional,backward", help="comma-separated: all_reduce, functional, backward"
    )
    args = ap.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    os.environ.setdefault("OBSHUB_COLL_RING_KB", "8192")  # the ring holds a sample (2 records per call) undrained

    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc

    from obshub.instrument import hooks

    torch.set_num_threads(1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    t = torch.ones(4)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    x = torch.randn(4, 8)

    from obshub.instrument import usdt

    one = getattr(usdt._usdt, "_force_coll", None)  # the one-probe path (issue #34), where the build has it

    try:
        from obshub.core.schema import Kind
        from obshub.instrument import _c10d_kernel
        from obshub.producer.collring import CollRings
        from obshub.producer.reader import PACKED_TABLE

        has_ring = hasattr(_c10d_kernel, "ring_info")
    except ImportError:  # an older tree (no collective ring) or no C++ kernel
        has_ring = False
    ring_drops = [0]
    cpu_us: dict[str, list[float]] = {}  # the process's CPU (all threads: gloo's too) per call, by configuration
    current = [""]

    def timed(fn, instrumented: bool, n: int, kernel: str = "auto", one_probe: bool = False, ring=False) -> float:
        rings = None
        if instrumented:
            os.environ["OBSHUB_COLLECTIVE_KERNEL"] = kernel  # auto: the C++ kernel when built
            hooks.enable(job="bench")
            if one_probe:
                one(True)
            if ring:
                rings = CollRings(1, Kind.COLLECTIVE_BEGIN, Kind.COLLECTIVE_END)
                rings.refresh([os.getpid()])
        try:
            fn()  # warm
            start, cpu0 = time.perf_counter(), time.process_time()
            for _ in range(n):
                fn()
            wall = (time.perf_counter() - start) / n * 1e6
            cpu_us.setdefault(current[0], []).append((time.process_time() - cpu0) / n * 1e6)
            return wall
        finally:
            if rings is not None:
                rings.drain(PACKED_TABLE, 1 << 20)  # the agent's work: untimed
                ring_drops[0] += sum(s["drops"] for s in rings.stats().values())
                rings.close()
            if instrumented:
                hooks.disable()
                if one_probe:
                    one(False)

    def all_reduce() -> None:
        dist.all_reduce(t)

    def functional() -> None:
        fc.all_reduce(t, "sum", dist.group.WORLD).wait()

    def backward() -> None:
        model(x).sum().backward()

    n = args.calls
    configs = {
        "all_reduce plain": lambda: timed(all_reduce, False, n),
        "all_reduce obshub": lambda: timed(all_reduce, True, n),
        "all_reduce obshub-py": lambda: timed(all_reduce, True, n, "python"),
        **(
            {"all_reduce obshub-1": lambda: timed(all_reduce, True, n, "native", one_probe=True)}
            if one is not None
            else {}
        ),
        **({"all_reduce obshub-ring": lambda: timed(all_reduce, True, n, "native", ring=True)} if has_ring else {}),
        "functional plain": lambda: timed(functional, False, n),
        "functional obshub": lambda: timed(functional, True, n),
        "functional obshub-py": lambda: timed(functional, True, n, "python"),
        "backward plain": lambda: timed(backward, False, n),
        "backward obshub": lambda: timed(backward, True, n),
    }
    configs = {k: v for k, v in configs.items() if k.split()[0] in kinds}

    def named(name, fn):
        def run():
            current[0] = name
            return fn()

        return run

    configs = {k: named(k, v) for k, v in configs.items()}
    series = common.interleave(configs, args.rounds, progress=False)
    traced = bool(getattr(usdt._usdt, "coll_traced", lambda: False)())
    common.console.print(common.table(f"per call, {n} calls per sample", series, "µs", baseline="all_reduce plain"))
    hooks.enable(job="bench")
    kernel = hooks.collective_kernel()
    hooks.disable()
    os.environ.pop("OBSHUB_COLLECTIVE_KERNEL", None)
    for kind in kinds:
        plain, inst = series[f"{kind} plain"].median, series[f"{kind} obshub"].median
        line = f"{kind}: {inst / plain:.3f}x plain, +{inst - plain:.1f} µs per call ({kernel} kernel)"
        if f"{kind} obshub-py" in series:
            py = series[f"{kind} obshub-py"].median
            line += f"; Python kernel: {py / plain:.3f}x, +{py - plain:.1f} µs"
        common.console.print(line)
    if "all_reduce obshub-1" in series:
        plain, inst = series["all_reduce plain"].median, series["all_reduce obshub-1"].median
        common.console.print(
            f"all_reduce, the one-probe path (what the C++ kernel does while an agent traces `coll`: the begin "
            f"time, the in-flight registry, one probe at the end; NOP site here): +{inst - plain:.1f} µs per call"
        )
    paired = {}
    if "all_reduce" in kinds:
        base = series["all_reduce plain"].samples
        for name in (k for k in series if k.startswith("all_reduce obshub")):
            d = sorted(x - y for x, y in zip(series[name].samples, base))
            c = sorted(x - y for x, y in zip(cpu_us[name], cpu_us["all_reduce plain"]))
            paired[name] = d
            paired[name + " cpu"] = c
            common.console.print(
                f"{name} - plain, per round: wall median {statistics.median(d):+.2f} µs [{d[0]:+.2f}..{d[-1]:+.2f}], "
                f"CPU (all threads) {statistics.median(c):+.2f} µs [{c[0]:+.2f}..{c[-1]:+.2f}] per call"
            )
        if "all_reduce obshub-ring" in series:
            common.console.print(f"collective ring: {ring_drops[0]} collectives dropped to the trap (ring full)")
    if traced:
        common.console.print(
            "[yellow]warning: a tracer (another agent on this machine) had `coll` attached in this process: "
            "the NOP sites trapped[/yellow]"
        )
    common.save(
        "collective_hook",
        {**{k: v.samples for k, v in series.items()}, "paired_us": paired, "coll_traced": traced},
    )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
