"""The demo's simulated cluster: namespaces, bridge, cgroups, processes inside, cleanup on exit, and
cleanup after a crashed run (real namespaces and cgroups; needs root)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from obshub.demo import cluster as cl
from obshub.demo.errors import DemoBusyError

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces, cgroups)"),
    pytest.mark.slow,
]

# the namespaces are machine-wide: wait for a demo someone else runs (e.g. the TTD benchmark) to finish
LOCK_WAIT_S = 500


def assert_clean() -> None:
    """Nothing of a demo is left, unless another live process (a demo someone else runs on this machine)
    took the lock since: it uses the same names."""
    left, holder = cl.leftovers(), cl.last_lock_holder()
    assert left == {"netns": [], "links": [], "cgroups": []} or (
        holder not in (None, os.getpid()) and os.path.exists(f"/proc/{holder}")
    ), left


def _netns_exec(ns: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, timeout=30)


def test_create_spawn_destroy():
    with cl.Cluster(2, lock_wait_s=LOCK_WAIT_S) as c:
        h0, h1 = c.hosts
        assert {h0.netns, h1.netns} <= set(cl.leftovers()["netns"])
        addr = _netns_exec(h1.netns, "ip", "-4", "-o", "addr", "show", "dev", "eth0").stdout
        assert "10.77.0.11/24" in addr
        # a TCP connection from host 1 to host 0 over the bridge
        srv = c.spawn(
            h0,
            [
                sys.executable,
                "-c",
                textwrap.dedent("""
            import socket
            s = socket.socket(); s.bind(("10.77.0.10", 24999)); s.listen(1)
            conn, peer = s.accept(); conn.sendall(peer[0].encode()); conn.close()
        """),
            ],
            stdout=subprocess.PIPE,
        )
        time.sleep(0.5)
        cli = _netns_exec(
            h1.netns,
            sys.executable,
            "-c",
            "import socket; s = socket.create_connection(('10.77.0.10', 24999), 5); print(s.recv(100).decode())",
        )
        assert cli.stdout.strip() == "10.77.0.11", cli.stderr
        srv.wait(10)
        # the spawned process sits in the host's cgroups (v1 cpu, memory and v2)
        sleeper = c.spawn(h1, ["sleep", "60"])
        time.sleep(0.3)
        groups = Path(f"/proc/{sleeper.pid}/cgroup").read_text()
        for c_name in cl.controllers():
            assert sleeper.pid in cl.cgroup_pids(h1.cgroup(c_name)), c_name
        assert "/obshub-demo/h1" in groups
        assert sleeper.pid in c.pids()
    # everything is gone, including the process
    assert_clean()
    assert sleeper.poll() is not None or not Path(f"/proc/{sleeper.pid}").exists()


CRASHER = """
import sys, time
from obshub.demo.cluster import Cluster
c = Cluster(2)
c.lock(500); c.create()
p = c.spawn(1, ["sleep", "300"])
print(p.pid, flush=True)
time.sleep(300)
"""


def test_crashed_run_is_cleaned_up_by_the_next():
    crash = subprocess.Popen([sys.executable, "-c", CRASHER], stdout=subprocess.PIPE, text=True)
    try:
        sleeper = int(crash.stdout.readline())
        assert cl.leftovers()["netns"] == ["obshub-h0", "obshub-h1"] or set(cl.leftovers()["netns"]) == {
            "obshub-h0",
            "obshub-h1",
        }
        # while the crashing run holds the lock, a second one must refuse rather than sweep it
        with pytest.raises(DemoBusyError):
            cl.Cluster(2).lock()
    finally:
        crash.send_signal(signal.SIGKILL)
        crash.wait(10)
    # the crashed run left namespaces, links, cgroups and its process behind
    left = cl.leftovers()
    assert left["netns"] and left["links"] and left["cgroups"]
    assert Path(f"/proc/{sleeper}").exists()
    # the next run (here: `obshub demo --cleanup`) removes all of it
    out = subprocess.run(
        [sys.executable, "-m", "obshub.cli", "demo", "--cleanup", "--lock-wait", str(LOCK_WAIT_S)],
        capture_output=True,
        text=True,
        timeout=LOCK_WAIT_S + 60,
    )
    assert out.returncode == 0, out.stderr
    assert_clean()
    deadline = time.monotonic() + 5
    while Path(f"/proc/{sleeper}").exists() and cl._is_zombie(sleeper) is False and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{sleeper}").exists() or cl._is_zombie(sleeper)


def test_name_sweep_without_state_file(tmp_path):
    """A namespace named like the demo's with no state file (e.g. the file was lost) is still removed,
    and someone else's obshub-t-* namespace is left alone."""
    holder = cl.Cluster(2)
    holder.lock(LOCK_WAIT_S)  # never sweep under a running demo
    other = f"obshub-t-{os.getpid()}"
    try:
        subprocess.run(["ip", "netns", "add", "obshub-h7"], check=True)
        subprocess.run(
            ["ip", "link", "add", "obshub-v7", "type", "veth", "peer", "name", "eth0", "netns", "obshub-h7"], check=True
        )
        subprocess.run(["ip", "netns", "add", other], check=True)
        removed = cl.sweep(tmp_path)
        assert "netns obshub-h7" in removed
        assert cl.leftovers()["netns"] == [] and cl.leftovers()["links"] == []
        assert other in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    finally:
        subprocess.run(["ip", "netns", "del", other], capture_output=True)
        holder.unlock()
