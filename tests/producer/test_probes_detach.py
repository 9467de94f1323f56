"""``BpfEventSource.close()`` hands the kernel's detach of its probes (~0.1 s each, serial under the
kernel's event_mutex: 4.1 s for the demo's 21 uprobes and 16 tracepoints) to a child process
(obshub/producer/detach.py): the agent's own stop no longer waits for it (it was SIGKILLed after the
demo's 5 s grace, its last line and component record lost), and nothing stays attached once the child
ended. Real BPF (root, bcc), the default probe set as the demo's agents attach it. The times are
bench/agent_stop.py's."""

from __future__ import annotations

import os

import pytest

from obshub.producer import detach
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


def test_close_leaves_the_kernels_detach_to_a_child_that_detaches_every_probe(tmp_path):
    need_bpf()
    before = len(held(os.getpid()))
    with event_source(tmp_path, Target()) as (src, statuses):
        assert any(s.attached for s in statuses)
        attached = len(held(os.getpid())) - before
        assert attached >= 10, attached  # the default set: uprobes and tracepoints, one perf event each
    pid = src.detach_pid  # closed by event_source
    assert pid is not None and pid != os.getpid()
    assert len(held(os.getpid())) == before, "this process holds none of the probes after close()"
    assert len(held(pid)) <= attached  # the child holds what it has not detached yet
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
