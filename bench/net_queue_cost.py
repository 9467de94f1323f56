"""What the agent's ``net_queue`` probe costs (issue #30; docs/BENCHMARKS.md 8): TCP traffic through a
qdisc with and without the probe attached, side by side in one run.

The probe (``obs_qdisc_dequeue`` on ``qdisc:qdisc_dequeue``, obshub/bpf/net.c) runs once per skb any
qdisc of the machine dequeues: two field reads of the sk_buff and one ``socks`` look-up, and for a
watched socket's segment the clock and its threshold. Two network namespaces (``obnq-a``, ``obnq-b``)
joined by a veth pair; the sender's end gets each qdisc in turn as its root (``pfifo_fast``,
``fq_codel`` where the kernel has it, and a ``tbf`` at ``--tbf-rate`` that holds segments; a veth has no
queue of its own), and a sender process (namespace a) sends ``--mb`` MiB (``--tbf-mb`` through the tbf) over one TCP connection
to a receiver process (namespace b). The agent's own BPF source (``producer.loader.BpfEventSource``,
every process watched, so the sender's socket is in ``socks`` and each segment is a hit) runs with the
network probes that attribute sockets and read RTTs (``net_sock_state``, ``net_rtt``) plus ``net_queue``;
between transfers the bench detaches and re-attaches the ``qdisc:qdisc_dequeue`` tracepoint, in the order
off, on, on, off per round.

Per transfer: the packets the qdisc sent (``tc -s``; an empty ``pfifo_fast`` may hand a segment straight
to the device, ``TCQ_F_CAN_BYPASS``, without a dequeue, and one dequeue may take several packets: the
probe's runs are counted, not assumed),
the CPU time of the sender and the receiver (``wait4`` rusage, user + system: the veth's transmit and
receive run in their contexts), and with the probe on its own run time and runs from the kernel's BPF
statistics (``kernel.bpf_stats_enabled`` set to 1 for the run and put back after; ``run_time_ns`` /
``run_cnt`` of the program's fd in ``/proc/self/fdinfo``; the statistics' own two clock reads are in
it). Prints per qdisc: ns per probe run, runs per MiB, CPU ms per MiB off and on (medians over the rounds),
and the probe's share of the transfer's CPU time. A qdisc the kernel refuses is skipped with tc's reason;
when every one given is (``--qdiscs fq_codel`` on a kernel without it), the run exits 1 saying why, before
the BPF compilation. Needs root (namespaces, BPF).

    python -m bench.net_queue_cost                        # 3 rounds, 512 MiB (tbf: 64 MiB at 1 Gbit/s)
    python -m bench.net_queue_cost --rounds 5 --mb 1024 --qdiscs fq_codel,tbf
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench import common

NS_A, NS_B = "obnq-a", "obnq-b"
VETH_A, VETH_B = "obnqa0", "obnqb0"
IP_A, IP_B = "10.203.77.1", "10.203.77.2"
PORT = 47123
TP = b"qdisc:qdisc_dequeue"
FN = b"obs_qdisc_dequeue"
PROBES = ("net_sock_state", "net_rtt", "net_queue")
CHUNK = 1 << 16

_RECV = f"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("{IP_B}", {PORT})); s.listen(1)
print("ready", flush=True)
c, _ = s.accept()
buf = bytearray({CHUNK}); n = 0
while True:
    k = c.recv_into(buf)
    if not k:
        break
    n += k
print(n, flush=True)
"""

_SEND = f"""
import socket, sys
total = int(sys.argv[1]) << 20
c = socket.create_connection(("{IP_B}", {PORT})); data = bytes({CHUNK}); sent = 0
while sent < total:
    c.sendall(data); sent += {CHUNK}
c.shutdown(socket.SHUT_WR); c.recv(1); c.close()
"""


