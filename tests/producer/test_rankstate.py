"""The agent's rank liveness reads a real process's state: stopped by SIGSTOP, frozen by the cgroup v2
freezer (its state letter stays S, only cgroup.events tells), running again, and gone; one RANK_STATE
event per change and nothing for a process that keeps running."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from obshub.core.schema import Kind, validate_event
from obshub.producer.rankstate import EXITED, FROZEN, RUNNING, STOPPED, RankWatch, cgroup_mounts


def _wait_for(watch: RankWatch, pid: int, state: int, timeout_s: float = 5.0) -> int:
    end = time.monotonic() + timeout_s
    got = watch.state(pid)
    while got != state and time.monotonic() < end:
        time.sleep(0.02)
        got = watch.state(pid)
    return got


def _states(events) -> list[tuple[int, int, str]]:
    return [(e.pid, e.value, e.payload["state"]) for e in events]


def test_stopped_running_and_exited_each_send_one_event():
    child = subprocess.Popen(["sleep", "60"])
    watch = RankWatch(interval_ns=0)
    try:
        assert watch.poll([child.pid]) == []  # running at first sight: nothing to say
        os.kill(child.pid, signal.SIGSTOP)
        assert _wait_for(watch, child.pid, STOPPED) == STOPPED
        ev = watch.poll([child.pid])
        assert _states(ev) == [(child.pid, STOPPED, "stopped")]
        assert ev[0].kind == Kind.RANK_STATE and ev[0].step == -1
        validate_event(ev[0])
        assert watch.poll([child.pid]) == []  # no change, no event
        os.kill(child.pid, signal.SIGCONT)
        assert _wait_for(watch, child.pid, RUNNING) == RUNNING
        assert _states(watch.poll([child.pid])) == [(child.pid, RUNNING, "running")]
        child.kill()
        child.wait()
        assert _states(watch.poll([child.pid])) == [(child.pid, EXITED, "exited")]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_an_exit_carries_when_the_process_ended_not_when_it_was_read():
    child = subprocess.Popen(["sleep", "60"])
    watch = RankWatch(interval_ns=0)
    assert watch.poll([child.pid]) == []
    child.kill()
    killed = time.monotonic_ns()
    child.wait()
    time.sleep(0.3)
    (ev,) = watch.poll([child.pid])
    # the signal is there when the watch read the zombie before this test reaped it (a race here)
    assert ev.value == EXITED and ev.payload in ({"state": "exited"}, {"state": "exited", "signal": 9})
    assert abs(ev.ts_ns - killed) < 100_000_000, (ev.ts_ns - killed) / 1e6
    assert watch.poll([]) == [] and watch.exits.exited(child.pid) is None  # forgotten


@pytest.mark.parametrize(
    ("how", "want"),
    [
        (signal.SIGINT, {"signal": 2}),
        (signal.SIGTERM, {"signal": 15}),
        (signal.SIGKILL, {"signal": 9}),
        (None, {"exit_code": 3}),
    ],
    ids=["sigint", "sigterm", "sigkill", "exit3"],
)
def test_an_exit_carries_the_signal_or_exit_code_that_ended_the_process(how, want):
    """A cancelled job's ranks end by SIGINT or SIGTERM, a killed one by SIGKILL: the exit says which,
    read from the zombie's stat before its parent reaps it (torchrun polls its workers; here the test
    reaps only after the read)."""
    code = "import time; time.sleep(60)" if how is not None else "import sys, time; time.sleep(0.3); sys.exit(3)"
    child = subprocess.Popen(["python3", "-c", code])
    watch = RankWatch(interval_ns=0)
    try:
        assert watch.poll([child.pid]) == []
        if how is not None:
            time.sleep(0.2)
            os.kill(child.pid, how)
        assert _wait_for(watch, child.pid, EXITED) == EXITED
        (ev,) = watch.poll([child.pid])
        assert ev.value == EXITED and ev.payload == {"state": "exited", **want}
        validate_event(ev)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()


def test_the_interval_bounds_how_often_it_reads():
    watch = RankWatch(interval_ns=10**12)
    assert watch.poll([os.getpid()], now_ns=1) == []
    missing = 2**22 + 12345  # above the default pid_max: no such process
    assert watch.poll([missing], now_ns=2) == []  # read again only an interval later
    assert _states(watch.poll([missing], now_ns=2 + 10**12)) == [(missing, EXITED, "exited")]


def test_mountinfo_gives_the_v2_and_v1_freezer_mounts():
    text = (
        "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
        "37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer\n"
        "38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
    )
    assert cgroup_mounts(text) == ("/sys/fs/cgroup/unified", "/sys/fs/cgroup/freezer")
    assert cgroup_mounts("") == (None, None)


def _v2_cgroup() -> Path | None:
    v2, _ = cgroup_mounts()
    if v2 is None or os.geteuid() != 0:
        return None
    cg = Path(v2) / f"obshub-test-{uuid.uuid4().hex[:8]}"
    try:
        cg.mkdir()
    except OSError:
        return None
    if not (cg / "cgroup.freeze").exists():
        cg.rmdir()
        return None
    return cg


@pytest.mark.parametrize("mounts", [None, (None, None)], ids=["cgroupfs", "wchan"])
def test_a_process_frozen_by_the_cgroup_v2_freezer_reads_frozen_then_running_after_the_thaw(mounts):
    """With the cgroup filesystem (cgroup.events) and without it (an agent in another mount namespace:
    the task's wchan in the freezer's trap)."""
    cg = _v2_cgroup()
    if cg is None:
        pytest.skip("needs root and a writable cgroup v2 hierarchy with cgroup.freeze")
    child = subprocess.Popen(["sleep", "60"])
    try:
        (cg / "cgroup.procs").write_text(str(child.pid))
        watch = RankWatch(interval_ns=0, mounts=mounts)
        assert watch.poll([child.pid]) == []
        (cg / "cgroup.freeze").write_text("1")
        assert _wait_for(watch, child.pid, FROZEN) == FROZEN
        stat = Path(f"/proc/{child.pid}/stat").read_text()
        assert stat.rpartition(")")[2].split()[0] not in ("T", "t")  # the state letter does not tell
        assert _states(watch.poll([child.pid])) == [(child.pid, FROZEN, "frozen")]
        (cg / "cgroup.freeze").write_text("0")
        assert _wait_for(watch, child.pid, RUNNING) == RUNNING
        assert _states(watch.poll([child.pid])) == [(child.pid, RUNNING, "running")]
    finally:
        if (cg / "cgroup.freeze").exists():
            (cg / "cgroup.freeze").write_text("0")
        child.kill()
        child.wait()
        for _ in range(50):
            try:
                cg.rmdir()
                break
            except OSError:
                time.sleep(0.05)


def test_the_kernels_record_of_the_end_wins_unless_it_is_older_than_the_pid():
    """``kernel_status`` (the BPF source's ``exit_status`` in the agent) wins over the zombie's stat; a
    record written before the pid was first read is a former process with the same pid number: ignored."""
    for age_ns, want in ((-(10**9), ({"state": "exited"}, {"state": "exited", "signal": 9})), (10**6, None)):
        child = subprocess.Popen(["sleep", "60"])
        watch = RankWatch(interval_ns=0)
        assert watch.poll([child.pid]) == []
        first = time.monotonic_ns()
        watch.kernel_status = {child.pid: (first + age_ns, 15)}.get  # as if the kernel saw SIGTERM
        child.kill()  # SIGKILL really ends it: /proc says 9
        time.sleep(0.2)
        (ev,) = watch.poll([child.pid])
        child.wait()
        if want is None:  # the kernel's record (after the first read) wins over the zombie's stat
            assert ev.payload == {"state": "exited", "signal": 15}
        else:  # the old record is not this process's: the stat (or nothing, when reaped first)
            assert ev.payload in want
