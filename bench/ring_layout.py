"""Ring-buffer layout: one ring shared by every CPU, or one ring per CPU? Measured with producers on both
CPUs of this machine.

Producers: bench/firehose.c processes in burst mode (``fire_burst(first, n)``), one pinned to each CPU;
a uprobe handler (the same reservation, fill and submit as the agent's handlers, bench/firehose_burst.c's
loop) writes n 176-byte ``struct obs_event`` records per call. Layouts, each its own BPF program:

- ``shared``: one BPF ring buffer (16 MiB) that every CPU reserves in - the agent's layout;
- ``per-cpu``: one ring buffer per CPU (8 MiB each, selected by ``bpf_get_smp_processor_id()``), as an
  array-of-maps of rings would do on a large host.

The consumer is ``producer._ring.Ring`` (the agent's batch reader) in this process, draining every ring in
turn, pinned to the first CPU. Per layout and number of producers: records delivered per second, records
lost (failed reservations), and the producers' CPU per record (their system time is the handler's: the
uprobe trap, reservation, fill, submit). The ring's cost of contention is the difference between one and
two producers in the shared layout, against the same difference with a ring per CPU.

    python -m bench.ring_layout              # 3 rounds of 2 s per configuration
    python -m bench.ring_layout --quick      # 1 round of 1 s
"""

from __future__ import annotations

import argparse
import os
import select
import statistics
import subprocess
import tempfile
from pathlib import Path

from rich.table import Table

from bench import common
from bench.agent_throughput import build_firehose
from bench.broker import bpf_unavailable

RATE = 600_000  # records/s offered per producer
BURST = 64
SECONDS, QUICK_SECONDS = 2.0, 1.0
ROUNDS, QUICK_ROUNDS = 3, 1

_PROGRAM = r"""
#include <uapi/linux/ptrace.h>
struct rec { u64 ts_ns, duration_ns, trace_key; s64 step, value; u64 arg0, arg1, arg2; u32 pid, tid;
             u16 kind, probe; u32 arg3; char str0[64]; char str1[32]; };
BPF_ARRAY(lost, u64, NRINGS);
RINGS
static __always_inline struct rec *reserve(u32 ring)
{
    struct rec *e = RESERVE;
    if (!e) {
        u64 *n = lost.lookup(&ring);
        if (n)
            __sync_fetch_and_add(n, 1);
    }
    return e;
}
int burst(struct pt_regs *ctx)
{
    s64 first = (s64)PT_REGS_PARM1(ctx);
    u32 n = (u32)PT_REGS_PARM2(ctx);
    u32 ring = NRINGS == 1 ? 0 : bpf_get_smp_processor_id() % NRINGS;
    u64 id = bpf_get_current_pid_tgid();
    for (u32 i = 0; i < 64; i++) {
        if (i >= n)
            break;
        struct rec *e = reserve(ring);
        if (!e)
            continue;
        __builtin_memset(e, 0, sizeof(*e));
        e->ts_ns = bpf_ktime_get_ns();
        e->kind = 11;
        e->pid = id >> 32;
        e->tid = (u32)id;
        e->step = first + i;
        e->value = first + i;
        SUBMIT;
    }
    return 0;
}
"""


def _source(nrings: int, pages: int) -> str:
    if nrings == 1:
        rings = f"BPF_RINGBUF_OUTPUT(ring0, {pages});"
        reserve = "ring0.ringbuf_reserve(sizeof(struct rec))"
        submit = "ring0.ringbuf_submit(e, BPF_RB_NO_WAKEUP)"
    else:
        rings = "\n".join(f"BPF_RINGBUF_OUTPUT(ring{i}, {pages});" for i in range(nrings))
        reserve = (
            "("
            + " : ".join(f"ring == {i} ? ring{i}.ringbuf_reserve(sizeof(struct rec))" for i in range(nrings - 1))
            + f" : ring{nrings - 1}.ringbuf_reserve(sizeof(struct rec)))"
        )
        submit = (
            "; ".join(f"if (ring == {i}) ring{i}.ringbuf_submit(e, BPF_RB_NO_WAKEUP)" for i in range(nrings - 1))
            + f"; if (ring == {nrings - 1}) ring{nrings - 1}.ringbuf_submit(e, BPF_RB_NO_WAKEUP)"
        )
    return (
        _PROGRAM.replace("NRINGS", str(nrings))
        .replace("RINGS", rings, 1)
        .replace("RESERVE", reserve)
        .replace("SUBMIT", submit)
    )