def _sh(*cmd: str, check: bool = True) -> str:
    """Run a command; its stdout. Raises RuntimeError with its stderr when ``check`` and it fails."""
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def setup() -> None:
    """The two namespaces and the veth pair (removed first when a previous run left them)."""
    teardown()
    _sh("ip", "netns", "add", NS_A)
    _sh("ip", "netns", "add", NS_B)
    _sh("ip", "link", "add", VETH_A, "netns", NS_A, "type", "veth", "peer", "name", VETH_B, "netns", NS_B)
    for ns, dev, ip in ((NS_A, VETH_A, IP_A), (NS_B, VETH_B, IP_B)):
        _sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
        _sh("ip", "-n", ns, "link", "set", dev, "up")
        _sh("ip", "-n", ns, "link", "set", "lo", "up")


def teardown() -> None:
    """Remove the namespaces (the veth pair goes with them); no error when they are absent."""
    for ns in (NS_A, NS_B):
        _sh("ip", "netns", "del", ns, check=False)


def set_qdisc(spec: list[str]) -> None:
    """Make ``spec`` (tc's words after ``root``) the root qdisc of the sender's veth end."""
    _sh("ip", "netns", "exec", NS_A, "tc", "qdisc", "replace", "dev", VETH_A, "root", *spec)


def qdisc_packets() -> int:
    """Packets the sender's root qdisc has sent so far (``tc -s``), dequeued or bypassed."""
    out = _sh("ip", "netns", "exec", NS_A, "tc", "-s", "qdisc", "show", "dev", VETH_A)
    m = re.search(r"Sent \d+ bytes (\d+) pkt", out)
    if m is None:
        raise RuntimeError(f"tc -s qdisc show dev {VETH_A}: no 'Sent' line in {out!r}")
    return int(m.group(1))


def prog_stats(fd: int) -> tuple[int, int]:
    """``(run_time_ns, run_cnt)`` of the BPF program behind ``fd`` (0, 0 without kernel BPF statistics)."""
    text = Path(f"/proc/self/fdinfo/{fd}").read_text()
    got = dict(re.findall(r"^(run_time_ns|run_cnt):\s+(\d+)$", text, re.M))
    return int(got.get("run_time_ns", 0)), int(got.get("run_cnt", 0))


def transfer(mb: int) -> tuple[float, float]:
    """Send ``mb`` MiB from namespace a to b: ``(wall seconds, CPU seconds of sender + receiver)``. Raises
    RuntimeError when a side fails or the receiver counted another size."""
    py = sys.executable
    recv = subprocess.Popen(["ip", "netns", "exec", NS_B, py, "-c", _RECV], stdout=subprocess.PIPE, text=True)
    assert recv.stdout is not None
    if recv.stdout.readline().strip() != "ready":
        raise RuntimeError("the receiver did not start")
    t0 = time.perf_counter()
    send = subprocess.Popen(["ip", "netns", "exec", NS_A, py, "-c", _SEND, str(mb)])
    cpu = 0.0
    for p in (send, recv):
        _pid, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        cpu += ru.ru_utime + ru.ru_stime
    wall = time.perf_counter() - t0
    got = recv.stdout.read().strip()
    if send.returncode or recv.returncode or got != str(mb << 20):
        raise RuntimeError(
            f"transfer of {mb} MiB: sender exit {send.returncode}, receiver {recv.returncode}, got {got!r}"
        )
    return wall, cpu


QDISCS = ("pfifo_fast", "fq_codel", "tbf")
"""The root qdiscs the bench can give the sender's veth end, in the order it measures them."""

_TC_RATE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(?:[kmgt]i?)?(?:bit|bps)?", re.I)


