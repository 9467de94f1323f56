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