def measure(exe: Path, nrings: int, producers: list[int], seconds: float, consumer_cpu: int) -> dict:
    """One configuration: ``nrings`` rings, one firehose per CPU in ``producers``. Returns delivered/s,
    lost, producers' CPU ns per record."""
    import ctypes

    from bcc import BPF

    from obshub.core.settings import load_settings
    from obshub.producer import kheaders
    from obshub.producer._ring import Ring

    kheaders.apply_env(load_settings())  # BCC_KERNEL_SOURCE: the kernel headers bcc compiles with

    page = os.sysconf("SC_PAGE_SIZE")
    pages = 4096 // nrings
    gens = [
        subprocess.Popen(
            [str(exe)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=lambda c=c: os.sched_setaffinity(0, {c}),
        )
        for c in producers
    ]
    b = BPF(text=_source(nrings, pages))
    try:
        b.attach_uprobe(name=str(exe), sym="fire_burst", fn_name="burst")
        rings = [Ring(b[f"ring{i}".encode()].map_fd, pages * page) for i in range(nrings)]
        table = bytes([1]) * 256  # every record packed in C (nil payload): the cheapest consumer
        os.sched_setaffinity(0, {consumer_cpu})
        for g in gens:
            g.stdin.write(f"{RATE} {seconds} {BURST}\n")
            g.stdin.flush()
        got = 0
        replies: dict[int, list[str]] = {}
        while len(replies) < len(gens):  # drain until every producer answered "fired N in S s cpu C"
            n = 0
            for r in rings:
                for item in r.drain(table, 1 << 16):
                    n += len(item[1]) // 4
            got += n
            ready, _, _ = select.select([g.stdout for g in gens if g.pid not in replies], [], [], 0 if n else 0.001)
            for g in gens:
                if g.stdout in ready:
                    replies[g.pid] = g.stdout.readline().split()
        replies = list(replies.values())
        for r in rings:
            for item in r.drain(table, 1 << 20):
                got += len(item[1]) // 4
        lost = sum(b[b"lost"][ctypes.c_int(i)].value for i in range(nrings))
        fired = sum(int(x[1]) for x in replies)
        elapsed = max(float(x[3]) for x in replies)
        gen_cpu = sum(float(x[6]) for x in replies)
        for r in rings:
            r.close()
    finally:
        for g in gens:
            try:
                g.stdin.write("quit\n")
                g.stdin.flush()
            except OSError:
                pass
            g.wait(5)
        b.cleanup()
    return {
        "rings": nrings,
        "producers": len(producers),
        "fired": fired,
        "delivered": got,
        "lost": lost,
        "seconds": elapsed,
        "delivered_per_s": got / elapsed,
        "offered_per_s": fired / elapsed,
        "producer_ns_per_record": gen_cpu * 1e9 / max(fired, 1),
        "exact": got + lost == fired,
    }


def run(quick: bool = False) -> dict:
    """Run every configuration ``rounds`` times, print the table, save the JSON."""
    common.console.rule("[bold]ring-buffer layout[/bold]: one shared ring or one per CPU, producers on both CPUs")
    no_bpf = bpf_unavailable()
    if no_bpf:
        common.console.print(f"[yellow]skipped: {no_bpf}[/yellow]")
        return {"skipped": no_bpf}
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        common.console.print("[yellow]skipped: needs 2 CPUs[/yellow]")
        return {"skipped": "needs 2 CPUs"}
    seconds, rounds = (QUICK_SECONDS, QUICK_ROUNDS) if quick else (SECONDS, ROUNDS)
    configs = {
        "shared ring, 1 producer": (1, [cpus[1]]),
        "shared ring, 2 producers": (1, cpus[:2]),
        "ring per CPU, 1 producer": (2, [cpus[1]]),
        "ring per CPU, 2 producers": (2, cpus[:2]),
    }
    rows: dict[str, list[dict]] = {k: [] for k in configs}
    with tempfile.TemporaryDirectory(prefix="obshub-bench-ring-") as tmp:
        exe = build_firehose(Path(tmp))
        for _ in range(rounds):
            for name, (nrings, prods) in configs.items():
                r = measure(exe, nrings, prods, seconds, cpus[0])
                rows[name].append(r)
                common.console.print(
                    f"[dim]  {name}: {r['delivered_per_s']:,.0f} records/s delivered, lost "
                    f"{r['lost']:,}, producers {r['producer_ns_per_record']:.0f} ns/record[/dim]"
                )
    t = Table(
        title=f"producers offer {RATE:,} records/s each in bursts of {BURST}; consumer: producer._ring on "
        f"CPU {cpus[0]}; {rounds} rounds of {seconds:.0f} s (medians)",
        caption=common.describe_machine(),
    )
    for col in ("layout", "offered/s", "delivered/s", "lost", "producer ns per record", "lost + delivered = fired"):
        t.add_column(col)
    summary = {}
    for name, rs in rows.items():
        med = {
            k: statistics.median(r[k] for r in rs)
            for k in ("offered_per_s", "delivered_per_s", "lost", "producer_ns_per_record")
        }
        summary[name] = med
        t.add_row(
            name,
            f"{med['offered_per_s']:,.0f}",
            f"{med['delivered_per_s']:,.0f}",
            f"{med['lost']:,.0f}",
            f"{med['producer_ns_per_record']:.0f}",
            "yes" if all(r["exact"] for r in rs) else "no",
        )
    common.console.print(t)
    s1, s2 = summary["shared ring, 1 producer"], summary["shared ring, 2 producers"]
    p1, p2 = summary["ring per CPU, 1 producer"], summary["ring per CPU, 2 producers"]
    common.console.print(
        f"contention: a second producer on the shared ring changes the cost per record by "
        f"{(s2['producer_ns_per_record'] / s1['producer_ns_per_record'] - 1) * 100:+.1f} %, "
        f"with a ring per CPU by {(p2['producer_ns_per_record'] / p1['producer_ns_per_record'] - 1) * 100:+.1f} %"
    )
    result = {"rows": rows, "medians": summary, "rate_per_producer": RATE, "burst": BURST, "rev": common.git_rev()}
    common.console.print(f"raw results: {common.save('ring_layout', result)}")
    return result


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m bench.ring_layout [--quick]``."""
    p = argparse.ArgumentParser(
        prog="python -m bench.ring_layout", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="1 round of 1 s per configuration")
    run(p.parse_args(argv).quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