def tc_rate(text: str) -> str:
    """argparse type of ``--tbf-rate``: a rate in tc's words (a number above 0 with an optional unit:
    ``bit``, ``kbit``, ``mbit``, ``gbit``, ``tbit``, the ``...bps`` bytes forms, ``Ki``/``Mi``... prefixes),
    returned as written. Checked before the set-up and the BPF compilation: tc would refuse it only when
    the tbf is set, which the bench reports as a qdisc the kernel lacks. Raises argparse.ArgumentTypeError."""
    m = _TC_RATE.fullmatch(text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a rate in tc's words (e.g. 1gbit, 500mbit, 10mbps)")
    if float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a tbf's rate must be above 0")
    return text.strip()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked: ``--rounds``, ``--mb``, ``--tbf-mb`` whole numbers of 1 or more,
    ``--tbf-rate`` a tc rate above 0 (``tc_rate``), ``--qdiscs`` one or more of ``QDISCS``, each once (as
    ``names``, a list in the order given). Exits 2 with a message naming the option on anything else
    (argparse), before anything is set up."""
    p = argparse.ArgumentParser(
        prog="python -m bench.net_queue_cost", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--rounds", type=common.positive_int, default=3, help="rounds of off, on, on, off per qdisc (default 3)"
    )
    p.add_argument("--mb", type=common.positive_int, default=512, help="MiB per transfer (default 512)")
    p.add_argument(
        "--tbf-mb", type=common.positive_int, default=64, help="MiB per transfer through the tbf (default 64)"
    )
    p.add_argument(
        "--tbf-rate", type=tc_rate, default="1gbit", help="the tbf's rate in tc's words, e.g. 500mbit (default 1gbit)"
    )
    p.add_argument(
        "--qdiscs",
        default=",".join(QDISCS),
        help="comma-separated, of pfifo_fast, fq_codel, tbf (default all three; one the kernel lacks is skipped)",
    )
    a = p.parse_args(argv)
    a.names = [q.strip() for q in a.qdiscs.split(",") if q.strip()]
    bad = [q for q in a.names if q not in QDISCS]
    if bad:
        p.error(f"--qdiscs: unknown {', '.join(bad)} (known: {', '.join(QDISCS)})")
    if not a.names:
        p.error(f"--qdiscs: no qdisc given (one or more of {', '.join(QDISCS)})")
    twice = sorted({q for q in a.names if a.names.count(q) > 1})
    if twice:
        p.error(f"--qdiscs: {', '.join(twice)} given twice (each qdisc is measured once per round)")
    if os.geteuid() != 0:
        p.error("needs root (network namespaces, BPF)")
    return a


def usable_qdiscs(names: list[str], specs: dict[str, list[str]]) -> dict[str, str]:
    """Set each of ``names`` in turn as the sender's root qdisc (the namespaces are set up): the ones this
    kernel refuses, each with tc's reason (``fq_codel: ... Error: Specified qdisc kind is unknown.`` on a
    kernel built without sch_fq_codel), as ``{name: reason}``; empty when every one can be set."""
    skipped = {}
    for q in names:
        try:
            set_qdisc(specs[q])
        except RuntimeError as exc:
            skipped[q] = str(exc)
    return skipped


def nothing_measured(skipped: dict[str, str]) -> str:
    """Why a run measured no qdisc, for its exit 1: each skipped qdisc and tc's reason, and what to try."""
    whys = "; ".join(f"{q} skipped ({why})" for q, why in skipped.items())
    known = ",".join(q for q in QDISCS if q not in skipped)
    return f"every qdisc given was skipped: {whys}" + (f"; try --qdiscs {known}" if known else "")


