"""Does the agent's rank watch know how a rank ended, however soon its parent reaps it? (issue #30's
cancelled job; docs/AGENT.md "Rank liveness", docs/BENCHMARKS.md 9)

A scheduler's cancel (SIGTERM to every rank) must not be paged as a hang, so an exited ``RANK_STATE`` carries
the signal or exit code that ended the rank. The zombie's ``/proc/<pid>/stat`` holds it only until the parent
reaps it; the scheduler layer's ``sched_process_exit`` handler (obshub/bpf/sched.c ``obs_note_exit``) records it
in the kernel at the exit. Each try here: a parent process starts a rank (``sleep 60``) and either polls it
(``--parents poll``: ``Popen.poll()`` every ``--poll-s``, as a launcher that monitors its workers) or blocks in
``waitpid`` (``block``: ``Popen.wait()``, a shell's ``wait``); the rank is watched by this process as the agent
watches it (a ``RankWatch`` at the agent's 0.25 s interval, its ``kernel_status`` the BPF source's
``exit_status`` where the code has one, the ``sched`` probe attached with the rank's pid as target), is
SIGTERMed, and the exited event's payload is checked for ``signal`` 15. Printed: per parent kind, how many
tries carried it. Run it with another tree's obshub first on ``PYTHONPATH`` to measure that tree (a tree
without ``exit_status`` reads /proc only); ``--no-kernel`` measures the /proc read alone on this one.

``--cost`` also measures what ``obs_sched_exit`` costs per run (kernel BPF statistics, ``run_time_ns`` /
``run_cnt`` of its fd; ``kernel.bpf_stats_enabled`` set to 1 and put back): ``--cost-n`` exits of unwatched
processes (a shell loop of ``/bin/true``: every process exit on the machine runs it) and of threads of a
watched process (it starts and joins ``--cost-n`` threads), each a median over 3 rounds. Needs root.

    flock /tmp/obshub-heavy.lock python -m bench.exit_race --tries 20 --cost
    cd <base tree> && PYTHONPATH=. flock /tmp/obshub-heavy.lock python <this tree>/bench/exit_race.py --tries 20 --cost
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

PARENT = """
import subprocess, sys, time
mode, poll_s = sys.argv[1], float(sys.argv[2])
p = subprocess.Popen(["sleep", "60"])
print(p.pid, flush=True)
if mode == "block":
    p.wait()
else:
    while p.poll() is None:
        time.sleep(poll_s)
print(p.returncode, flush=True)
"""

THREADS = """
import sys, threading
sys.stdin.readline()
for _ in range(int(sys.argv[1])):
    t = threading.Thread(target=int)
    t.start()
    t.join()
