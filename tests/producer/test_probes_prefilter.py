"""The bitmap pre-filters of the machine-wide tracepoints (obshub/bpf/common.h ``wbits``):
a thread that a watched process starts after the agent did is seen by the scheduler programs from its
first switch-out (its process's bit lets it through, obs_current_watched adds it), a process that is not
watched leaves no event, and a thread that ends is forgotten (its bit and its wtids entry), also after its
last switch-out, which comes after sched_process_exit."""

from __future__ import annotations

import ctypes
from collections import Counter

import pytest

from obshub.core.schema import Kind
from obshub.producer.probes import Target
from tests.support.probes_util import Child, drain, event_source, need_bpf

pytestmark = pytest.mark.bpf

# after go: a new thread sleeps 5 ms forty times (each sleep is a switch-out and a wake-up); prints its tid
THREADED = """
import sys, threading, time
sys.stdin.readline()
tid = []
def work():
    tid.append(threading.get_native_id())
    for _ in range(40):
        time.sleep(0.005)
t = threading.Thread(target=work)
t.start()
t.join()
print(tid[0], flush=True)
"""


def _bit(src, field: str, n: int) -> int:
    return getattr(src._bpf[b"wbits"][ctypes.c_int(n >> 6)], field) >> (n & 63) & 1


def test_new_thread_of_a_watched_process_passes_the_prefilter_and_others_do_not(tmp_path):
    need_bpf()
    child = Child(THREADED)
    other = Child(THREADED)  # the same program, not watched
    try:
        with event_source(
            tmp_path, Target(pids={child.pid}), probes=("sched",), thresholds={"offcpu_ns": 1_000_000}
        ) as (src, table):
            assert table[0].attached
            assert _bit(src, "tgid", child.pid) == 1  # the loader set the watched process's bit
            assert _bit(src, "tgid", other.pid) == 0
            child.go()
            other.go()
            tid = int(child.wait().split()[0])
            other_tid = int(other.wait().split()[0])
            events = drain(src, 0.3)
            # the thread ended before its process: its bit and its entry are gone, so a later thread with
            # its number (in any process) is not taken for a watched one
            assert _bit(src, "tid", tid) == 0
            with pytest.raises(KeyError):
                src._bpf[b"wtids"][ctypes.c_uint32(tid)]
    finally:
        child.kill()
        other.kill()
    offcpu = Counter(e.tid for e in events if e.kind == Kind.SCHED_OFFCPU)
    assert offcpu[tid] >= 20, offcpu  # its 5 ms sleeps, seen although the thread started after the agent
    assert other_tid not in offcpu and not any(e.pid == other.pid for e in events)