def main(argv: list[str] | None = None) -> int:
    """Run the bench; 0 when at least one qdisc was measured, 1 when every qdisc given was skipped (each
    named with tc's reason on stderr, before the BPF compilation), 2 on bad arguments (``parse_args``)."""
    a = parse_args(argv)
    specs = {
        "pfifo_fast": ["pfifo_fast"],
        "fq_codel": ["fq_codel"],
        "tbf": ["tbf", "rate", a.tbf_rate, "burst", "256kb", "latency", "200ms"],
    }
    names = a.names

    from obshub.core.settings import load_settings
    from obshub.producer.loader import BpfEventSource
    from obshub.producer.probes import ProbeOptions, Target

    stats_was = Path("/proc/sys/kernel/bpf_stats_enabled").read_text().strip()
    rows: dict[str, dict[str, list[float]]] = {}
    setup()
    skipped = usable_qdiscs(names, specs)
    names = [q for q in names if q not in skipped]
    if not names:  # nothing to measure: say why, before the BPF program is compiled and loaded, and fail
        teardown()
        for q, why in skipped.items():
            common.console.print(f"[yellow]{q}: skipped: {why}[/yellow]")
        print(f"nothing measured: {nothing_measured(skipped)}", file=sys.stderr)
        return 1
    src = BpfEventSource(load_settings(), Target(), ProbeOptions(probes=PROBES, sysfs=False))
    try:
        table = src.start()
        why = [s.reason for s in table if s.name == "net_queue" and not s.attached]
        if why:
            raise SystemExit(f"net_queue did not attach: {why[0]}")
        bpf = src._bpf  # noqa: SLF001 - the bench toggles one tracepoint of the agent's own program
        fd = bpf.funcs[FN].fd
        Path("/proc/sys/kernel/bpf_stats_enabled").write_text("1")
        attached = True
        for q in names:
            try:
                set_qdisc(specs[q])
            except RuntimeError as exc:  # it could be set a moment ago (usable_qdiscs): name it all the same
                skipped[q] = str(exc)
                continue
            mb = a.tbf_mb if q == "tbf" else a.mb
            r = rows[q] = {k: [] for k in ("off_cpu", "on_cpu", "off_wall", "on_wall", "ns", "runs", "pkts")}
            transfer(min(mb, 16))  # warm-up (connection set-up paths, page cache of the interpreter)
            for rnd in range(a.rounds):
                for on in (False, True, True, False):
                    if on != attached:
                        if on:
                            bpf.attach_tracepoint(tp=TP, fn_name=FN)
                        else:
                            bpf.detach_tracepoint(TP)
                        attached = on
                    pk0, (t0, n0) = qdisc_packets(), prog_stats(fd)
                    wall, cpu = transfer(mb)
                    pk1, (t1, n1) = qdisc_packets(), prog_stats(fd)
                    src.poll(0)  # keep the ring drained
                    key = "on" if on else "off"
                    r[f"{key}_cpu"].append(cpu * 1e3 / mb)
                    r[f"{key}_wall"].append(mb / wall)
                    r["pkts"].append((pk1 - pk0) / mb)
                    if on:
                        r["ns"].append((t1 - t0) / max(1, n1 - n0))
                        r["runs"].append((n1 - n0) / mb)
                common.console.print(f"[dim]{q}: round {rnd + 1}/{a.rounds} done[/dim]")
    finally:
        Path("/proc/sys/kernel/bpf_stats_enabled").write_text(stats_was)
        src.close()
        teardown()

    for q, why in skipped.items():
        common.console.print(f"[yellow]{q}: skipped: {why}[/yellow]")
    if not rows:
        print(f"nothing measured: {nothing_measured(skipped)}", file=sys.stderr)
        return 1

    from rich.table import Table

    t = Table(title=f"net_queue probe cost, {a.rounds} round(s) of off/on/on/off, medians (MiB/s: the transfer's)")
    for col in (
        "qdisc",
        "MiB",
        "packets through the qdisc /MiB",
        "probe runs /MiB",
        "ns / probe run",
        "CPU ms/MiB off",
        "CPU ms/MiB on",
        "probe share of CPU on",
        "MiB/s off",
        "MiB/s on",
    ):
        t.add_column(col, justify="right")
    med = statistics.median
    for q, r in rows.items():
        share = med(r["ns"]) * med(r["runs"]) / 1e6 / med(r["on_cpu"]) if med(r["on_cpu"]) else 0.0
        t.add_row(
            q,
            str(a.tbf_mb if q == "tbf" else a.mb),
            f"{med(r['pkts']):.1f}",
            f"{med(r['runs']):.1f}",
            f"{med(r['ns']):.0f}",
            f"{med(r['off_cpu']):.3f}",
            f"{med(r['on_cpu']):.3f}",
            f"{share:.3%}",
            f"{med(r['off_wall']):.0f}",
            f"{med(r['on_wall']):.0f}",
        )
    common.console.print(t)
    for q, r in rows.items():
        common.console.print(
            f"[dim]{q}: CPU ms/MiB off {', '.join(f'{x:.3f}' for x in r['off_cpu'])}; "
            f"on {', '.join(f'{x:.3f}' for x in r['on_cpu'])}; ns/run {', '.join(f'{x:.0f}' for x in r['ns'])}[/dim]"
        )
    common.console.print(f"[dim]{common.describe_machine()}[/dim]")
    path = common.save("net_queue_cost", {"args": vars(a), "rows": rows})
    common.console.print(f"[dim]raw results: {path}[/dim]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
