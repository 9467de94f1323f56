"""A long-running obshub command whose main thread is blocked (a stand-in for a Kafka client call that
does not return while the cluster is gone), started in a subprocess of its own session, and the checks of
its forced stop (obshub/core/stopping.py): shared by tests/rules/test_rules_stop.py,
tests/streams/test_streams_stop.py and tests/producer/test_agent_stop.py; and ``stop_group``, the end of
a service a test started in a session of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.apps.test_no_broker import closed_port

REPO = Path(__file__).resolve().parents[2]


def stop_group(proc: subprocess.Popen) -> None:
    """End a test's service started with ``start_new_session=True`` if it still runs: SIGTERM to its
    process group, SIGKILL after 30 s (then reaped)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def start_blocked(tmp_path: Path, script: str, args: list[str], record: str) -> tuple[subprocess.Popen, Path, Path]:
    """Run ``python -c script *args`` with its own OBSHUB_HOME and a port nobody listens on, stdout and
    stderr to one file; returns (process, home, that file) once the component record matching the glob
    ``record`` exists (the command is past its signal set-up) and half a second more (into the blocked
    call). Fails the test if the process ends or does not register within 60 s."""
    home = tmp_path / "home"
    env = {**os.environ, "OBSHUB_HOME": str(home), "OBSHUB_KAFKA_PORT": str(closed_port()), "PYTHONUNBUFFERED": "1"}
    env.pop("OBSHUB_BOOTSTRAP", None)
    out = tmp_path / "output.txt"
    with open(out, "wb") as f:
        p = subprocess.Popen(
            [sys.executable, "-c", script, *args],
            cwd=REPO,
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while not list(home.glob(f"**/{record}")):
        assert p.poll() is None, out.read_text()[-3000:]
        assert time.monotonic() < deadline, f"{record} was not registered within 60 s"
        time.sleep(0.1)
    time.sleep(0.5)
    return p, home, out


def ended(p: subprocess.Popen, within_s: float, out: Path) -> float:
    """Seconds until ``p`` ended; fails the test (and kills its session) if it runs past ``within_s``."""
    t = time.monotonic()
    try:
        p.wait(within_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        pytest.fail(f"still running {within_s} s after the signal:\n{out.read_text()[-3000:]}")
    return time.monotonic() - t


def assert_forced(p: subprocess.Popen, home: Path, out: Path, record: str, why: str, within_s: float = 30) -> float:
    """``p`` ends within ``within_s`` with exit 1, its output says ``why`` and shows every thread's stack
    (faulthandler's, the blocked main thread's lambda among them), and its component record is gone.
    Returns the seconds it took."""
    took = ended(p, within_s, out)
    text = out.read_text()
    assert p.returncode == 1, text[-3000:]
    assert f"{why}: exiting now (exit 1)" in text, text[-3000:]
    assert "Current thread" in text or "Thread 0x" in text, text[-3000:]
    assert "<lambda>" in text or "time.sleep" in text, text[-3000:]
    assert not list(home.glob(f"**/{record}")), "the component record outlived the forced exit"
    return took


def check_forced_after_the_stop_timeout(tmp_path: Path, script: str, args: list[str], record: str, name: str) -> str:
    """The command ``name`` (``rules serve``), blocked, started with ``--stop-timeout 2`` and sent SIGTERM,
    is forced out after its 2 s and not before (:func:`assert_forced`); returns its output."""
    p, home, out = start_blocked(tmp_path, script, [*args, "--stop-timeout", "2"], record)
    os.killpg(p.pid, signal.SIGTERM)
    took = assert_forced(p, home, out, record, f"{name}: the stop did not finish within 2 s of SIGTERM")
    assert took >= 1.5, f"forced after {took:.1f} s, before its 2 s"
    return out.read_text()
