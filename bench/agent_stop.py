"""How long an agent's event source takes to stop (``BpfEventSource.close()``: detach every probe and free
the BPF program), this tree beside another (``--base``), and that nothing stays attached.

    sudo python -m bench.agent_stop --base /work/wt/base --rounds 3

Each round starts, in a fresh process of each tree (alternating), the default probe set (what the demo's
agents attach, no sysfs poller; no training runs), reads it for 1 s, then times ``close()``. For this
tree it also waits for the detach child (obshub/producer/detach.py) and checks that afterwards no process
of the round holds a perf event or BPF fd and ``uprobe_events``/``kprobe_events`` list none of its probes.
Needs root and bcc; heavy (a BPF compile per round): run it under the machine's heavy lock."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench import common

CHILD = r"""
import json, os, sys, time
from obshub.core.settings import load_settings
from obshub.producer.loader import BpfEventSource
from obshub.producer.probes import ProbeOptions, Target

src = BpfEventSource(load_settings(), Target(), ProbeOptions(sysfs=False))
st = src.start()
b = src._bpf
n = {"uprobes": len(b.uprobe_fds), "tracepoints": len(b.tracepoint_fds),
     "kprobes": sum(len(v) for v in b.kprobe_fds.values()), "raw": len(b.raw_tracepoint_fds)}
t = time.monotonic() + 1.0
while time.monotonic() < t:
    src.poll(50)
t0 = time.monotonic()
src.close()
close_s = time.monotonic() - t0
out = {"close_s": close_s, "probes": n, "attached": sum(s.attached for s in st)}
pid = getattr(src, "detach_pid", None)
if pid is not None:
    from obshub.producer import detach
    out["detach_child_done"] = detach.wait(pid, 60)
    out["detached_s"] = time.monotonic() - t0
def held(p):
    kinds = []
    try:
        for fd in os.listdir(f"/proc/{p}/fd"):
            try:
                link = os.readlink(f"/proc/{p}/fd/{fd}")
            except OSError:
                continue
            if link in ("anon_inode:[perf_event]", "anon_inode:bpf-prog", "anon_inode:bpf_link"):
                kinds.append(link)
    except OSError:
        pass
    return kinds
out["held_here"] = held(os.getpid())
out["child_alive"] = pid is not None and os.path.exists(f"/proc/{pid}")
listed = b""
for f in ("uprobe_events", "kprobe_events"):
    try:
        listed += open(f"/sys/kernel/tracing/{f}", "rb").read()
    except OSError:
        pass
out["tracefs_ours"] = listed.count(b"_bcc_%d" % os.getpid())
print("RESULT " + json.dumps(out), flush=True)
"""


def one(tree: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    p = subprocess.run([sys.executable, "-c", CHILD], cwd=tree, env=env, capture_output=True, text=True, timeout=600)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"no result from {tree} (exit {p.returncode}): {p.stderr[-2000:]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.agent_stop", description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=Path, help="another worktree to time beside this one")
    ap.add_argument("--rounds", type=common.positive_int, default=3)
    a = ap.parse_args(argv)
    here = Path(__file__).resolve().parent.parent
    trees = {"branch": here, **({"base": a.base.resolve()} if a.base else {})}
    res: dict[str, list[dict]] = {k: [] for k in trees}
    ok = True
    for r in range(a.rounds):
        for name in list(trees)[:: 1 if r % 2 == 0 else -1]:
            got = one(trees[name])
            res[name].append(got)
            print(f"round {r + 1} {name}: {json.dumps(got)}", flush=True)
            if name == "branch":
                ok &= got.get("detach_child_done", True) and not got["held_here"] and not got["tracefs_ours"]
    print(f"\n{'tree':<8} {'probes':<40} {'close() s: median (min-max)':<30} detached s (child)")
    for name, rows in res.items():
        c = [x["close_s"] for x in rows]
        d = [x["detached_s"] for x in rows if "detached_s" in x]
        det = f"{statistics.median(d):.2f} ({min(d):.2f}-{max(d):.2f})" if d else "-"
        print(
            f"{name:<8} {json.dumps(rows[0]['probes']):<40} "
            f"{statistics.median(c):.3f} ({min(c):.3f}-{max(c):.3f}){'':<8} {det}"
        )
    print("nothing left attached after the detach child: " + ("yes" if ok else "NO"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
