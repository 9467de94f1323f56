"""``BpfEventSource.close()`` hands the kernel's detach of its probes (~0.1 s each: 5.3 s for the default
set's 34 uprobes and 16 tracepoints here) to a child process (obshub/producer/detach.py): the agent's own
stop no longer waits for it (every demo agent was SIGKILLed after its 5 s grace, its last line and
component record lost), and nothing stays attached once the child ended. Real BPF (root, bcc), the
default probe set. Fails on c40f77a: close() detached in-process, no child holds the probes. The times
are bench/agent_stop.py's."""

from __future__ import annotations

import os

import pytest

from obshub.producer.probes import Target
from tests.support.probes_util import event_source, need_bpf

pytestmark = pytest.mark.bpf

PROBE_FDS = ("anon_inode:[perf_event]", "anon_inode:bpf_link")


def held(pid: int) -> list[str]:
    """The probe fds (perf events, BPF links) process ``pid`` holds ([] when it is gone)."""
    out = []
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in names:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link in PROBE_FDS:
            out.append(link)
    return out


def children(pid: int) -> list[int]:
    """The live child processes of ``pid``."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = open(f"/proc/{name}/stat").read()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(name))
    return out


def test_close_leaves_the_kernels_detach_to_a_child_that_detaches_every_probe(tmp_path):
    need_bpf()
    before = len(held(os.getpid()))
    with event_source(tmp_path, Target()) as (src, statuses):
        assert any(s.attached for s in statuses)
        attached = len(held(os.getpid())) - before
        assert attached >= 10, attached  # the default set: uprobes and tracepoints, one perf event each
    # ~0.1 s a probe in the kernel: the child has just begun (an earlier test's may still be at work)
    kids = [p for p in children(os.getpid()) if held(p)]
    assert kids, "close() returned with no child holding the probes (it detached them itself, ~0.1 s each)"
    pid = src.detach_pid  # closed by event_source
    assert pid in kids
    assert len(held(os.getpid())) == before, "this process holds none of the probes after close()"
    assert len(held(pid)) <= attached  # the child holds what it has not detached yet
    from obshub.producer import detach

    assert detach.wait(pid, 60), "the detach child ends by itself"
    assert not os.path.exists(f"/proc/{pid}") or held(pid) == []
    listed = b""
    for f in ("uprobe_events", "kprobe_events"):
        try:
            listed += (detach.TRACEFS / f).read_bytes()
        except OSError:
            pass
    assert b"_bcc_%d" % os.getpid() not in listed and b"_bcc_%d" % pid not in listed
    src.close()  # idempotent
