"""Price of obshub's in-process hooks per training step on a model with many modules, against plain
training, side by side in one process: a GPT-like transformer (``--depth`` blocks, ~11 module calls per
block) trained by a one-rank DDP (gloo) with small buckets, so that the price per module call and per DDP
bucket shows.

Configurations, interleaved every round (``enable()``/``disable()`` toggle the hooks in-process; each
DDP configuration has its own DDP instance of an identical model; DDP's own C++ comm hook stays in both):

A. plain: no obshub;
B. ``obshub.instrument.hooks.enable()`` (BP: with ``OBSHUB_COLLECTIVE_KERNEL=python``, the Python collective
   kernel; B: the C++ kernel ``obshub.instrument._c10d_kernel`` when it is built): the module (discovery, then the roots' own), optimizer and
   backward hooks and the collective kernels at the c10d dispatcher (every bucket's all-reduce passes
   one); the USDT probe sites are NOPs (no tracer);
C. (``--agent``, root) B while a BPF event source with the USDT probes (the agent's ``pytorch`` layer) is
   attached to this process: every probe site traps. The source is drained as the agent drains it
   (``poll_packed``) by another process (``--drain process``, the default: its CPU per step of each
   configuration is printed, and C's minus A's (its idle polling) is added to C's for the verdict, as
   the agent's work is part of what a rank pays), or by a thread
   of this process with ``poll`` (``--drain thread``: what this benchmark did before; its CPU and its
   GIL contention land in C's process CPU).
M. / MB. the same model without DDP, without and with the hooks: the module hooks alone.

Printed: µs per step of each against A (median of the per-round differences and its min..max), the
module calls and buckets per step, ns per module call ((MB - M) / calls) and per bucket
(((B - A) - (MB - M)) / buckets), and the verdict against 1 ms per rank-step.

    flock /tmp/obshub-heavy.lock python -m bench.hook_overhead               # 9 rounds of 30 steps
    flock /tmp/obshub-heavy.lock python -m bench.hook_overhead --agent       # also C (root)
    flock /tmp/obshub-heavy.lock python -m bench.hook_overhead --parts       # the price by part (root)

``--parts`` (root; issue #34) profiles B and C part by part instead of the A/B table: (1) the probes fired
per step, by probe, read at the probe sites (``_usdt._record``: the hooks' and the C++ kernel's alike)
= the traps per step while a tracer is attached; (2) the CPU µs per step inside each hook entry point
(timed in place: root module pre/post hook, optimizer pre/post hook, backward call begin/end, gradient
hook, end-of-backward callback); (3) the price of one trap of each probe shape while the agent's
``pytorch`` layer is attached, from a loop of the C probe function (attached minus not attached); (4) the
CPU the drain thread takes per step of C; (5) one component switched off at a time (root module hooks,
optimizer hooks, backward wrapper, collective kernel, probes attached, drain thread) in interleaved rounds:
B or C minus that, against A.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import threading
import time

from bench import common

TARGET_US = 1000.0  # everything obshub adds to a rank-step on the many-module model (issue #34)


def build(depth: int, d: int):
    """The many-module model: embedding, ``depth`` pre-norm transformer blocks, head. Returns the module."""
    import torch
    from torch import nn

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.proj, self.drop = nn.Linear(d, 3 * d), nn.Linear(d, d), nn.Dropout(0.0)

        def forward(self, x):
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            a = torch.softmax(q @ k.transpose(-1, -2) / d**0.5, dim=-1)
            return self.drop(self.proj(a @ v))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.attn, self.ln2 = nn.LayerNorm(d), Attention(), nn.LayerNorm(d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.Dropout(0.0))

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(256, d)
            self.blocks = nn.ModuleList(Block() for _ in range(depth))
            self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, 256)

        def forward(self, idx):
            x = self.emb(idx)
            for b in self.blocks:
                x = b(x)
            return self.head(self.ln(x))

    torch.manual_seed(0)
    return GPT()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=common.positive_int, default=9)
    ap.add_argument("--steps", type=int, default=30, help="steps per sample")
    ap.add_argument("--depth", type=int, default=24)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--bucket-mb", type=float, default=0.05, help="DDP bucket_cap_mb (small: many buckets)")
    ap.add_argument("--agent", action="store_true", help="also C: a BPF source on the USDT probes (root)")
    ap.add_argument(
        "--drain",
        choices=("process", "thread"),
        default="process",
        help="C's reader: another process with poll_packed (as the agent), or a thread of this one with poll",
    )
    ap.add_argument("--parts", action="store_true", help="profile the price part by part (root; see the docstring)")
    args = ap.parse_args(argv)

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from obshub.instrument import hooks

    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(common_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    base = build(args.depth, args.dim)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(1)
    data = [torch.randint(0, 256, (4, 32), generator=gen) for _ in range(8)]

    def trainer(model):
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)

        def step(i: int) -> None:
            x = data[i % len(data)]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x).flatten(0, 1), x.flatten())
            loss.backward()
            opt.step()

        return step

    ddp_a = DDP(copy.deepcopy(base), bucket_cap_mb=args.bucket_mb)
    ddp_b = DDP(copy.deepcopy(base), bucket_cap_mb=args.bucket_mb)
    runs = {"A": trainer(ddp_a), "M": trainer(copy.deepcopy(base))}
    # B's DDP instance takes its first forward with the hooks on (the roots are discovered then)
    hooks.enable(job="bench-hooks")
    runs["B"] = trainer(ddp_b)
    runs["MB"] = trainer(copy.deepcopy(base))
    runs["B"](0)
    hooks.disable()

    # module calls and buckets per step, counted once
    calls = [0]

    def count(_m, _a):
        calls[0] += 1

    h = nn.modules.module.register_module_forward_pre_hook(count)
    runs["M"](0)
    h.remove()
    buckets = [0]
    ddp_c = DDP(copy.deepcopy(base), bucket_cap_mb=args.bucket_mb)

    def counting_hook(pg, bucket):
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        buckets[0] += 1
        return allreduce_hook(pg, bucket)

    ddp_c.register_comm_hook(None, counting_hook)
    step_c = trainer(ddp_c)
    step_c(0)
    buckets[0] = 0
    step_c(1)
    module_calls, n_buckets = calls[0], buckets[0]
    del ddp_c, step_c

    if args.parts:
        from bench import hook_parts

        return hook_parts.run(args, runs, module_calls, n_buckets)
    wall: dict[str, list[float]] = {}

    def sample(name: str) -> float:
        on = name in ("B", "MB", "C", "BP", "CP")
        if on:
            # BP / CP: B / C with the Python collective kernel; B / C: the C++ one when built
            os.environ["OBSHUB_COLLECTIVE_KERNEL"] = "python" if name in ("BP", "CP") else "auto"
            hooks.enable(job="bench-hooks")
        try:
            fn = runs["B" if name in ("C", "BP", "CP") else name]
            for i in range(3):
                fn(i)  # warm
            w0, t0 = time.perf_counter_ns(), time.process_time_ns()
            for i in range(args.steps):
                fn(i)
            wall.setdefault(name, []).append((time.perf_counter_ns() - w0) / args.steps / 1e3)
            return (time.process_time_ns() - t0) / args.steps / 1e3  # CPU µs per step, all threads
        finally:
            if on:
                hooks.disable()

    # the price of one module call alone: a loop of calls of an empty module, hooks off and on
    ident = nn.Identity()
    x0 = torch.zeros(1)

    def call_ns(on: bool, n: int = 20_000) -> float:
        if on:
            hooks.enable(job="bench-hooks")
        try:
            t0 = time.process_time_ns()
            for _ in range(n):
                ident(x0)
            return (time.process_time_ns() - t0) / n
        finally:
            if on:
                hooks.disable()

    calls_series = common.interleave({"off": lambda: call_ns(False), "on": lambda: call_ns(True)}, 7, progress=False)
    order = ["A", "B", "BP", "M", "MB"]
    series: dict[str, common.Series] = {n: common.Series(n) for n in order}
    for r in range(args.rounds):
        for n in order if r % 2 == 0 else order[::-1]:  # A B M MB, then MB M B A: drifts hit both sides alike
            series[n].samples.append(sample(n))
    agent_series, agent_us = None, 0.0
    if args.agent:
        agent_series, agent_us = _with_agent(sample, args.rounds, args.drain, args.steps)
    os.environ["OBSHUB_COLLECTIVE_KERNEL"] = "auto"
    hooks.enable(job="bench-hooks")
    kernel = hooks.collective_kernel()
    hooks.disable()

    def diff(a: str, b: str, src=series) -> tuple[float, float, float]:
        d = [x - y for x, y in zip(src[b].samples, src[a].samples)]
        return statistics.median(d), min(d), max(d)

    from rich.table import Table

    t = Table(
        title=f"CPU µs per step (the process, all threads), 1-rank DDP (gloo), GPT depth {args.depth} d={args.dim}: "
        f"{module_calls} module calls, {n_buckets} buckets per step; {args.rounds} interleaved rounds of {args.steps} steps",
        caption=common.describe_machine(),
    )
    for col in ("configuration", "CPU µs/step", "vs plain: µs/step [min..max]", "vs plain", "wall µs/step"):
        t.add_column(col)
    rows = [("A plain (DDP)", "A", None, series), (f"B obshub hooks (DDP), {kernel} kernel", "B", "A", series)]
    rows.append(("BP obshub hooks (DDP), Python kernel", "BP", "A", series))
    rows += [("M plain, no DDP", "M", None, series), ("MB obshub hooks, no DDP", "MB", "M", series)]
    if agent_series:
        rows.append((f"C hooks + USDT probes attached (DDP), {kernel} kernel", "C", "A", agent_series))
        rows.append(("CP hooks + USDT probes attached (DDP), Python kernel", "CP", "A", agent_series))
    for label, name, ref, src in rows:
        med, w = src[name].median, f"{statistics.median(wall[name]):.0f}"
        if ref is None:
            t.add_row(label, f"{med:.0f}", "-", "-", w)
            continue
        m, lo, hi = diff(ref, name, src)
        t.add_row(label, f"{med:.0f}", f"{m:+.0f} [{lo:+.0f}..{hi:+.0f}]", f"{m / src[ref].median * 100:+.2f} %", w)
    common.console.print(t)
    mod_us = diff("M", "MB")[0]
    ddp_us = diff("A", "B")[0]
    per_call_ns = mod_us * 1e3 / max(1, module_calls)
    per_bucket_ns = (ddp_us - mod_us) * 1e3 / max(1, n_buckets)
    per_bucket_py_ns = (diff("A", "BP")[0] - mod_us) * 1e3 / max(1, n_buckets)
    loop_ns = calls_series["on"].median - calls_series["off"].median
    common.console.print(
        f"per module call: {loop_ns:.0f} ns in a loop of nn.Identity calls ({calls_series['off'].median:.0f} ns "
        f"without the hooks, {calls_series['on'].median:.0f} ns with), {per_call_ns:.0f} ns from (MB - M) / "
        f"{module_calls}; per DDP bucket ((B - A) - (MB - M)) / {n_buckets}: {per_bucket_ns:.0f} ns ({kernel} kernel), "
        f"{per_bucket_py_ns:.0f} ns with the Python kernel (BP)"
    )
    total = diff("A", "C", agent_series)[0] + agent_us if agent_series else ddp_us
    if agent_series and args.drain == "process":
        common.console.print(
            f"reader process (poll_packed, as the agent): {agent_us:.0f} µs CPU per step of C beyond its idle "
            f"polling (A), added to C's {diff('A', 'C', agent_series)[0]:+.0f} µs for the verdict"
        )
    common.verdict(
        "everything obshub adds per rank-step <= 1 ms (many-module model)",
        total <= TARGET_US,
        f"{total:+.0f} µs per step" + ("" if agent_series else " (hooks only; --agent adds the probes' traps)"),
    )
    common.save(
        "hook_overhead",
        {
            "rev": common.git_rev(),
            "args": vars(args),
            "module_calls": module_calls,
            "buckets": n_buckets,
            "samples": {n: s.samples for n, s in series.items()},
            "agent_samples": {n: s.samples for n, s in agent_series.items()} if agent_series else None,
            "wall_us": wall,
            "call_ns": {n: s.samples for n, s in calls_series.items()},
            "per_call_ns": per_call_ns,
            "per_bucket_ns": per_bucket_ns,
            "per_bucket_py_ns": per_bucket_py_ns,
            "kernel": kernel,
            "drain": args.drain,
            "reader_us_per_traced_step": agent_us,
        },
    )
    dist.destroy_process_group()
    return common.exit_code()


def _reader(pid: int, conn) -> None:
    """The agent's reader in a process of its own (``--drain process``): the ``pytorch`` layer on ``pid``,
    drained with ``poll_packed`` (the agent's hot path) every 50 ms or sooner; answers each request on
    ``conn`` with its own CPU time so far (ns), and ends at ``"stop"``."""
    from obshub.core.settings import load_settings
    from obshub.instrument import usdt
    from obshub.producer.loader import BpfEventSource
    from obshub.producer.probes import ProbeOptions, Target

    src = BpfEventSource(
        load_settings(),
        Target(pids={pid}),
        ProbeOptions(probes=("pytorch",), usdt_library=usdt.library_path(), sysfs=False),
    )
    src.start()
    conn.send(time.process_time_ns())
    try:
        while True:
            src.poll_packed(50)
            if conn.poll(0):
                if conn.recv() == "stop":
                    break
                conn.send(time.process_time_ns())
    finally:
        src.close()


def _with_agent(sample, rounds: int, drain: str, steps: int) -> tuple[dict, float]:
    """A, C and CP interleaved while a BPF source with the USDT probes watches this process, drained by
    another process (``drain="process"``) or a thread of this one; returns the series and the reader
    process's CPU µs per step of C beyond its idle polling during A (0 for a thread: its CPU is in C's)."""
    configs = {"A": lambda: sample("A"), "C": lambda: sample("C"), "CP": lambda: sample("CP")}
    if drain == "process":
        import multiprocessing as mp

        parent, child = mp.Pipe()
        proc = mp.get_context("spawn").Process(target=_reader, args=(os.getpid(), child), daemon=True)
        proc.start()
        parent.recv()  # attached
        reader: dict[str, list[float]] = {}

        def cpu() -> int:
            parent.send("cpu")
            return parent.recv()

        def measured(name: str) -> float:
            # the reader's CPU over the sample and the reading of its events (60 ms after: a poll at most)
            t0 = cpu()
            value = sample(name)
            time.sleep(0.06)
            reader.setdefault(name, []).append((cpu() - t0) / (steps + 3) / 1e3)
            return value

        try:
            out = common.interleave({n: (lambda n=n: measured(n)) for n in configs}, rounds, progress=False)
        finally:
            parent.send("stop")
            proc.join(5)
        med = {n: statistics.median(v) for n, v in reader.items()}
        common.console.print(
            "reader process CPU µs per step (median; warm steps and 60 ms of reading after each sample "
            "included): " + ", ".join(f"{n} {v:.0f}" for n, v in med.items())
        )
        return out, med["C"] - med["A"]  # the idle polling (A: no events) is the agent's, not the step's

    from obshub.core.settings import load_settings
    from obshub.instrument import usdt
    from obshub.producer.loader import BpfEventSource
    from obshub.producer.probes import ProbeOptions, Target

    src = BpfEventSource(
        load_settings(),
        Target(pids={os.getpid()}),
        ProbeOptions(probes=("pytorch",), usdt_library=usdt.library_path(), sysfs=False),
    )
    src.start()
    stop = threading.Event()

    def drain_loop():
        while not stop.is_set():
            src.poll(50)

    th = threading.Thread(target=drain_loop, daemon=True)
    th.start()
    try:
        return common.interleave(configs, rounds, progress=False), 0.0
    finally:
        stop.set()
        th.join(2)
        src.close()


def common_free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    raise SystemExit(main())
