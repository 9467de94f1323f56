"""How a rank ended, recorded by the kernel at its exit (obshub/bpf/sched.c ``obs_note_exit``), read by the
agent's rank watch however soon the parent reaps it.

Each rank here is the child of a real parent process blocked in ``waitpid`` (``Popen.wait()``, as a shell's
``wait`` or a launcher that blocks): the zombie is reaped at once, so its ``/proc/<pid>/stat`` (the only
source before the BPF record) is often gone when the watch reads it (read 2-12 of 20 times, docs/BENCHMARKS.md
12; on c40f77a this test got 2 of its 7 ends). The watch is wired as the agent wires it (``kernel_status`` =
the source's ``exit_status`` where it has one). The cases: SIGTERM, SIGINT, SIGHUP, SIGKILL, SIGTERM to a
process with threads (taken down by the kernel's group kill), ``exit(3)``, SIGTERM trapped then exit code 7;
each payload must be what the parent saw."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from obshub.core.schema import validate_event
from obshub.producer.probes import Target
from obshub.producer.rankstate import EXITED, RankWatch
from tests.support.probes_util import event_source, need_bpf

pytestmark = pytest.mark.bpf

#: the rank: waits for its go file, then does what argv[2] says
RANK = """
import os, signal, sys, threading, time
go, how = sys.argv[1], sys.argv[2]
if how == "trap":  # a rank that traps SIGTERM and exits with a code of its own
    signal.signal(signal.SIGTERM, lambda *_: os._exit(7))
if how == "threads":  # worker threads: the group's other threads are taken down by SIGKILL in the kernel
    for _ in range(4):
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
while not os.path.exists(go):
    time.sleep(0.005)
if how == "exit3":
    sys.exit(3)
time.sleep(60)
"""
#: the parent: starts the rank, says its pid, blocks in waitpid until it ends, says its return code
PARENT = """
import subprocess, sys
p = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2], sys.argv[3]])
print(p.pid, flush=True)
print(p.wait(), flush=True)
"""

CASES = [  # (how, the signal the test sends or None, the payload wanted, the parent's return code)
    ("sleep", signal.SIGTERM, {"signal": 15}, -15),
    ("sleep", signal.SIGINT, {"signal": 2}, -2),
    ("sleep", signal.SIGHUP, {"signal": 1}, -1),
    ("sleep", signal.SIGKILL, {"signal": 9}, -9),
    ("threads", signal.SIGTERM, {"signal": 15}, -15),
    ("exit3", None, {"exit_code": 3}, 3),
    ("trap", signal.SIGTERM, {"exit_code": 7}, 7),
]


def test_each_end_is_known_though_a_parent_blocked_in_waitpid_reaps_it_at_once(tmp_path):
    need_bpf()
    ranks = []
    for i, (how, _sig, _want, _rc) in enumerate(CASES):
        go = tmp_path / f"go{i}"
        parent = subprocess.Popen([sys.executable, "-c", PARENT, RANK, str(go), how], stdout=subprocess.PIPE, text=True)
        ranks.append((parent, int(parent.stdout.readline()), go))
    pids = {pid for _p, pid, _g in ranks}
    try:
        with event_source(tmp_path, Target(pids=set(pids)), probes=("sched",)) as (src, table):
            assert [s.attached for s in table] == [True], table
            watch = RankWatch(interval_ns=0)
            watch.kernel_status = getattr(src, "exit_status", None)  # as obshub/producer/agent.py does
            assert watch.poll(pids) == []  # all running
            got = {}
            for (parent, pid, go), (how, sig, _want, rc) in zip(ranks, CASES, strict=True):
                Path(go).touch()
                if sig is not None:
                    time.sleep(0.3)  # its handler is installed and it waits in sleep()
                    os.kill(pid, sig)
                assert int(parent.stdout.readline()) == rc  # reaped by its parent
                parent.wait(10)
                end = time.monotonic() + 5
                evs = []
                while not evs and time.monotonic() < end:
                    evs = [e for e in watch.poll(pids) if e.pid == pid]
                    time.sleep(0.01)
                (ev,) = evs
                assert ev.value == EXITED
                validate_event(ev)
                got[f"{how}-{sig.name if sig else 'none'}"] = ev.payload
    finally:
        for parent, pid, _go in ranks:
            if parent.poll() is None:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                parent.wait(10)
    want = {f"{how}-{sig.name if sig else 'none'}": {"state": "exited", **w} for how, sig, w, _rc in CASES}
    assert got == want
