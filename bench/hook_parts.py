"""The price of obshub's hooks and probes per rank-step, part by part (issue #34): ``python -m
bench.hook_overhead --parts`` (root). Called by bench/hook_overhead.py with its trainers; see its docstring.

Parts, on the many-module model of bench/hook_overhead.py (one-rank gloo DDP):

1. probes per step, by probe, recorded at the probe sites (``obshub.instrument._usdt._record``: the
   hooks' Python and the C++ collective kernel alike) with the agent attached: the traps per step;
2. CPU µs per step inside each hook entry point, timed in place (``time.thread_time_ns`` around each
   call; ~0.1 µs of timer per call);
3. ns per trap of each probe shape with the agent's ``pytorch`` layer attached, from a loop of the C probe
   function (attached minus the same loop before the attach: a NOP site), in the calling thread's CPU
   time (the trap and the BPF program run there; the drain thread's decoding of the events does not);
   ``coll`` is the one probe per collective the C++ kernel fires while it is traced (issue #34), against
   ``coll_begin + coll_end`` plus ``tracekey``, the three it fires otherwise; while the agent reads the
   process's collective ring (obshub/producer/collring.py) the kernel fires none: part 1 then shows the
   ring's records per step beside the probes;
4. the drain thread's CPU µs per step of C (``poll_packed``, the agent's path; ``time.thread_time_ns``);
5. one component switched off at a time, interleaved rounds: CPU µs per step against A of B (all hooks),
   of B without it, and of C (B + probes attached + drain thread) and C without the drain thread.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections import Counter
from typing import Any, Callable

from bench import common


def _cpu_per_step(fn: Callable[[int], None], steps: int) -> float:
    for i in range(3):
        fn(i)  # warm
    t0 = time.process_time_ns()
    for i in range(steps):
        fn(i)
    return (time.process_time_ns() - t0) / steps / 1e3


class _Timed:
    """Wraps the hook entry points of obshub.instrument.hooks with thread-CPU timers (ns per name)."""

    NAMES = (
        "_root_pre_hook",
        "_root_hook",
        "_optimizer_pre_hook",
        "_optimizer_post_hook",
        "_backward_call_begin",
        "_backward_call_end",
        "_on_backward_start",
        "_on_backward_end",
    )

    def __init__(self, hooks: Any) -> None:
        self.hooks = hooks
        self.ns: Counter = Counter()
        self.calls: Counter = Counter()
        self.orig = {n: getattr(hooks, n) for n in self.NAMES}

    def install(self) -> None:
        clock = time.thread_time_ns
        for name, fn in self.orig.items():

            def timed(*a, _fn=fn, _name=name, **kw):
                t0 = clock()
                try:
                    return _fn(*a, **kw)
                finally:
                    self.ns[_name] += clock() - t0
                    self.calls[_name] += 1

            setattr(self.hooks, name, timed)

    def remove(self) -> None:
        for name, fn in self.orig.items():
            setattr(self.hooks, name, fn)


def run(args, runs: dict, module_calls: int, n_buckets: int) -> int:
    """The ``--parts`` profile; prints its tables and saves them (bench-results/hook_parts*.json)."""
    import torch
    import torch.optim.optimizer as optim_mod

    from obshub.core.settings import load_settings
    from obshub.instrument import hooks, usdt
    from obshub.producer.loader import BpfEventSource
    from obshub.producer.probes import ProbeOptions, Target

    steps = args.steps
    rec = usdt._usdt

    # ---- 3 (before the attach): the probe functions' loops at NOP sites
    def trap_loops() -> dict[str, float]:
        n = 20_000
        out = {}
        t0 = time.thread_time_ns()
        for _ in range(n):
            usdt.tracekey(5, 1)
        out["tracekey"] = (time.thread_time_ns() - t0) / n
        t0 = time.thread_time_ns()
        for i in range(n):
            usdt.phase_begin("forward", 1, (1 << 32) | i)
            usdt.phase_end("forward", 1, (1 << 32) | i)
        out["phase_begin + phase_end"] = (time.thread_time_ns() - t0) / n
        base = trap_loops.seq
        t0 = time.thread_time_ns()
        for i in range(n):
            usdt.coll_begin("bench", base + i, "all_reduce", 64, 1, 7)
            usdt.coll_end("bench", base + i, "all_reduce", 64, 1, 7)
        out["coll_begin + coll_end"] = (time.thread_time_ns() - t0) / n
        begin, tid = time.monotonic_ns(), threading.get_native_id()
        t0 = time.thread_time_ns()
        for i in range(n):
            usdt.coll("bench", base + n + i, "all_reduce", 64, 1, 7, begin, tid)
        trap_loops.seq += 2 * n
        out["coll"] = (time.thread_time_ns() - t0) / n
        return out

    trap_loops.seq = 0  # type: ignore[attr-defined]
    nop = [trap_loops() for _ in range(3)]

    # ---- the switches: (name, off, on) run after enable() and before disable()
    saved: dict[str, Any] = {}

    def roots_off():
        saved["rearm"] = hooks._rearm_at_step_boundary
        hooks._rearm_at_step_boundary = lambda: None
        for handles in list(hooks._roots.values()):
            for h in handles:
                h.remove()

    def roots_on():
        hooks._rearm_at_step_boundary = saved.pop("rearm")

    def opt_off():
        saved["pre"] = dict(optim_mod._global_optimizer_pre_hooks)
        saved["post"] = dict(optim_mod._global_optimizer_post_hooks)
        optim_mod._global_optimizer_pre_hooks.clear()
        optim_mod._global_optimizer_post_hooks.clear()

    def opt_on():
        optim_mod._global_optimizer_pre_hooks.update(saved.pop("pre"))
        optim_mod._global_optimizer_post_hooks.update(saved.pop("post"))

    def bwd_off():
        saved["bwd"] = torch.autograd.backward
        saved["start"] = hooks._on_backward_start
        torch.autograd.backward = torch.autograd.backward.__obshub_wrapped__
        hooks._on_backward_start = lambda grad: None

    def bwd_on():
        torch.autograd.backward = saved.pop("bwd")
        hooks._on_backward_start = saved.pop("start")

    def coll_off():
        hooks._native.uninstall()

    def coll_on():
        hooks._install_collective_kernels()

    switches: dict[str, tuple[Callable[[], None], Callable[[], None]]] = {
        "root module hooks": (roots_off, roots_on),
        "optimizer hooks": (opt_off, opt_on),
        "backward wrapper + gradient hook": (bwd_off, bwd_on),
        "collective kernel": (coll_off, coll_on),
    }

    def sample(name: str, off: str | None = None) -> float:
        if name == "A":
            return _cpu_per_step(runs["A"], steps)
        os.environ["OBSHUB_COLLECTIVE_KERNEL"] = "auto"
        hooks.enable(job="bench-hooks")
        try:
            runs["B"](0)
            runs["B"](1)  # discovery done: the roots' own hooks
            if off:
                switches[off][0]()
            try:
                return _cpu_per_step(runs["B"], steps)
            finally:
                if off:
                    switches[off][1]()
        finally:
            hooks.disable()

    # ---- 5, without the agent: B and B without one part
    configs: dict[str, Callable[[], float]] = {"A": lambda: sample("A"), "B": lambda: sample("B")}
    for off in switches:
        configs[f"B - {off}"] = lambda off=off: sample("B", off)
    series = common.interleave(configs, args.rounds, progress=False)

    # ---- the agent: the pytorch layer on this process, drained by a thread that can pause
    src = BpfEventSource(
        load_settings(),
        Target(pids={os.getpid()}),
        ProbeOptions(probes=("pytorch",), usdt_library=usdt.library_path(), sysfs=False),
    )
    src.start()
    stop, pause = threading.Event(), threading.Event()
    drain_ns = [0]

    def drain():
        while not stop.is_set():
            if pause.is_set():
                time.sleep(0.01)
                continue
            t0 = time.thread_time_ns()
            src.poll_packed(50)  # the agent's path
            drain_ns[0] += time.thread_time_ns() - t0

    th = threading.Thread(target=drain, daemon=True)
    th.start()
    try:
        # ---- 3: the same loops, attached
        traced = [trap_loops() for _ in range(3)]
        trap_ns = {k: statistics.median(t[k] for t in traced) - statistics.median(n[k] for n in nop) for k in nop[0]}

        # ---- 1 + 2: one timed, recorded run of C
        timed = _Timed(hooks)
        timed.install()
        hooks.enable(job="bench-hooks")
        ring_of = getattr(src, "coll_rings", None)  # the collective ring (issue #34), where the tree has it
        try:
            runs["B"](0)
            runs["B"](1)
            deadline = time.monotonic() + 3.0  # the drain thread finds the ring at its next refresh
            while ring_of is not None and os.getpid() not in ring_of() and time.monotonic() < deadline:
                runs["B"](1)
            ring0 = ring_of().get(os.getpid(), {}).get("written", 0) if ring_of else 0
            rec._recorded()
            rec._record(True)
            d0 = drain_ns[0]
            t0 = time.process_time_ns()
            timed.ns.clear()
            timed.calls.clear()
            for i in range(steps):
                runs["B"](i)
            cpu_timed = (time.process_time_ns() - t0) / steps / 1e3
            time.sleep(0.2)  # the last completions and the drain
            rec._record(False)
            drain_timed = (drain_ns[0] - d0) / steps / 1e3
            ring_records = (ring_of().get(os.getpid(), {}).get("written", 0) - ring0) / steps if ring_of else 0.0
        finally:
            hooks.disable()
            timed.remove()
        fired = Counter(c[0] for c in rec._recorded())

        # ---- 4 + 5: interleaved rounds
        def c_sample(drained: bool) -> float:
            if not drained:
                pause.set()
                time.sleep(0.06)  # a poll in progress ends
            try:
                d0 = drain_ns[0]
                v = sample("C")
                if drained:
                    drain_per_step.append((drain_ns[0] - d0) / (steps + 5) / 1e3)
                return v
            finally:
                pause.clear()

        drain_per_step: list[float] = []
        c_configs: dict[str, Callable[[], float]] = {
            "A": lambda: sample("A"),
            "C": lambda: c_sample(True),
            "C - drain thread": lambda: c_sample(False),
        }
        series_c = common.interleave(c_configs, args.rounds, progress=False)
    finally:
        stop.set()
        th.join(2)
        src.close()

    from rich.table import Table

    t1 = Table(title=f"probes fired per step with the agent attached (= traps), {steps} steps of B")
    t1.add_column("probe")
    t1.add_column("per step")
    for name, n in sorted(fired.items(), key=lambda kv: -kv[1]):
        t1.add_row(name, f"{n / steps:.1f}")
    t1.add_row("all", f"{sum(fired.values()) / steps:.1f}")
    t1.add_row("(collective ring records, no trap)", f"{ring_records:.1f}")
    common.console.print(t1)

    t2 = Table(title=f"CPU µs per step inside each hook entry point (timed in place), C: {cpu_timed:.0f} µs/step")
    for col in ("entry point", "calls/step", "µs/step", "µs/call"):
        t2.add_column(col)
    total = 0.0
    for name in _Timed.NAMES:
        c, ns = timed.calls[name], timed.ns[name]
        total += ns / steps / 1e3
        t2.add_row(name, f"{c / steps:.1f}", f"{ns / steps / 1e3:.1f}", f"{ns / max(c, 1) / 1e3:.1f}")
    t2.add_row("all hook entry points", "", f"{total:.1f}", "")
    t2.add_row("drain thread (this run)", "", f"{drain_timed:.1f}", "")
    common.console.print(t2)

    t3 = Table(title="ns per call of the C probe function: attached minus NOP site (the trap + the BPF program)")
    t3.add_column("probe shape")
    t3.add_column("NOP ns")
    t3.add_column("attached − NOP, ns per pair/call")
    for k, v in trap_ns.items():
        t3.add_row(k, f"{statistics.median(n[k] for n in nop):.0f}", f"{v:+.0f}")
    common.console.print(t3)

    t4 = Table(
        title=f"CPU µs per step against A, one part off at a time: {args.rounds} interleaved rounds of {steps} steps "
        f"({module_calls} module calls, {n_buckets} buckets per step)",
        caption=common.describe_machine(),
    )
    for col in ("configuration", "µs/step", "vs A: median [min..max]", "the part: B (or C) − it"):
        t4.add_column(col)

    def diff(a: str, b: str, src=series) -> list[float]:
        return [x - y for x, y in zip(src[b].samples, src[a].samples)]

    def row(label: str, name: str, part: str, src) -> None:
        d = diff("A", name, src)
        t4.add_row(
            label, f"{src[name].median:.0f}", f"{statistics.median(d):+.0f} [{min(d):+.0f}..{max(d):+.0f}]", part
        )

    t4.add_row("A plain (DDP)", f"{series['A'].median:.0f}", "-", "-")
    row("B all hooks (no tracer)", "B", "-", series)
    for off in switches:
        row(f"B - {off}", f"B - {off}", f"{statistics.median(diff(f'B - {off}', 'B')):+.0f}", series)
    t4.add_row("A plain (DDP), rounds of C", f"{series_c['A'].median:.0f}", "-", "-")
    row("C = B + probes attached + drain thread", "C", "-", series_c)
    row(
        "C - drain thread",
        "C - drain thread",
        f"{statistics.median(diff('C - drain thread', 'C', series_c)):+.0f}",
        series_c,
    )
    common.console.print(t4)
    common.console.print(
        f"drain thread: {statistics.median(drain_per_step):.0f} µs CPU per step of C (median of the rounds)"
        if drain_per_step
        else ""
    )
    common.save(
        "hook_parts",
        {
            "rev": common.git_rev(),
            "args": vars(args),
            "fired_per_step": {k: v / steps for k, v in fired.items()},
            "ring_records_per_step": ring_records,
            "hook_us_per_step": {k: timed.ns[k] / steps / 1e3 for k in _Timed.NAMES},
            "hook_calls_per_step": {k: timed.calls[k] / steps for k in _Timed.NAMES},
            "trap_ns": trap_ns,
            "drain_us_per_step": drain_per_step,
            "samples": {n: s.samples for n, s in series.items()},
            "samples_c": {n: s.samples for n, s in series_c.items()},
        },
    )
    return 0
