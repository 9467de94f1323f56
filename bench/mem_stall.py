"""Can memory pressure in a rank's own memory cgroup stall it? (issue #30, the memory stall injector)

One rank of the demo's real training (``python -m obshub.workloads.ddp_train``, gloo, one process) runs in
a fresh cgroup v1 memory cgroup. After a warm-up, each method below applies memory pressure for
``--stall-ms`` (default 800), ``--stalls`` times (default 3), ``--gap-s`` apart; for each stall it prints
the rank's longest step (ms, the rank's own ``time_ms``) among the steps it reported from the stall's start
to 1 s after its end, against the median step before the first stall, and the cgroup's counters
(memory.stat ``pgmajfault``, ``memory.failcnt``, ``memory.oom_control`` ``under_oom``). A method that
stalls the rank for the asked length shows a longest step near ``--stall-ms``.

Methods (every one keeps the limit at or above the cgroup's anonymous memory: there is no swap, and
a limit below it is refused by the kernel (EBUSY) or kills the rank):

``file``   the demo's ``stall`` fault with ``layer=mem``: limit = anonymous memory (``rss``) + ``--room-mb``
           of page cache, and a process in the cgroup reading at random a file (``--file-mb``) larger than
           the room (reclaim and refaults of file pages: memcg reclaim in every charge)
``dirty``  the same limit, and a writer in the cgroup (``dd`` to a file on disk): dirty and writeback pages,
           which cgroup v1 reclaim waits for
``anon``   the same limit with the cgroup's OOM killer disabled (``memory.oom_control`` = 1), and a process
           in the cgroup touching anonymous memory until it fills the room: the cgroup is then under OOM and
           every task of it that charges a page sleeps in the cgroup's OOM wait queue until the limit is
           lifted (Documentation/admin-guide/cgroup-v1/memory.rst section 10)

Needs root and a cgroup v1 memory controller (/sys/fs/cgroup/memory). Not in ``python -m bench`` (it
measures the injector, not obshub). Run under the heavy-work lock::

    flock /tmp/obshub-heavy.lock python -m bench.mem_stall
    python -m bench.mem_stall --methods anon --stalls 2 --stall-ms 800 --room-mb 16
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import common

MEMCG_ROOT = Path("/sys/fs/cgroup/memory")
METHODS = ("file", "dirty", "anon")
ANON_HOG = "b=[]\nwhile True:\n    x=bytearray(1<<20)\n    for i in range(0,1<<20,4096): x[i]=1\n    b.append(x)\n"


def _stat(cg: Path) -> dict[str, int]:
    """memory.stat of the cgroup as ints (bytes or counts, as the kernel writes them)."""
    return {k: int(v) for k, v in (ln.split() for ln in (cg / "memory.stat").read_text().splitlines())}


def _under_oom(cg: Path) -> int:
    kv = dict(ln.split() for ln in (cg / "memory.oom_control").read_text().splitlines())
    return int(kv.get("under_oom", 0))


def _in_cgroup(cg: Path, argv: list[str], **kw) -> subprocess.Popen:
    """Start ``argv`` inside memory cgroup ``cg`` (the shell joins it, then execs)."""
    quoted = " ".join("'" + a.replace("'", "'\\''") + "'" for a in argv)
    return subprocess.Popen(["bash", "-c", f"echo $$ > {cg}/cgroup.procs; exec {quoted}"], **kw)


def run_method(method: str, stalls: int, stall_ms: float, gap_s: float, room_mb: int, file_mb: int, work: Path) -> dict:
    """One rank in a fresh memory cgroup under ``method``'s pressure ``stalls`` times; returns the baseline
    median step (ms), and per stall its longest step (ms) and counter deltas."""
    cg = MEMCG_ROOT / f"obshub-memstall-{os.getpid()}-{method}"
    cg.mkdir()
    rank = None
    times: list[tuple[float, float]] = []  # (monotonic s when read, the rank's step time ms)
    try:
        env = {**os.environ, "WORLD_SIZE": "1", "RANK": "0"}
        rank = _in_cgroup(
            cg,
            [sys.executable, "-m", "obshub.workloads.ddp_train", "--steps", "1000000"],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

        def read() -> None:
            for ln in rank.stdout:
                parts = ln.split()
                if len(parts) >= 6 and parts[0] == "step":
                    times.append((time.monotonic(), float(parts[-1])))

        threading.Thread(target=read, daemon=True).start()
        t_wait = time.monotonic() + 120
        while len(times) < 200 and time.monotonic() < t_wait:
            time.sleep(0.5)
        if len(times) < 200:
            raise RuntimeError(f"the rank reported {len(times)} steps in 120 s (needs 200 to warm up)")
        # shrink once and lift: the rank's start-up page cache is reclaimed outside the measured stalls
        st = _stat(cg)
        (cg / "memory.limit_in_bytes").write_text(str(st["rss"] + (room_mb << 20) * 4))
        (cg / "memory.limit_in_bytes").write_text("-1")
        time.sleep(2)
        base = statistics.median(d for _, d in times[-100:])
        if method == "file":
            data = work / "file.bin"
            with open(data, "wb") as f:
                chunk = os.urandom(1 << 20)
                for _ in range(file_mb):
                    f.write(chunk)
            fd = os.open(data, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
            from obshub.demo.faults import MEM_HOG

            hog_argv = [sys.executable, "-c", MEM_HOG, str(data), "0"]  # no anonymous memory: the room is for pages
        elif method == "dirty":
            hog_argv = ["dd", "if=/dev/zero", f"of={work / 'dirty.bin'}", "bs=1M", "count=100000", "status=none"]
        else:
            (cg / "memory.oom_control").write_text("1")
            hog_argv = [sys.executable, "-c", ANON_HOG]
        rows = []
        for _ in range(stalls):
            before = {**_stat(cg), "failcnt": int((cg / "memory.failcnt").read_text())}
            t0 = time.monotonic()
            (cg / "memory.limit_in_bytes").write_text(str(before["rss"] + (room_mb << 20)))
            hog = _in_cgroup(cg, hog_argv, stdout=subprocess.DEVNULL)
            under = 0
            t_end = t0 + stall_ms / 1e3
            while time.monotonic() < t_end:
                time.sleep(0.02)
                under = max(under, _under_oom(cg))
            hog.send_signal(signal.SIGKILL)
            (cg / "memory.limit_in_bytes").write_text("-1")
            hog.wait()
            t1 = time.monotonic()
            time.sleep(1.0)
            after = {**_stat(cg), "failcnt": int((cg / "memory.failcnt").read_text())}
            steps = [d for t, d in times if t0 <= t <= t1 + 1.0]
            # the longest time without a step reported (s): a rank stalled outside its timed loop body
            # (its stdout write) or in a step that ended after the window shows here
            seen = [t for t, _ in times if t0 - 1.0 <= t <= t1 + 1.0] or [t0]
            nxt = [t for t, _ in times if t > seen[-1]][:1]
            gaps = [b - a for a, b in zip(seen, seen[1:] + nxt)]
            rows.append(
                {
                    "longest_step_ms": max(steps) if steps else None,
                    "longest_gap_ms": round(max(gaps) * 1e3, 1) if gaps else None,
                    "steps": len(steps),
                    "pgmajfault": after["pgmajfault"] - before["pgmajfault"],
                    "failcnt": after["failcnt"] - before["failcnt"],
                    "under_oom": under,
                }
            )
            for p in work.glob("dirty.bin"):
                p.unlink()
            time.sleep(gap_s)
        return {"method": method, "median_step_ms": base, "stalls": rows}
    finally:
        if rank is not None:
            rank.kill()
            rank.wait()
        time.sleep(0.3)
        for _ in range(20):
            try:
                cg.rmdir()
                break
            except OSError:
                time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    """Parse options, run each method, print the table; 0 when every method ran, 2 on a usage error."""
    p = argparse.ArgumentParser(
        prog="python -m bench.mem_stall", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of {', '.join(METHODS)}")
    p.add_argument("--stalls", type=int, default=3, help="stalls per method (default 3)")
    p.add_argument("--stall-ms", type=float, default=800.0, help="length of each stall, ms (default 800)")
    p.add_argument("--gap-s", type=float, default=3.0, help="seconds between stalls (default 3)")
    p.add_argument("--room-mb", type=int, default=16, help="MB of the limit above the anonymous memory (16)")
    p.add_argument("--file-mb", type=int, default=256, help="MB of the file the `file` method reads (256)")
    a = p.parse_args(argv)
    methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        p.error(f"--methods {','.join(bad)}: unknown; use {', '.join(METHODS)}")
    if os.geteuid() != 0 or not (MEMCG_ROOT / "memory.limit_in_bytes").exists():
        p.error(f"needs root and a cgroup v1 memory controller at {MEMCG_ROOT}")
    common.console.print(f"[bold]memory stall methods[/bold] at {common.git_rev()}\n{common.describe_machine()}")
    results = []
    with tempfile.TemporaryDirectory(prefix="obshub-memstall-", dir="/var/tmp") as tmp:
        for m in methods:
            r = run_method(m, a.stalls, a.stall_ms, a.gap_s, a.room_mb, a.file_mb, Path(tmp))
            results.append(r)
            longest = [s["longest_step_ms"] for s in r["stalls"]]
            common.console.print(
                f"{m:<6} median step {r['median_step_ms']:.1f} ms; longest step per {a.stall_ms:.0f} ms stall: "
                + ", ".join("-" if x is None else f"{x:.0f}" for x in longest)
                + " ms; longest gap between reported steps: "
                + ", ".join("-" if s["longest_gap_ms"] is None else f"{s['longest_gap_ms']:.0f}" for s in r["stalls"])
                + f" ms; pgmajfault +{sum(s['pgmajfault'] for s in r['stalls'])}, failcnt +"
                f"{sum(s['failcnt'] for s in r['stalls'])}, under_oom {max(s['under_oom'] for s in r['stalls'])}"
            )
    common.save("mem_stall", {"stall_ms": a.stall_ms, "room_mb": a.room_mb, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