"""

STATS = Path("/proc/sys/kernel/bpf_stats_enabled")


def prog_stats(fd: int) -> tuple[int, int]:
    """``(run_time_ns, run_cnt)`` of the BPF program behind ``fd`` (0, 0 without kernel BPF statistics)."""
    got = {}
    for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines():
        key, _, val = line.partition(":")
        if key in ("run_time_ns", "run_cnt"):
            got[key] = int(val)
    return got.get("run_time_ns", 0), got.get("run_cnt", 0)


def one_try(src, pids: set[int], mode: str, poll_s: float, use_kernel: bool) -> dict:
    """One rank, SIGTERMed, under a parent of kind ``mode``: the exited event's payload and the parent's
    view of the return code."""
    from obshub.producer.rankstate import EXITED, RankWatch

    watch = RankWatch()  # the agent's interval (0.25 s)
    if use_kernel:
        watch.kernel_status = getattr(src, "exit_status", None)
    parent = subprocess.Popen([sys.executable, "-c", PARENT, mode, str(poll_s)], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    pid = int(parent.stdout.readline())
    pids.add(pid)
    try:
        end = time.monotonic() + 0.3  # the source's target refresh (20 ms) writes it to the watched map
        while time.monotonic() < end:
            src.poll(10)
        watch.poll([pid])
        os.kill(pid, signal.SIGTERM)
        events: list = []
        end = time.monotonic() + 5
        while not events and time.monotonic() < end:
            src.poll(10)
            events = [e for e in watch.poll([pid]) if e.value == EXITED]
        rc = int(parent.stdout.readline())
        parent.wait(10)
    finally:
        pids.discard(pid)
        if parent.poll() is None:
            parent.kill()
            parent.wait()
    return {"payload": events[0].payload if events else None, "parent_rc": rc}


def cost(src, pids: set[int], n: int) -> dict:
    """ns per run of obs_sched_exit for unwatched process exits and for a watched process's thread exits
    (medians over 3 rounds)."""
    fd = src._bpf.funcs[b"obs_sched_exit"].fd  # noqa: SLF001 - the bench reads the agent program's statistics
    out: dict[str, list[float]] = {"unwatched_ns": [], "watched_threads_ns": []}
    for _ in range(3):
        t0, c0 = prog_stats(fd)
        subprocess.run(["sh", "-c", f"i=0; while [ $i -lt {n} ]; do /bin/true; i=$((i+1)); done"], check=True)
        t1, c1 = prog_stats(fd)
        out["unwatched_ns"].append((t1 - t0) / max(1, c1 - c0))
        child = subprocess.Popen([sys.executable, "-c", THREADS, str(n)], stdin=subprocess.PIPE, text=True)
        assert child.stdin is not None
        pids.add(child.pid)
        end = time.monotonic() + 0.3
        while time.monotonic() < end:
            src.poll(10)
        t0, c0 = prog_stats(fd)
        child.stdin.write("go\n")
        child.stdin.close()
        child.wait(60)
        t1, c1 = prog_stats(fd)
        pids.discard(child.pid)
        out["watched_threads_ns"].append((t1 - t0) / max(1, c1 - c0))
        src.poll(0)
    return {k: round(statistics.median(v), 1) for k, v in out.items()} | {"rounds": out}


def _count(floor: int):
    def conv(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if n < floor:
            raise argparse.ArgumentTypeError(f"{n} is below {floor}")
        return n

    return conv


def _seconds(text: str) -> float:
    try:
        s = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < s <= 10:
        raise argparse.ArgumentTypeError(f"{text!r}: seconds above 0, at most 10")
    return s


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; bad input exits 2 naming the option (argparse), before any BPF is compiled."""
    ap = argparse.ArgumentParser(prog="python -m bench.exit_race", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tries", type=_count(1), default=20, help="tries per parent kind (default 20)")
    ap.add_argument("--parents", default="poll,block", help="parent kinds, comma-separated: poll, block")
    ap.add_argument("--poll-s", type=_seconds, default=0.1, help="the polling parent's interval (default 0.1 s)")
    ap.add_argument("--no-kernel", action="store_true", help="read /proc only (the kernel's record unused)")
    ap.add_argument("--cost", action="store_true", help="also measure obs_sched_exit's run time per run")
    ap.add_argument("--cost-n", type=_count(1), default=1000, help="exits per cost round (default 1000)")
    ap.add_argument("--json", type=Path, help="write the results here")
    a = ap.parse_args(argv)
    kinds = [k for k in a.parents.split(",") if k]
    bad = [k for k in kinds if k not in ("poll", "block")]
    if not kinds or bad:
        ap.error(f"--parents {a.parents!r}: comma-separated kinds of poll, block")
    a.parents = kinds
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if os.geteuid() != 0:
        print("needs root (BPF)", file=sys.stderr)
        return 2
    import obshub
    from obshub.core.settings import load_settings
    from obshub.producer.loader import BpfEventSource
    from obshub.producer.probes import ProbeOptions, Target

    pids: set[int] = {os.getpid()}
    src = BpfEventSource(
        load_settings(), Target(pids=pids), ProbeOptions(probes=("sched",), sysfs=False, target_refresh_ms=20)
    )
    kernel = hasattr(src, "exit_status") and not a.no_kernel
    res: dict = {
        "obshub": str(Path(obshub.__file__).parent),
        "kernel_record": kernel,
        "load": os.getloadavg(),
        "start": time.strftime("%H:%M:%S", time.gmtime()),
    }
    stats_was = STATS.read_text().strip()
    try:
        table = src.start()
        if not all(s.attached for s in table):
            raise SystemExit(f"sched did not attach: {[s.reason for s in table]}")
        for mode in a.parents:
            tries = [one_try(src, pids, mode, a.poll_s, kernel) for _ in range(a.tries)]
            known = sum(1 for t in tries if t["payload"] and t["payload"].get("signal") == 15)
            wrong = sum(1 for t in tries if t["payload"] and set(t["payload"]) - {"state", "signal"})
            wrong += sum(1 for t in tries if t["payload"] and t["payload"].get("signal") not in (None, 15))
            res[mode] = {
                "known": known,
                "tries": len(tries),
                "wrong": wrong,
                "missed": sum(not t["payload"] for t in tries),
            }
            print(f"parent {mode}: SIGTERM known {known}/{len(tries)}, wrong {wrong}", flush=True)
        if a.cost:
            STATS.write_text("1")
            res["cost"] = cost(src, pids, a.cost_n)
            c = res["cost"]
            print(f"obs_sched_exit: {c['unwatched_ns']} ns per unwatched exit, "
                  f"{c['watched_threads_ns']} ns per watched thread exit", flush=True)  # fmt: skip
    finally:
        STATS.write_text(stats_was)
        src.close()
    res["end"] = time.strftime("%H:%M:%S", time.gmtime())
    res["load_end"] = os.getloadavg()
    print(json.dumps(res))
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
