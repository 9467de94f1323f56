"""The component registry: a second instance of a component beside a running one gets its own record."""

import os
import subprocess

from obshub.core import registry
from obshub.core.settings import load_settings


def test_a_second_instance_gets_its_own_record_and_a_stale_one_is_reused(tmp_path):
    settings = load_settings(home=tmp_path)
    assert registry.free_name(settings, "rules") == "rules"
    registry.register_component(settings, "rules", os.getpid())
    second = registry.free_name(settings, "rules")
    assert second == "rules-2"
    registry.register_component(settings, second, os.getpid())
    assert registry.free_name(settings, "rules") == "rules-3"
    assert {c["name"] for c in registry.components(settings)} == {"rules", "rules-2"}
    registry.unregister_component(settings, "rules-2")
    assert [c["name"] for c in registry.components(settings)] == ["rules"], "a stop removes only its own record"
    dead = subprocess.Popen(["true"])
    dead.wait()
    registry.register_component(settings, "rules", dead.pid)
    assert registry.free_name(settings, "rules") == "rules", "a record whose pid is gone is free"


def test_a_process_whose_main_thread_ended_is_alive_while_its_threads_run():
    """``obshub down`` said a worker had stopped while its threads were still shutting down: the leader of a
    thread group whose main thread ended reads as a zombie in /proc/PID/stat."""
    import sys
    import time

    code = (
        "import ctypes, threading, time\n"
        "threading.Thread(target=time.sleep, args=(1.5,)).start()\n"
        "print('up', flush=True)\n"
        "ctypes.CDLL(None).pthread_exit(None)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "up"
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:  # the main thread is gone once the leader reads as a zombie
            with open(f"/proc/{proc.pid}/stat") as f:
                if f.read().split(") ", 1)[1][0] == "Z":
                    break
            time.sleep(0.01)
        else:
            raise AssertionError("the main thread did not end")
        assert registry.pid_alive(proc.pid), "its sleeping thread still runs"
        proc.wait(timeout=5)
        assert not registry.pid_alive(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def test_the_records_of_killed_components_go_and_those_of_live_ones_stay(tmp_path):
    """A finished `obshub demo` left its agents listed by `obshub status` as stale: it SIGKILLs a part still
    stopping after its grace, which never removes its own record. forget_exited removes the records of the
    pids it stopped that are gone, and only those."""
    import signal
    import sys

    settings = load_settings(home=tmp_path)
    code = (
        "import os, sys, time\n"
        "from obshub.core import registry\n"
        "from obshub.core.settings import load_settings\n"
        "registry.register_component(load_settings(home=sys.argv[1]), sys.argv[2], os.getpid())\n"
        "print('registered', flush=True)\n"
        "time.sleep(60)\n"
    )
    procs = {}
    try:
        for name in ("agent-node-00", "agent-node-01"):
            procs[name] = subprocess.Popen(
                [sys.executable, "-c", code, str(tmp_path), name], stdout=subprocess.PIPE, text=True
            )
            assert procs[name].stdout.readline().strip() == "registered"
        other = subprocess.Popen(["true"])
        other.wait()
        registry.register_component(settings, "rules", other.pid)  # gone, but not one of the demo's
        procs["agent-node-00"].send_signal(signal.SIGKILL)
        procs["agent-node-00"].wait()
        pids = [p.pid for p in procs.values()]
        assert registry.forget_exited(settings, pids) == ["agent-node-00"]
        assert {c["name"]: c["running"] for c in registry.components(settings)} == {
            "agent-node-01": True,
            "rules": False,
        }
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
